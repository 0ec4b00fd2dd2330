"""Compiling the self-test's kernels in worker processes before it checks.

One process compiles through gemshal's compile pool on threads, but most of a Triton
compile runs under the interpreter lock, so threads alone left the default run's
compile-first pass past 100 s on an H200 (16 cores). Worker processes each run
``gemsops selftest --compile-only`` over a share of the cases: they launch every check's
examples once and write the kernels to Triton's on-disk cache. The checking process then
loads each kernel from that cache in milliseconds. A worker that fails costs nothing but
time: the checking process compiles what is missing itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch

from gemsops.selftest.records import Case

__all__ = ["compile_in_workers", "plan", "shares", "worker_command"]

WORKERS_ENV = "GEMS_SELFTEST_WORKERS"
"""How many compile worker processes ``gemsops selftest`` starts (0: none)."""

Launch = Callable[[list[str], dict[str, str]], "subprocess.Popen[bytes]"]


def plan(cpus: int | None = None, env: dict[str, str] | None = None) -> tuple[int, int]:
    """``(workers, threads per worker)``: ``GEMS_SELFTEST_WORKERS`` when set, else a
    quarter of the CPUs (at most 8, none below 8 CPUs); each worker gets its share of
    the CPUs as compile threads.

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
        workers = 0 if cpus < 8 else min(8, cpus // 4)
    return workers, max(1, cpus // max(1, workers))


def shares(cases: Sequence[Case], workers: int) -> list[list[Case]]:
    """The cases dealt round-robin to ``workers`` shares (every case in exactly one,
    sizes within one of each other); empty shares are dropped."""
    out: list[list[Case]] = [[] for _ in range(max(1, workers))]
    for i, case in enumerate(cases):
        out[i % len(out)].append(case)
    return [s for s in out if s]


def worker_command(share: Sequence[Case], dtypes: Sequence[torch.dtype] | None,
                   examples: int) -> list[str]:
    """The command line a worker runs for its share."""
    cmd = [sys.executable, "-m", "gemsops", "selftest", "--compile-only",
           "--examples", str(examples), "--ops", ",".join(c.op for c in share)]
    if dtypes is not None:
        cmd += ["--dtypes", ",".join(str(d).removeprefix("torch.") for d in dtypes)]
    return cmd


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def compile_in_workers(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype] | None,
    examples: int,
    workers: int,
    threads: int,
    *,
    launch: Launch = _popen,
    say: Callable[[str], None] = print,
) -> int:
    """Run the workers side by side and wait for them; how many finished cleanly.

    Each line ``say`` gets reports a worker that ended (its cases, its time); a failing
    worker's last stderr line comes with it."""
    groups = shares(cases, workers)
    env = {**os.environ, "GEMS_COMPILE_THREADS": str(threads)}
    start = time.perf_counter()
    running = [(i, g, launch(worker_command(g, dtypes, examples), env))
               for i, g in enumerate(groups)]
    ok = 0
    for i, group, proc in running:
        _, err = proc.communicate()
        took = time.perf_counter() - start
        if proc.returncode == 0:
            ok += 1
            say(f"  compile worker {i + 1} of {len(groups)} done ({len(group)} ops, "
                f"{took:.1f} s)")
        else:
            tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
            say(f"  compile worker {i + 1} of {len(groups)} failed (rc {proc.returncode}): "
                f"{tail[0][:200]}; the check compiles its kernels itself")
    return ok
