"""`gemsops selftest`'s worker processes: how many, which cases, the command each runs,
how their rows come back, and what a failing worker does."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import IO

import pytest
import torch

from gemsops.cli import main
from gemsops.selftest.cases import CASES
from gemsops.selftest.records import Case, Row
from gemsops.selftest.workers import (
    MARK,
    OpTiming,
    check_in_workers,
    plan,
    serve,
    serve_command,
    weight,
)


def test_plan_reads_the_setting_and_splits_the_cpus() -> None:
    """Unset: a worker a CPU (at most 16), the CPUs shared among
    them as compile threads; none on a 2-core box; the setting wins; a bad value exits
    naming it."""
    assert plan(16, {}) == (16, 1)
    assert plan(12, {}) == (12, 1)
    assert plan(64, {}) == (16, 4)
    assert plan(8, {}) == (8, 1)
    assert plan(7, {})[0] == 0
    assert plan(2, {})[0] == 0
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "2"}) == (2, 8)
    assert plan(16, {"GEMS_SELFTEST_WORKERS": "0"}) == (0, 16)
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exc:
            plan(16, {"GEMS_SELFTEST_WORKERS": bad})
        assert "GEMS_SELFTEST_WORKERS" in str(exc.value) and repr(bad) in str(exc.value)


def test_the_worker_command_serves_cases_from_stdin_with_the_runs_settings() -> None:
    """A worker runs `gemsops selftest --serve` (not --compile-only) with the run's
    dtypes and examples; no case is named on its command line."""
    cmd = serve_command([torch.bfloat16], 5)
    assert cmd[:4] == [sys.executable, "-m", "gemsops", "selftest"]
    assert "--serve" in cmd and "--compile-only" not in cmd and "--ops" not in cmd
    assert cmd[cmd.index("--dtypes") + 1] == "bfloat16"
    assert cmd[cmd.index("--examples") + 1] == "5"
    assert "--dtypes" not in serve_command(None, 3)


def test_serve_answers_each_named_case_with_its_rows_in_one_marked_line() -> None:
    """serve() checks the cases named on its input lines, in that order, one marked
    JSON line each (the rows a check in this process gives); a blank line is skipped
    and an unknown name is answered with an error and no rows."""
    import io

    from gemsops.selftest.runner import run

    picked = [c for c in CASES if c.op in ("neg", "abs")]
    out = io.StringIO()
    code = serve(CASES, [torch.float32], 1, lines=["abs\n", "\n", "nosuchop\n", "neg\n"],
                 out=out)
    assert code == 0
    answers = [json.loads(line[len(MARK):]) for line in out.getvalue().splitlines()]
    assert all(line.startswith(MARK) for line in out.getvalue().splitlines())
    assert [a["op"] for a in answers] == ["abs", "nosuchop", "neg"]
    assert answers[1]["rows"] == [] and "nosuchop" in answers[1]["error"]
    expected = {c.op: run([c], [torch.float32], examples=1) for c in picked}
    for answer in (answers[0], answers[2]):
        got = [Row(**{**r, "served": tuple(r["served"])}) for r in answer["rows"]]
        assert [(r.op, r.dtype, r.outcome) for r in got] == \
            [(r.op, r.dtype, r.outcome) for r in expected[answer["op"]]]


def _fake_worker(crash_on: str | None) -> str:
    """A stand-in for `gemsops selftest --serve`: answers each "case dtype" line with one
    passed row (two kernels compiled), printing other lines too; exits -6 on the case
    ``crash_on``."""
    return (
        "import json, sys\n"
        "print('noise before the first answer', flush=True)\n"
        "for line in sys.stdin:\n"
        "    op, _, dt = line.strip().partition(' ')\n"
        f"    if op == {crash_on!r}:\n"
        "        print('boom: device fault', file=sys.stderr); sys.exit(-6)\n"
        "    row = dict(op=op, dtype=dt, outcome='passed', examples=1, detail='',\n"
        "               example='', served=[op])\n"
        f"    print({MARK!r} + json.dumps(dict(op=op, dtype=dt, rows=[row], compiled=2,\n"
        "                                  compile_s=0.5, check_s=1.25)),\n"
        "          flush=True)\n"
    )


def _checks(cases: list[Case]) -> list[tuple[str, str]]:
    """The (case, dtype) pairs a sharded run hands out for ``cases``, sorted."""
    return sorted((c.op, str(d)[6:]) for c in cases for d in c.dtypes)


def test_workers_take_cases_from_one_queue_costliest_first() -> None:
    """Every case is checked exactly once in each of its dtypes, by whichever worker
    answers first; workers run with GEMS_SELFTEST_WORKERS=0 (no nesting) and
    GEMS_COMPILE_THREADS set; each worker's end line counts its checks, rows and
    kernels."""
    cases = list(CASES[:9])
    seen: list[dict[str, str]] = []

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        seen.append(env)
        return subprocess.Popen([sys.executable, "-c", _fake_worker(None)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    lines: list[str] = []
    timings: list[OpTiming] = []
    rows, left = check_in_workers(cases, None, 1, 3, 4, launch=launch, say=lines.append,
                                  timings=timings)
    assert left == []
    assert sorted((t.op, t.dtype) for t in timings) == _checks(cases)
    assert {t.worker for t in timings} <= {1, 2, 3}
    assert {(t.compiled, t.compile_s, t.check_s) for t in timings} == {(2, 0.5, 1.25)}
    assert all(0 <= t.sent_s <= t.done_s for t in timings)
    for w in {t.worker for t in timings}:  # a worker's cases follow one another
        mine = [t for t in timings if t.worker == w]
        assert all(a.done_s <= b.sent_s for a, b in itertools.pairwise(mine))
    assert sorted((r.op, r.dtype) for r in rows) == _checks(cases)
    assert {(e["GEMS_SELFTEST_WORKERS"], e["GEMS_COMPILE_THREADS"]) for e in seen} == {("0", "4")}
    assert {e["GEMS_NATIVE"] for e in seen} == {"0"}  # no native build in every worker
    assert len(lines) == 3 and all(" done (" in line for line in lines)
    counted = [re.search(r"\((\d+) checks, (\d+) rows, 0 failed, (\d+) kernels", line)
               for line in lines]
    assert all(m is not None for m in counted)
    checks = [int(m.group(1)) for m in counted if m is not None]
    assert sum(checks) == len(_checks(cases))
    assert all(int(m.group(3)) == 2 * int(m.group(1)) for m in counted if m is not None)


def test_the_dtypes_of_one_case_go_to_several_workers() -> None:
    """A case's dtypes are separate checks: with as many workers as dtypes and one case,
    each worker checks one dtype of it."""
    case = next(c for c in CASES if c.op == "attention_backward")
    assert len(case.dtypes) == 3

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", _fake_worker(None)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    timings: list[OpTiming] = []
    rows, left = check_in_workers([case], None, 1, 3, 1, launch=launch, say=lambda _: None,
                                  timings=timings)
    assert left == [] and sorted((r.op, r.dtype) for r in rows) == _checks([case])
    assert sorted(t.worker for t in timings) == [1, 2, 3]


def test_workers_keep_a_native_setting_the_user_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMS_NATIVE set by the user reaches the workers as it is (only unset becomes 0)."""
    monkeypatch.setenv("GEMS_NATIVE", "1")
    seen: list[dict[str, str]] = []

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        seen.append(env)
        return subprocess.Popen([sys.executable, "-c", _fake_worker(None)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    rows, left = check_in_workers(list(CASES[:2]), None, 1, 2, 1, launch=launch,
                                  say=lambda _: None)
    assert len(rows) == len(_checks(list(CASES[:2]))) and left == []
    assert {e["GEMS_NATIVE"] for e in seen} == {"1"}


def test_matmul_convolution_and_attention_cases_weigh_more() -> None:
    """A case reaching a tile-matmul kernel (mm, convolution, attention) outweighs a
    pointwise case of as many dtypes and ops, so it is handed out earlier."""
    by = {c.op: c for c in CASES}
    for heavy in ("mm", "bmm", "addmm", "convolution", "convolution_backward"):
        assert len(by[heavy].dtypes) == len(by["add"].dtypes)
        assert weight(by[heavy]) > weight(by["add"]), heavy
    assert weight(by["attention_backward"]) > weight(by["mm"])
    assert weight(by["add"]) == len(by["add"].dtypes)  # one op, no factor


def test_one_worker_gets_the_cases_heaviest_first() -> None:
    """With one worker the answers come in the order the checks were handed out: the
    cases by falling weight, ties in case order, each case's dtypes together."""
    cases = [c for c in CASES if weight(c) > 3][:3] + [c for c in CASES if weight(c) == 1][:3]
    assert len({weight(c) for c in cases}) > 1

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", _fake_worker(None)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    rows, left = check_in_workers(cases[::-1], None, 1, 1, 1, launch=launch, say=lambda _: None)
    assert left == []
    expected = sorted(cases[::-1], key=lambda c: -weight(c))
    assert [r.op for r in rows] == [c.op for c in expected for _ in c.dtypes]
    assert weight(expected[0]) > weight(expected[-1])


def test_a_crashed_worker_costs_only_the_case_it_held() -> None:
    """A worker that dies on a check is reported with its last stderr line; that check
    (one case in one dtype) comes back to the caller and the other worker makes every
    other check, the case's other dtypes included."""
    cases = list(CASES[:6])
    victim = sorted(cases, key=weight, reverse=True)[0]  # its 2nd dtype goes to worker 2
    lost = (victim.op, str(victim.dtypes[1])[6:])
    started = [0]

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        started[0] += 1
        crash = victim.op if started[0] == 2 else None
        return subprocess.Popen([sys.executable, "-c", _fake_worker(crash)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    lines: list[str] = []
    rows, left = check_in_workers(cases, None, 1, 2, 1, launch=launch, say=lines.append)
    assert [(c.op, str(c.dtypes[0])[6:]) for c in left] == [lost]
    assert sorted((r.op, r.dtype) for r in rows) == [p for p in _checks(cases) if p != lost]
    assert any("worker 2 of 2 ended" in line and "boom: device fault" in line
               and f"its check {lost[0]} {lost[1]} is made here" in line for line in lines)
    assert any(f"worker 1 of 2 done ({len(_checks(cases)) - 1} checks" in line
               for line in lines)


def test_cases_no_worker_is_left_to_take_come_back() -> None:
    """When every worker dies, the check each held and the checks never handed out all
    come back to the caller."""
    cases = list(CASES[:5])

    def launch(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
        code = "import sys; sys.stdin.readline(); sys.exit(3)"
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)

    lines: list[str] = []
    rows, left = check_in_workers(cases, None, 1, 2, 1, launch=launch, say=lines.append)
    assert rows == [] and all(len(c.dtypes) == 1 for c in left)
    assert sorted((c.op, str(c.dtypes[0])[6:]) for c in left) == _checks(cases)
    assert sum("ended (rc 3" in line for line in lines) == 2


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
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        assert main([*args, "--json", path]) == 0
        with open(path, encoding="utf-8") as fh:
            saved = json.load(fh)
    sharded = capsys.readouterr().out
    assert "in 2 worker processes" in sharded and "worker 2 of 2 done (1 checks" in sharded
    # Each op's time, slowest first, with the worker that checked it.
    times = saved["ops"]
    assert sorted(t["op"] for t in times) == sorted(c.op for c in CASES[:2])
    assert {t["worker"] for t in times} == {1, 2}
    assert all(t["check_s"] > 0 for t in times)
    assert times[0]["check_s"] >= times[1]["check_s"]
    assert saved["compiled"] == sum(t["compiled"] for t in times)

    def table(out: str) -> list[str]:
        lines = out.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("op "))
        return [re.sub(r"\(\d+\.\d s\)", "", line) for line in lines[first:]]

    assert table(sharded) == table(alone)
    assert table(alone)[1].startswith(CASES[0].op) and table(alone)[2].startswith(CASES[1].op)


def test_one_op_shards_over_its_dtypes(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One op in three dtypes is three checks: with three workers, each makes one, and
    the rows come back in the op's dtype order."""
    monkeypatch.setenv("GEMS_SELFTEST_WORKERS", "3")
    case = next(c for c in CASES if c.op == "neg")
    assert main(["selftest", "--ops", "neg", "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert f"({len(case.dtypes)} op-dtype checks) in 3 worker processes" in out
    assert sum(" done (1 checks, 1 rows" in line for line in out.splitlines()) == 3
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("neg ")]
    assert rows == [["neg", str(d)[6:], "passed"] for d in case.dtypes]
