"""`gemsops selftest`'s worker processes: how many, which cases, the command each runs,
how their rows come back, and what a failing worker does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from typing import IO

import attrs
import pytest
import torch

from gemsops.cli import main
from gemsops.selftest.cases import CASES
from gemsops.selftest.records import Row
from gemsops.selftest.workers import (
    check_in_workers,
    plan,
    read_rows,
    shares,
    worker_command,
)


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 8])
def test_shares_deal_every_case_to_exactly_one_worker(workers: int) -> None:
    """Property: the shares partition the cases (each exactly once) and their sizes
    differ by at most one."""
    groups = shares(CASES, workers)
    seen = Counter(c.op for g in groups for c in g)
    assert set(seen) == {c.op for c in CASES} and set(seen.values()) == {1}
    sizes = [len(g) for g in groups]
    assert len(groups) == workers and max(sizes) - min(sizes) <= 1


def test_more_workers_than_cases_leaves_no_empty_share() -> None:
    """Two cases over eight workers: two shares of one case each."""
    assert [len(g) for g in shares(CASES[:2], 8)] == [1, 1]


def test_plan_reads_the_setting_and_splits_the_cpus() -> None:
    """Unset: three quarters of the CPUs as workers (at most 16), the CPUs shared among
    them as compile threads; none on a 2-core box; the setting wins; a bad value exits
    naming it."""
    assert plan(16, {}) == (12, 1)
    assert plan(64, {}) == (16, 4)
    assert plan(8, {}) == (6, 1)
    assert plan(2, {})[0] == 0
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "2"}) == (2, 8)
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "0"}) == (0, 16)
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exc:
            plan(16, {"GEMS_SELFTEST_WORKERS": bad})
        assert "GEMS_SELFTEST_WORKERS" in str(exc.value) and repr(bad) in str(exc.value)


def test_the_worker_command_checks_its_cases_into_a_json_file() -> None:
    """A worker runs the whole `gemsops selftest` (not --compile-only) over exactly its
    share, its dtypes and examples, writing its rows to the given file."""
    cmd = worker_command(CASES[:3], [torch.bfloat16], 5, "/tmp/rows.json")
    assert cmd[:4] == [sys.executable, "-m", "gemsops", "selftest"]
    assert "--compile-only" not in cmd
    assert cmd[cmd.index("--ops") + 1] == ",".join(c.op for c in CASES[:3])
    assert cmd[cmd.index("--dtypes") + 1] == "bfloat16"
    assert cmd[cmd.index("--examples") + 1] == "5"
    assert cmd[cmd.index("--json") + 1] == "/tmp/rows.json"
    assert "--dtypes" not in worker_command(CASES[:1], None, 3, "x.json")


def test_rows_survive_the_json_a_worker_writes() -> None:
    """read_rows gives back the rows `--json` wrote (served ops as a tuple); a missing
    or foreign file gives None."""
    rows = [Row("abs", "float32", "passed", 3, served=("abs",)),
            Row("sin", "bfloat16", "failed", 2, "off by 1", "x=[1.0]")]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        with open(path, "w") as fh:
            json.dump({"rows": [attrs.asdict(r) for r in rows]}, fh)
        assert read_rows(path) == rows
        with open(path, "w") as fh:
            fh.write('{"summary": {}}')
        assert read_rows(path) is None
        assert read_rows(os.path.join(tmp, "missing.json")) is None


def _writes_rows(rows: list[Row], code: int) -> str:
    payload = json.dumps({"rows": [attrs.asdict(r) for r in rows]})
    return (f"import sys; open(sys.argv[sys.argv.index('--json') + 1], 'w').write({payload!r}); "
            f"sys.exit({code})")


def test_rows_of_clean_workers_count_and_a_crashed_workers_cases_come_back() -> None:
    """Workers run side by side with GEMS_SELFTEST_WORKERS=0 (no nesting) and
    GEMS_COMPILE_THREADS set. One exiting 1 (a failed row) with its rows counts; one that
    dies without rows is reported with its last stderr line, its cases returned to be
    checked by the caller."""
    seen: list[tuple[list[str], dict[str, str]]] = []
    failed = Row(CASES[0].op, "float32", "failed", 2, "mismatch")

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        seen.append((cmd, env))
        code = _writes_rows([failed], 1) if len(seen) == 1 else \
            "import sys; print('boom: device fault', file=sys.stderr); sys.exit(-6)"
        return subprocess.Popen([sys.executable, "-c", code, *cmd[1:]], stderr=err)

    lines: list[str] = []
    rows, left = check_in_workers(CASES[:4], None, 2, 2, 3, launch=launch, say=lines.append,
                                  poll_s=0.01)
    assert rows == [failed]
    assert [c.op for c in left] == [CASES[1].op, CASES[3].op]
    settings = {(e["GEMS_SELFTEST_WORKERS"], e["GEMS_COMPILE_THREADS"]) for _, e in seen}
    assert settings == {("0", "3")}
    assert any("worker 1 of 2 done (2 ops, 1 rows, 1 failed" in line for line in lines)
    assert any("worker 2 of 2 ended without its rows" in line and "boom: device fault" in line
               for line in lines)


def test_compile_only_checks_nothing_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile-only` prints how many kernels it compiled and no check rows."""
    code = main(["selftest", "--compile-only", "--ops", CASES[0].op, "--examples", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "kernels compiled in" in out
    assert "outcome" not in out and "passed" not in out


def test_sharded_run_prints_the_rows_one_process_would(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With GEMS_SELFTEST_WORKERS=2, two real worker processes check two ops: the rows
    printed, in case order, and the summary are those of a run in this process."""
    ops = ",".join(c.op for c in CASES[:2])
    args = ["selftest", "--ops", ops, "--examples", "1", "--dtypes", "float32"]
    monkeypatch.setenv("GEMS_SELFTEST_WORKERS", "0")
    assert main(args) == 0
    alone = capsys.readouterr().out
    monkeypatch.setenv("GEMS_SELFTEST_WORKERS", "2")
    assert main(args) == 0
    sharded = capsys.readouterr().out
    assert "in 2 worker processes" in sharded and "worker 2 of 2 done" in sharded

    def table(out: str) -> list[str]:
        lines = out.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("op "))
        return [re.sub(r"\(\d+\.\d s\)", "", line) for line in lines[first:]]

    assert table(sharded) == table(alone)
    assert table(alone)[1].startswith(CASES[0].op) and table(alone)[2].startswith(CASES[1].op)
