"""`gemsops tune` and `gemsops bench --host` on the CPU, and the stubbed launch they rely on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_kernels import FakeJit
from strategies_tune import fresh_tune

import gemshal
from gemshal import tune
from gemshal.errors import ConfigError
from gemshal.kernel import decorator, kernel, launcher, stub_launches
from gemshal.tune_format import TuneSource, loads
from gemsops import registry
from gemsops.cli import main


def test_tune_writes_a_file_whose_rows_the_kernels_then_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemsops tune` runs the model case once and writes a tuning file (on the interpreter:
    the entry's first config per bucket, since nothing can be benchmarked there); given as
    GEMS_TUNE_CONFIG, the file loads as the user's file and the same workload meets every
    bucket the run tuned again. Rows for buckets the run did not meet are the shipped
    table's own (on the CPU there are none)."""
    monkeypatch.delenv("GEMS_TUNE_CONFIG", raising=False)
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")  # tune sets "all" for its run; restored below
    out = tmp_path / "tuned.toml"

    def bucket(op_name: str, when: Any) -> tuple[str, str]:
        return op_name, str(sorted(dict(when).items()))

    try:
        assert main(["tune", "--out", str(out)]) == 0
        # the buckets the run benchmarked (on the interpreter: every bucket, pinned)
        tuned = {bucket(c["op"], c["when"]) for c in decorator.choices()
                 if c["how"] == "benchmark" or gemshal.current_device().interpreter}
    finally:
        os.environ["GEMS_AUTOTUNE"] = "0"  # monkeypatch restores the original at teardown
        tune.clear_cache()
    printed = capsys.readouterr().out
    assert f"-> {out}" in printed
    parsed = loads(out.read_text(), TuneSource(out, "user", "test"))
    ops = set(parsed.ops)
    assert {"rms_norm", "softmax_rows", "cross_entropy"} <= ops
    assert ops & {"mm", "mm_persistent"}  # Hopper's products take the persistent kernel
    interpreted = gemshal.current_device().interpreter
    # kernels without a key (the optimizers') have one bucket: their choice leads the
    # configs, and their entry has no table
    keyless = {op_name for op_name, when in tuned if when == "[]"}
    tuned -= {(op_name, "[]") for op_name in keyless}
    assert keyless <= ops
    for op_name, entry in parsed.ops.items():
        assert entry.table or op_name in keyless, op_name
        first = tune.lookup(op_name).configs[0]
        if interpreted:  # nothing is benchmarked there: each bucket keeps the first config
            assert all(row.config.meta == first.meta for row in entry.table), op_name
    monkeypatch.setenv("GEMS_TUNE_CONFIG", str(out))
    tune.clear_cache()
    try:
        from gemsops import bench_model

        assert tune.lookup("rms_norm").source.level == "user"
        cfg = bench_model.TINY_CONFIG if interpreted else bench_model.GPU_CONFIG
        with registry.use_gems():
            bench_model.run_once(cfg)  # the workload tune ran
        # Under the interpreter the pinned config runs; what matters is that every bucket
        # the run tuned was met again (the same workload, the same buckets).
        met = {bucket(c["op"], c["when"]) for c in decorator.choices()}
        named = {bucket(op_name, row.when)
                 for op_name, entry in parsed.ops.items() for row in entry.table}
        assert tuned and tuned <= named
        assert tuned <= met
    finally:
        monkeypatch.delenv("GEMS_TUNE_CONFIG")
        tune.clear_cache()
    shipped = {bucket(op_name, row.when) for op_name in parsed.ops
               for row in tune.lookup(op_name).table}
    assert named - tuned <= shipped
    if interpreted:
        assert named == tuned


def test_tune_refuses_an_unwritable_output_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output path in a missing folder, or a folder, fails at once with one line."""
    assert main(["tune", "--out", str(tmp_path / "no" / "x.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["tune", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["tune", "--out", str(tmp_path / "x.toml"), "--script", "/no/such.py"]) == 2
    assert "no script" in capsys.readouterr().err


def test_bench_host_times_every_case_with_the_launch_stubbed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemsops bench --host` times torch and the gemsops path for each case of the
    eager-speed table (on the CPU with the launch stubbed, on a GPU the real launch),
    every gemsops side served, and writes JSON."""
    out = tmp_path / "host.json"
    assert main(["bench", "--host", "--calls", "3", "--json", str(out),
                 "--match", "^(add|softmax|rms_norm 64x1024|mm)"]) == 0
    printed = capsys.readouterr().out
    stubbed = gemshal.current_device().interpreter
    assert ("launch stubbed" in printed) == stubbed
    result = json.loads(out.read_text())
    assert result["stubbed"] is stubbed
    cases = {r["case"] for r in result["rows"]}
    assert cases == {"add 1024", "softmax 64x1024", "rms_norm 64x1024", "mm 64^3"}
    for row in result["rows"]:
        assert row["torch_us"] > 0 and row["gemsops_us"] > 0
        assert row["served"] and not row["handed_back"], row


