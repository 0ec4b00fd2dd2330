"""`gemsops selftest`: outcomes per op and dtype, the JSON rows and the exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gemsops import registry
from gemsops.cli import main
from gemsops.errors import Unsupported

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _selftest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ops: str, dtype: str, examples: int
) -> tuple[int, str, Path]:
    """Run `gemsops selftest` with --json; return its exit code, output and JSON path."""
    out_json = tmp_path / "rows.json"
    code = main(
        ["selftest", "--ops", ops, "--dtypes", dtype, "--examples", str(examples),
         "--json", str(out_json)]
    )  # fmt: skip
    return code, capsys.readouterr().out, out_json


def _rows(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = json.loads(path.read_text())
    return {(row["op"], row["dtype"]): row for row in result["rows"]}


def test_passing_ops_are_reported_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ops that match torch print a passed row per dtype, a summary, and exit 0."""
    code, out, out_json = _selftest(tmp_path, capsys, "neg,sum", "float32", 3)
    assert code == 0
    assert "neg            float32   passed" in out
    assert "sum            float32   passed" in out
    assert "2 passed, 0 failed, 0 handed back, 0 not implemented" in out
    result = json.loads(out_json.read_text())
    assert result["summary"] == {
        "passed": 2, "failed": 0, "handed back": 0, "not implemented": 0
    }  # fmt: skip
    assert result["examples"] == 3
    assert result["device"]["vendor"]
    rows = _rows(out_json)
    assert set(rows) == {("neg", "float32"), ("sum", "float32")}
    assert rows["neg", "float32"]["outcome"] == "passed"
    assert rows["neg", "float32"]["examples"] >= 1


def test_wrong_values_are_failed_with_the_smallest_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An implementation returning wrong values is failed, with an example, and exits 1."""

    def off_by_one(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.neg.default(x) + 1

    monkeypatch.setitem(registry.implementations(), "neg.default", off_by_one)
    code, out, out_json = _selftest(tmp_path, capsys, "neg", "float32", 3)
    assert code == 1
    assert "neg            float32   failed" in out
    assert "smallest example: tensor(" in out
    row = _rows(out_json)["neg", "float32"]
    assert row["outcome"] == "failed"
    assert row["example"].startswith("tensor(")
    assert "float32" in row["example"]
    assert "not close" in row["detail"]


def test_handed_back_ops_are_reported_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An op gemsops hands back to torch on every call is reported so, with the reason."""

    def refuse(x: torch.Tensor) -> torch.Tensor:
        raise Unsupported("not on this test vendor")

    monkeypatch.setitem(registry.implementations(), "neg.default", refuse)
    code, out, out_json = _selftest(tmp_path, capsys, "neg", "float16", 2)
    assert code == 0
    assert "handed back" in out and "not on this test vendor" in out
    row = _rows(out_json)["neg", "float16"]
    assert row["outcome"] == "handed back"
    assert row["detail"] == "not on this test vendor"


def test_ops_the_vendor_leaves_to_torch_are_not_implemented(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An op in the vendor's unused list is reported not implemented, without running it."""
    monkeypatch.setattr(registry, "_vendor_unused", lambda: frozenset({"exp"}))
    code = main(["selftest", "--ops", "exp", "--dtypes", "float32", "--examples", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "exp            float32   not implemented" in out
    assert "left to torch on this vendor" in out


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [("--ops", "add,nope", "'nope'"), ("--dtypes", "float8", "'float8'")],
)
def test_unknown_ops_and_dtypes_exit_with_one_line(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown --ops or --dtypes value exits 1 with one line naming it and the valid ones."""
    with pytest.raises(SystemExit) as exc:
        main(["selftest", flag, value])
    message = str(exc.value.code)
    assert message.startswith("gemsops selftest: unknown")
    assert named in message and "known:" in message
    assert "\n" not in message
    assert "float32" in message or "softmax" in message
    assert capsys.readouterr().out == ""


def test_every_case_passes_here_and_is_served() -> None:
    """Every op the conformance command checks passes on this device in float32 and is
    served by gemsops (a case whose op gemsops stopped serving, or whose inputs torch
    refuses, would show as not implemented or failed here first)."""
    from gemsops import selftest

    rows = selftest.run(selftest.CASES, [torch.float32], examples=2)
    assert len(rows) == len(selftest.CASES)
    bad = [(r.op, r.outcome, r.detail) for r in rows if r.outcome != "passed"]
    assert bad == []
    assert len({case.op for case in selftest.CASES}) == len(selftest.CASES)
