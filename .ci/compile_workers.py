"""The compile-first pass the device sweeps share (.ci/sweep_mm.py, .ci/sweep_attn.py,
.ci/splitk_probe.py): compiling dominates a sweep, so N worker processes each launch
their share of the candidates once (``SCRIPT OUT --compile I N``), filling Triton's
cache, before the timing pass runs alone on the device.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def worker_share() -> tuple[int, int] | None:
    """(I, N) when this process is compile worker I of N (``--compile I N``), else None."""
    if len(sys.argv) > 4 and sys.argv[2] == "--compile":
        return int(sys.argv[3]), int(sys.argv[4])
    return None


def compile_then_time(script: str, run: Callable[[bool, tuple[int, int] | None], Any],
                      default_workers: int) -> Any:
    """As a worker: ``run(False, share)`` (launch only). Otherwise start ``SWEEP_WORKERS``
    (default ``default_workers``) workers of ``script`` with its output folder
    (``sys.argv[1]``), report the ones that failed, then ``run(True, None)``."""
    share = worker_share()
    if share is not None:
        return run(False, share)
    out = sys.argv[1]
    workers = int(os.environ.get("SWEEP_WORKERS", str(default_workers)))
    t0 = time.time()
    logs = tempfile.mkdtemp()
    procs = [subprocess.Popen([sys.executable, script, out, "--compile", str(i), str(workers)],
                              stdout=subprocess.DEVNULL,
                              stderr=open(f"{logs}/compile-{i}.log", "w"))
             for i in range(workers)]
    for i, p in enumerate(procs):
        if p.wait():
            print(f"compile worker {i} failed:",
                  open(f"{logs}/compile-{i}.log").read()[-2000:], flush=True)
    print(f"compiled in {time.time() - t0:.0f} s with {workers} workers", flush=True)
    t1 = time.time()
    result = run(True, None)
    print(f"timed in {time.time() - t1:.0f} s", flush=True)
    return result
