"""Checking the self-test's cases in worker processes, side by side.

Most of a Triton compile, and much of a check (drawing inputs, the float64 reference),
runs under the interpreter lock, so one process barely overlaps its compile threads:
on an H100 (16 cores) compiling first in four worker processes and then checking in
one took over 130 s from empty caches. Each worker now runs the whole check of its
share of the cases, ``gemsops selftest --ops ... --json FILE`` with
``GEMS_SELFTEST_WORKERS=0`` (its own compile-first pass on ``GEMS_COMPILE_THREADS``
threads, then the checks), and the calling process gathers the rows. A worker that
ends without writing its rows (a crash, a device fault) costs nothing but time: the
calling process checks its cases itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import IO

import torch

from gemsops.selftest.records import Case, Row

__all__ = ["MAX_WORKERS", "WORKERS_ENV", "check_in_workers", "compiled", "plan", "read_rows",
           "shares", "worker_command"]

WORKERS_ENV = "GEMS_SELFTEST_WORKERS"
"""How many worker processes ``gemsops selftest`` checks in (0: none)."""

MAX_WORKERS = 16
"""The most workers the default starts: past it, process start-up (importing torch,
a device context each) outweighs what one more share saves."""

Launch = Callable[[list[str], dict[str, str], IO[bytes]], "subprocess.Popen[bytes]"]
"""Start a worker: its command, its environment, the file its stderr goes to."""


def plan(cpus: int | None = None, env: dict[str, str] | None = None) -> tuple[int, int]:
    """``(workers, compile threads per worker)``: ``GEMS_SELFTEST_WORKERS`` when set,
    else three quarters of the CPUs (at most :data:`MAX_WORKERS`; none below 8 CPUs),
    leaving some for the device driver and the workers' own launches; the CPUs are
    shared among the workers as compile threads.

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
        workers = 0 if cpus < 8 else min(MAX_WORKERS, cpus * 3 // 4)
    return workers, max(1, cpus // max(1, workers))


def shares(cases: Sequence[Case], workers: int) -> list[list[Case]]:
    """The cases dealt round-robin to ``workers`` shares (every case in exactly one,
    sizes within one of each other); empty shares are dropped."""
    out: list[list[Case]] = [[] for _ in range(max(1, workers))]
    for i, case in enumerate(cases):
        out[i % len(out)].append(case)
    return [s for s in out if s]


def worker_command(share: Sequence[Case], dtypes: Sequence[torch.dtype] | None,
                   examples: int, json_path: str) -> list[str]:
    """The command line a worker runs: the whole check of its share, rows to ``json_path``."""
    cmd = [sys.executable, "-m", "gemsops", "selftest", "--examples", str(examples),
           "--ops", ",".join(c.op for c in share), "--json", json_path]
    if dtypes is not None:
        cmd += ["--dtypes", ",".join(str(d).removeprefix("torch.") for d in dtypes)]
    return cmd


def read_rows(path: str) -> list[Row] | None:
    """The rows a worker wrote to ``path`` (``gemsops selftest --json``), or None when
    the file is missing or is not such a file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return [Row(**{**r, "served": tuple(r.get("served", ()))}) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def compiled(path: str) -> tuple[int, float] | None:
    """``(kernels compiled, seconds its compile-first pass took)`` as a worker's rows
    file at ``path`` reports them, or None when it does not."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return int(data["compiled"]), float(data["compile_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _popen(cmd: list[str], env: dict[str, str], err: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _last_line(err: IO[bytes]) -> str:
    err.flush()
    err.seek(0)
    lines = err.read().decode(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else "no error output"


def check_in_workers(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype] | None,
    examples: int,
    workers: int,
    threads: int,
    *,
    launch: Launch = _popen,
    say: Callable[[str], None] = print,
    poll_s: float = 0.2,
) -> tuple[list[Row], list[Case]]:
    """Check ``cases`` in up to ``workers`` processes side by side and wait for them all:
    ``(rows, cases no worker checked)``.

    A worker that exits 0 (all passed) or 1 (some failed) having written its rows
    counts; any other end, or rows missing, leaves its cases to the caller. ``say``
    gets a line as each worker ends, in the order they end."""
    groups = shares(cases, workers)
    env = {**os.environ, WORKERS_ENV: "0", "GEMS_COMPILE_THREADS": str(threads)}
    start = time.perf_counter()
    rows: list[Row] = []
    left: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="gemsops-selftest-") as tmp:
        running = []
        for i, group in enumerate(groups):
            path = os.path.join(tmp, f"rows-{i}.json")
            err = open(os.path.join(tmp, f"stderr-{i}.txt"), "w+b")  # noqa: SIM115
            running.append((i, group, path, err,
                            launch(worker_command(group, dtypes, examples, path), env, err)))
        while running:
            still = []
            for i, group, path, err, proc in running:
                code = proc.poll()
                if code is None:
                    still.append((i, group, path, err, proc))
                    continue
                took = time.perf_counter() - start
                got = read_rows(path) if code in (0, 1) else None
                if got is not None:
                    rows.extend(got)
                    failed = sum(r.outcome == "failed" for r in got)
                    built = compiled(path)
                    kernels = (f", {built[0]} kernels compiled in {built[1]:.1f} s"
                               if built is not None else "")
                    say(f"  worker {i + 1} of {len(groups)} done ({len(group)} ops, "
                        f"{len(got)} rows, {failed} failed{kernels}, {took:.1f} s)")
                else:
                    left.extend(group)
                    say(f"  worker {i + 1} of {len(groups)} ended without its rows (rc {code}, "
                        f"{took:.1f} s): {_last_line(err)}; its {len(group)} ops are checked "
                        "here")
                err.close()
            running = still
            if running:
                time.sleep(poll_s)
    return rows, left
