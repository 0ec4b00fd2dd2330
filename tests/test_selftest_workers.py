"""`gemsops selftest`'s compile worker processes: how many, which cases, the command
each runs, and what a failing worker does."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import torch

from gemsops.cli import main
from gemsops.selftest.cases import CASES
from gemsops.selftest.workers import compile_in_workers, plan, shares, worker_command


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
    """Unset: a quarter of 16 CPUs as workers, the CPUs shared among them as threads;
    none on a 2-core box; the setting wins; a bad value exits naming it."""
    assert plan(16, {}) == (4, 4)
    assert plan(64, {}) == (8, 8)
    assert plan(2, {})[0] == 0
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "2"}) == (2, 8)
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "0"}) == (0, 16)
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exc:
            plan(16, {"GEMS_SELFTEST_WORKERS": bad})
        assert "GEMS_SELFTEST_WORKERS" in str(exc.value) and repr(bad) in str(exc.value)


def test_the_worker_command_names_its_cases_dtypes_and_examples() -> None:
    """A worker runs `gemsops selftest --compile-only` over exactly its share."""
    cmd = worker_command(CASES[:3], [torch.bfloat16], 5)
    assert cmd[:5] == [sys.executable, "-m", "gemsops", "selftest", "--compile-only"]
    assert cmd[cmd.index("--ops") + 1] == ",".join(c.op for c in CASES[:3])
    assert cmd[cmd.index("--dtypes") + 1] == "bfloat16"
    assert cmd[cmd.index("--examples") + 1] == "5"
    assert "--dtypes" not in worker_command(CASES[:1], None, 3)


def test_a_failing_worker_is_reported_and_the_others_count() -> None:
    """Workers run side by side with GEMS_COMPILE_THREADS set; one that exits 1 is
    reported with its last stderr line, and only the clean ones are counted."""
    seen: list[tuple[list[str], str]] = []

    def launch(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        seen.append((cmd, env["GEMS_COMPILE_THREADS"]))
        code = "import sys; sys.exit(0)" if len(seen) == 1 else \
            "import sys; print('boom: no device', file=sys.stderr); sys.exit(1)"
        return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)

    lines: list[str] = []
    ok = compile_in_workers(CASES[:4], None, 2, 2, 3, launch=launch, say=lines.append)
    assert ok == 1 and len(seen) == 2 and {t for _, t in seen} == {"3"}
    assert "worker 1 of 2 done (2 ops" in lines[0]
    assert "worker 2 of 2 failed (rc 1): boom: no device" in lines[1]


def test_compile_only_checks_nothing_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile-only` prints how many kernels it compiled and no check rows."""
    code = main(["selftest", "--compile-only", "--ops", CASES[0].op, "--examples", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "kernels compiled in" in out
    assert "outcome" not in out and "passed" not in out


def test_a_real_worker_process_runs_to_the_end() -> None:
    """One real worker (a subprocess of this interpreter) over one case exits cleanly."""
    assert compile_in_workers(CASES[:1], [torch.float32], 1, 1, 1, say=lambda _: None) == 1
