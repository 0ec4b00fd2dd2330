"""Checking the self-test's cases in worker processes, side by side, from one queue.

Most of a Triton compile, and much of a check (drawing inputs, the float64 reference),
runs under the interpreter lock, so one process barely overlaps its compile threads:
on an H100 (16 cores) compiling first in four worker processes and then checking in
one took over 130 s from empty caches. So each worker process checks whole cases, one
dtype at a time.

The cases are not dealt out in fixed shares: an op's cost is the kernels it compiles
(from 1 to about 100), and on an H100 twelve round-robin shares of 16-17 ops ended
between 67 s and over 150 s. Each worker runs ``gemsops selftest --serve`` (with
``GEMS_SELFTEST_WORKERS=0``): it reads a case name and a dtype a line on stdin,
compiles that check's kernels first on its ``GEMS_COMPILE_THREADS`` threads, checks
it, and writes its rows as one marked JSON line on stdout. The calling process hands
the next (case, dtype), costliest case first by :func:`weight`, to whichever worker
answers, so every worker stays busy until the queue is empty, and the dtypes of one
long case (attention's backward took 61 s on one H100 worker) run side by side. A
worker that ends without answering (a crash, a device fault) costs only the check it
held: the calling process makes that check itself.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, TextIO

import attrs
import torch

from gemsops.native import ENV as NATIVE_ENV
from gemsops.selftest.records import Case, Row

__all__ = [
    "HEAVY",
    "HEAVY_FACTOR",
    "MARK",
    "MAX_WORKERS",
    "WORKERS_ENV",
    "OpTiming",
    "check_in_workers",
    "checks",
    "plan",
    "serve",
    "serve_command",
    "weight",
]

WORKERS_ENV = "GEMS_SELFTEST_WORKERS"
"""How many worker processes ``gemsops selftest`` checks in (0: none)."""

MAX_WORKERS = 16
"""The most workers the default starts: past it, process start-up (importing torch,
a device context each) outweighs what one more worker saves."""

MARK = "gemsops-selftest-rows "
"""The prefix of a worker's answer line on stdout (anything else it prints is ignored)."""

Launch = Callable[[list[str], dict[str, str], IO[bytes]], "subprocess.Popen[bytes]"]
"""Start a worker: its command, its environment, the file its stderr goes to. The
process must have pipes for stdin and stdout."""


