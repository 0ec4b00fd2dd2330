"""The benchmark harness runs end to end in its tiny CPU mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemsops.cli import main


def test_bench_tiny_mode_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gemsops bench --tiny` times torch and gemsops per case and writes JSON rows."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--no-host", "--ops", "add,softmax", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "geometric mean vs torch" in printed
    result = json.loads(out.read_text())
    assert [r["op"] for r in result["rows"]] == ["add", "softmax"]
    for row in result["rows"]:
        assert row["torch_ms"] > 0 and row["gemsops_ms"] > 0
        assert row["vs_torch"] == pytest.approx(row["torch_ms"] / row["gemsops_ms"])
    assert result["copy_gbs"] > 0


def test_bench_rejects_unknown_ops() -> None:
    """An unknown --ops name stops the run with a message listing the known ops."""
    with pytest.raises(SystemExit, match="known"):
        main(["bench", "--ops", "nonsense"])


def test_bench_table_renders_again_from_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--from-json` prints the same table from a saved run, without timing anything."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--no-host", "--ops", "sum", "--json", str(out)]) == 0
    first = capsys.readouterr().out
    assert main(["bench", "--from-json", str(out)]) == 0
    again = capsys.readouterr().out
    table = first[first.index("copy bandwidth") :]
    assert table.strip() and table in again


def test_kernel_profile_names_each_side_and_its_busiest_ops(tmp_path: Path) -> None:
    """`--profile-kernels` writes, per case and side, the profiler's table of what ran."""
    out = tmp_path / "kernels.txt"
    args = ["bench", "--tiny", "--no-host", "--ops", "sum", "--profile-kernels", str(out)]
    assert main(args) == 0
    text = out.read_text()
    for side in ("torch", "gemsops"):
        assert f"== sum 4x64 (float32): {side}," in text
    assert text.count("aten::sum") >= 2  # torch's call, and the aten call gemsops served