def test_stubbed_launches_take_the_direct_path_and_write_nothing() -> None:
    """Under stub_launches a served op runs its whole host path through the direct
    launcher (one compile, one check, then direct launches) and the kernel writes nothing."""
    x = torch.ones(1000, device=gemshal.current_device().torch_device)
    with stub_launches(), registry.use_gems():
        for _ in range(5):
            out = torch.neg(x)
    assert out.shape == x.shape
    stubs = [s for s in launcher._STUBS.values() if s.counts["direct"]]
    assert stubs, "no stubbed launcher took the direct path"
    assert all(s.disabled is None for s in stubs)
    assert sum(s.counts["jit"] for s in stubs) >= 2  # the entry was made and then checked
    with registry.use_gems():
        assert torch.equal(torch.neg(x), -x)  # after the block, kernels run again


def test_progress_line_shows_a_slow_first_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With GEMS_PROGRESS=1 a first launch taking over half a second writes a line naming
    the op while it runs and one with its time after; a fast one writes nothing; a bad
    GEMS_PROGRESS value is an error naming it."""

    class Slow(FakeJit):
        delay = 0.8

        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            time.sleep(self.delay)
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    gpu = tune.TuneContext(vendor="nvidia", arch="sm90", interpreter=False)
    monkeypatch.setattr(tune, "current_context", lambda: gpu)
    monkeypatch.setenv("GEMS_PROGRESS", "1")
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        (tmp_path / "nvidia.toml").write_text("[ops.slow]\nconfigs = [{ BLOCK = 64 }]\n")
        slow = Slow()
        k = kernel("slow", key=["n"])(slow)
        k[(1,)](torch.empty(4), 100)
        err = capsys.readouterr().err
        assert "gemshal: compiling slow (float32, n=128) ..." in err
        assert "gemshal: compiling slow (float32, n=128): 0.8 s" in err
        slow.delay = 0.0
        k[(1,)](torch.empty(4), 5000)  # a new bucket, fast: no line
        assert capsys.readouterr().err == ""
        monkeypatch.setenv("GEMS_PROGRESS", "maybe")
        with pytest.raises(ConfigError, match=r"GEMS_PROGRESS.*'maybe'"):
            k[(1,)](torch.empty(4), 100000)


def test_a_keyless_kernels_choice_leads_its_configs_and_writes_no_table(tmp_path: Path) -> None:
    """A kernel without a key (one bucket, which no table row can name) has its chosen
    config written first in the entry's configs, and the file loads again."""
    from gemsops.tune_run import render

    first = tune.lookup("foreach").configs[0]
    chosen = {"BLOCK": 4096, "num_warps": 8, "num_stages": 2}
    assert dict(first.meta).get("BLOCK") != 4096
    text = render([{"op": "foreach", "when": {}, "dtype": "float32", "config": chosen}], "h")
    out = tmp_path / "keyless.toml"
    out.write_text(text)
    entry = loads(text, TuneSource(out, "user", "test")).ops["foreach"]
    assert not entry.table
    lead = entry.configs[0]
    assert dict(lead.meta) == {"BLOCK": 4096} and lead.num_warps == 8 and lead.num_stages == 2
    assert any(c.identity() == first.identity() for c in entry.configs[1:])


_CHECKPOINTED = """
import os, sys, time
import torch
torch.softmax(torch.randn(8, 16), -1)
out = sys.argv[1]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if os.path.exists(out) and "softmax_rows" in open(out).read():
        open(out + ".seen", "w").write(open(out).read())
        break
    time.sleep(0.05)
"""


def test_a_running_tune_checkpoints_its_file_before_the_workload_ends(tmp_path: Path) -> None:
    """While the workload still runs, the output file already holds the buckets met so
    far (a run killed outright keeps them): the script itself reads it mid-run."""
    from gemsops import tune_run

    script = tmp_path / "work.py"
    script.write_text(_CHECKPOINTED)
    out = tmp_path / "tuned.toml"
    saved = os.environ.get("GEMS_AUTOTUNE")
    try:
        rows = tune_run.run(str(script), ["--", str(out)], str(out), "test run", every=0.1)
    finally:
        if saved is None:
            os.environ.pop("GEMS_AUTOTUNE", None)
        else:
            os.environ["GEMS_AUTOTUNE"] = saved
        tune.clear_cache()
    seen = (tmp_path / "tuned.toml.seen").read_text()
    assert "a checkpoint: the run had not finished" in seen
    assert "[ops.softmax_rows]" in seen
    parsed = loads(seen, TuneSource(out, "user", "test"))
    assert parsed.ops["softmax_rows"].table
    assert any(r["op"] == "softmax_rows" for r in rows)
    assert not (tmp_path / "tuned.toml.partial").exists()


def test_sigint_stops_the_workload_and_keeps_the_buckets_met(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGINT in the middle of the workload (a time limit's signal) ends the script, says
    so on stderr, and the command still writes every bucket met before it."""
    script = tmp_path / "work.py"
    script.write_text("import os, signal, torch\ntorch.softmax(torch.randn(8, 16), -1)\n"
                      "os.kill(os.getpid(), signal.SIGINT)\nraise SystemExit('not reached')\n")
    out = tmp_path / "tuned.toml"
    saved = os.environ.get("GEMS_AUTOTUNE")
    try:
        assert main(["tune", "--out", str(out), "--script", str(script)]) == 0
    finally:
        if saved is None:
            os.environ.pop("GEMS_AUTOTUNE", None)
        else:
            os.environ["GEMS_AUTOTUNE"] = saved
        tune.clear_cache()
    assert "gemsops tune: stopped (SIGINT)" in capsys.readouterr().err
    text = out.read_text()
    assert "[ops.softmax_rows]" in text and "a checkpoint" not in text