def plan(cpus: int | None = None, env: dict[str, str] | None = None) -> tuple[int, int]:
    """``(workers, compile threads per worker)``: ``GEMS_SELFTEST_WORKERS`` when set,
    else one a CPU (at most :data:`MAX_WORKERS`; none below 8 CPUs); the CPUs are
    shared among the workers as compile threads. On a 16-CPU H100 machine, from empty
    caches, 16 workers took 57.3 s where 12 took 74.4 s (one call, docs/gpu/s18): the
    workers are compile-bound, so a CPU held back for the driver costs more than it
    saves.

    Raises:
        SystemExit: a value that is not a non-negative integer, naming it.
    """
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    raw = (os.environ if env is None else env).get(WORKERS_ENV, "").strip()
    if raw:
        try:
            workers = int(raw)
        except ValueError:
            workers = -1
        if workers < 0:
            raise SystemExit(f"gemsops selftest: {WORKERS_ENV} must be a whole number of "
                             f"worker processes (0 for none), not {raw!r}")
    else:
        workers = 0 if cpus < 8 else min(MAX_WORKERS, cpus)
    return workers, max(1, cpus // max(1, workers))


HEAVY = ("mm", "convolution", "attention")
"""Op names holding these reach the tile-matmul kernels, whose compiles are the longest:
on an H100 (docs/gpu/s17) mm, bmm, addmm and convolution took 21-33 s a case and the
attention cases 33-61 s, where a pointwise case takes 1-5 s."""

HEAVY_FACTOR = 4
"""How much more a case reaching :data:`HEAVY` kernels weighs."""


def weight(case: Case) -> int:
    """A case's expected cost, to hand out the costliest first: its dtypes times the
    gemsops ops it reaches (each a kernel family compiled per dtype), times
    :data:`HEAVY_FACTOR` when one of them is a matmul, convolution or attention."""
    heavy = any(part in name for name in case.aten for part in HEAVY)
    return len(case.dtypes) * max(1, len(case.aten)) * (HEAVY_FACTOR if heavy else 1)


def checks(cases: Sequence[Case], dtypes: Sequence[torch.dtype] | None) -> list[Case]:
    """The checks a sharded run hands out, in order: each case narrowed to each of its
    dtypes (those in ``dtypes`` when given), the costliest case first. One unit per
    case and dtype, so the dtypes of a long case (attention_backward, 61 s on an H100
    as one) go to several workers; the stable sort keeps them together."""
    return [attrs.evolve(case, dtypes=(d,)) for case in sorted(cases, key=weight, reverse=True)
            for d in case.dtypes if dtypes is None or d in dtypes]


def serve_command(dtypes: Sequence[torch.dtype] | None, examples: int) -> list[str]:
    """The command line a worker runs: ``gemsops selftest --serve`` with the run's
    dtypes and examples; the cases come on its stdin."""
    cmd = [sys.executable, "-m", "gemsops", "selftest", "--serve", "--examples", str(examples)]
    if dtypes is not None:
        cmd += ["--dtypes", ",".join(str(d).removeprefix("torch.") for d in dtypes)]
    return cmd


def serve(cases: Sequence[Case], dtypes: Sequence[torch.dtype] | None, examples: int, *,
          lines: Iterable[str] = sys.stdin, out: TextIO = sys.stdout) -> int:
    """A worker's loop: for each case name read from ``lines`` (optionally followed by
    one of its dtypes, to check that dtype only), compile its kernels first, check it,
    and write ``MARK`` and a JSON object (``op``, ``dtype``, ``rows``, ``compiled``:
    kernels its compile-first pass started, ``compile_s``; ``check_s``: the whole
    check's seconds) as one line to ``out``. A name no case has (or a dtype the case
    lacks) is answered with no rows and an ``error``. 0 at the end of ``lines``."""
    from gemsops.selftest.runner import prepare, run

    by_name = {c.op: c for c in cases}
    for line in lines:
        op, _, dtype_name = line.strip().partition(" ")
        if not op:
            continue
        case = by_name.get(op)
        chosen = dtypes
        if case is not None and dtype_name:
            named = [d for d in case.dtypes if str(d).removeprefix("torch.") == dtype_name]
            if not named:
                case = None
            chosen = named
        answer: dict[str, Any] = {"op": op, "dtype": dtype_name, "rows": [], "compiled": 0,
                                  "compile_s": 0.0, "check_s": 0.0}
        if case is None:
            answer["error"] = f"no self-test case is named {line.strip()!r}"
        else:
            start = time.perf_counter()
            answer["compiled"] = prepare([case], chosen, examples=examples)
            answer["compile_s"] = round(time.perf_counter() - start, 3)
            answer["rows"] = [attrs.asdict(r) for r in run([case], chosen, examples=examples)]
            answer["check_s"] = round(time.perf_counter() - start, 3)
        out.write(MARK + json.dumps(answer) + "\n")
        out.flush()
    return 0


def _rows(data: Any) -> list[Row]:
    return [Row(**{**r, "served": tuple(r.get("served", ()))}) for r in data["rows"]]


@attrs.frozen
class OpTiming:
    """Where one check's time went in a sharded run (``--json``'s ``ops``): a case in
    one dtype, or in all of them when a worker was handed the whole case.

    Attributes:
        op: The case.
        dtype: The dtype checked (empty: every dtype of the case).
        worker: The worker (1-based) that checked it.
        compiled: Kernels its compile-first pass started.
        compile_s: Seconds of that pass.
        check_s: Seconds of the whole check: the pass, then the check itself (kernels
            launched only after an op's own earlier kernels compile here).
        sent_s: When the check was handed out, in seconds from the run's start.
        done_s: When its answer came back (for a worker's first check, ``done_s -
            sent_s - check_s`` is about its start-up: importing torch, a device context).
    """

    op: str
    dtype: str
    worker: int
    compiled: int
    compile_s: float
    check_s: float
    sent_s: float = 0.0
    done_s: float = 0.0


def _popen(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err)


def _last_line(err: IO[bytes]) -> str:
    err.flush()
    err.seek(0)
    lines = err.read().decode(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else "no error output"


@attrs.define
class _Worker:
    number: int
    proc: subprocess.Popen[bytes]
    err: IO[bytes]
    holding: Case | None = None
    sent: float = 0.0
    """When it was handed the check it holds (``time.perf_counter()``)."""
    pending: bytes = b""
    """What was read from its stdout past the last whole line."""
    checks: int = 0
    rows: int = 0
    failed: int = 0
    compiled: int = 0
    compile_s: float = 0.0

    def read(self) -> list[str] | None:
        """The whole lines its stdout has now (one read, so a line the pipe holds is
        never left in a buffer the selector cannot see); None at its end."""
        stdout = self.proc.stdout
        assert stdout is not None
        chunk = os.read(stdout.fileno(), 1 << 16)
        if not chunk:
            return None
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def send(self, case: Case | None) -> bool:
        """Hand the worker ``case`` (None: no more, close its stdin); False when its
        pipe is gone."""
        stdin = self.proc.stdin
        assert stdin is not None
        self.holding = case
        self.sent = time.perf_counter()
        try:
            if case is None:
                stdin.close()
            else:
                stdin.write((_label(case) + "\n").encode())
                stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True


def _label(case: Case) -> str:
    """A check's name: its case, and its dtype when it checks one."""
    if len(case.dtypes) == 1:
        return f"{case.op} {str(case.dtypes[0]).removeprefix('torch.')}"
    return case.op


def _take(worker: _Worker, answer: dict[str, Any], rows: list[Row], left: list[Case],
          queue: collections.deque[Case], timings: list[OpTiming] | None,
          start: float) -> None:
    """Count a worker's answer and hand it the next check (None: close its stdin)."""
    got = _rows(answer)
    if timings is not None:
        now = time.perf_counter()
        timings.append(OpTiming(str(answer["op"]), str(answer.get("dtype", "")), worker.number,
                                int(answer.get("compiled", 0)),
                                float(answer.get("compile_s", 0.0)),
                                float(answer.get("check_s", 0.0)),
                                round(worker.sent - start, 3), round(now - start, 3)))
    rows.extend(got)
    worker.checks += 1
    worker.rows += len(got)
    worker.failed += sum(r.outcome == "failed" for r in got)
    worker.compiled += int(answer.get("compiled", 0))
    worker.compile_s += float(answer.get("compile_s", 0.0))
    if "error" in answer and worker.holding is not None:
        left.append(worker.holding)
    nxt = queue.popleft() if queue else None
    if not worker.send(nxt) and nxt is not None:
        queue.appendleft(nxt)
        worker.holding = None


def check_in_workers(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype] | None,
    examples: int,
    workers: int,
    threads: int,
    *,
    launch: Launch = _popen,
    say: Callable[[str], None] = print,
    timings: list[OpTiming] | None = None,
) -> tuple[list[Row], list[Case]]:
    """Check ``cases`` in each of their dtypes (those in ``dtypes`` when given) in up to
    ``workers`` processes side by side, one case in one dtype at a time, costliest case
    first, each worker taking the next check as it answers: ``(rows, checks no worker
    made)``, each check a case narrowed to its one dtype.

    ``say`` gets a line as each worker ends, in the order they end: the checks it made,
    their rows and failures, the kernels it compiled. ``timings``, when given, gets an
    :class:`OpTiming` per check answered. A worker that ends while it holds a check
    leaves that check to the caller; when no worker is left, so are the checks not
    handed out."""
    units = checks(cases, dtypes)
    queue = collections.deque(units)
    count = min(workers, len(units))
    env = {**os.environ, WORKERS_ENV: "0", "GEMS_COMPILE_THREADS": str(threads)}
    # The native replay serves repeated calls of a structure already seen, which the
    # draws rarely make; and from an empty cache every worker would build its library at
    # once, a C++ compile each beside the Triton compiles. Workers keep to the Python path
    # unless GEMS_NATIVE is set.
    env.setdefault(NATIVE_ENV, "0")
    start = time.perf_counter()
    rows: list[Row] = []
    left: list[Case] = []
    selector = selectors.DefaultSelector()
    with tempfile.TemporaryDirectory(prefix="gemsops-selftest-") as tmp:
        for i in range(count):
            err = open(os.path.join(tmp, f"stderr-{i}.txt"), "w+b")  # noqa: SIM115
            worker = _Worker(i + 1, launch(serve_command(dtypes, examples), env, err), err)
            assert worker.proc.stdout is not None
            selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
            if not worker.send(queue.popleft() if queue else None) and worker.holding:
                queue.appendleft(worker.holding)
                worker.holding = None
        while selector.get_map():
            for key, _ in selector.select():
                worker = key.data
                lines = worker.read()
                if lines is not None:
                    for text in lines:
                        if text.startswith(MARK):  # else something the worker printed
                            _take(worker, json.loads(text[len(MARK):]), rows, left, queue,
                                  timings, start)
                    continue
                selector.unregister(key.fileobj)
                code = worker.proc.wait()
                took = time.perf_counter() - start
                done = (f"{worker.checks} checks, {worker.rows} rows, {worker.failed} failed, "
                        f"{worker.compiled} kernels compiled in {worker.compile_s:.1f} s")
                if worker.holding is None and code == 0:
                    say(f"  worker {worker.number} of {count} done ({done}, {took:.1f} s)")
                else:
                    held = worker.holding
                    if held is not None:
                        left.append(held)
                    say(f"  worker {worker.number} of {count} ended (rc {code}, {took:.1f} s) "
                        f"after {done}: {_last_line(worker.err)}"
                        + (f"; its check {_label(held)} is made here" if held is not None
                           else ""))
                worker.err.close()
        left.extend(queue)  # no worker was left to take them
    selector.close()
    return rows, left
