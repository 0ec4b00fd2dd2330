"""``gemsops bench --cold``: the model case's first step in fresh processes.

Three fresh Python processes run one training step of the model case
(:func:`gemsops.bench_model.run_once`) and report its wall time, synchronized:

* ``torch``: torch's own kernels, for scale;
* ``gemsops cold``: under ``use_gems()`` with an empty Triton cache (a new
  ``TRITON_CACHE_DIR``): every kernel the step meets is compiled in the background
  while torch serves its calls (and, with ``GEMS_AUTOTUNE=1`` or ``all``, benchmarked on
  the way);
* ``gemsops warm``: the same again with the cache the cold run filled: what a second
  run of a user's script pays;
* ``gemsops cold, wait``: cold again (another empty cache) with ``GEMS_COMPILE=wait``:
  every kernel compiled before its first launch, as Triton does.

The two default (background-compile) gemsops runs also report when the compiles the
step started were done, and the time of the step after that.

Each process also reports the time to build the model and its inputs, so import and
set-up are told apart from the step. Without an accelerator the tiny config runs on
the interpreter (where there is no compile cache: the two gemsops runs cost the same).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["CHILD", "measure_cold", "report"]

CHILD = """
import json, sys, time
start = time.perf_counter()
import torch, gemshal, gemsops
from gemsops import bench_model
dev = gemshal.current_device()
cfg = bench_model.TINY_CONFIG if dev.interpreter else bench_model.GPU_CONFIG
sync = (lambda: None) if dev.interpreter else gemshal.device_module().synchronize
imported = time.perf_counter()
side = sys.argv[1]
ctx = gemsops.use_gems() if side == "gemsops" else __import__("contextlib").nullcontext()
out = {"import_s": imported - start}
with ctx:
    t = time.perf_counter()
    bench_model.run_once(cfg)
    sync()
    out["step_s"] = time.perf_counter() - t
    if side == "gemsops":
        from gemshal.kernel.compile import wait_compiles
        wait_compiles()
        out["compiled_s"] = time.perf_counter() - t
        t = time.perf_counter()
        bench_model.run_once(cfg)
        sync()
        out["next_step_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def _run(side: str, cache: str, timeout: float, compile_mode: str = "background") -> dict[str, Any]:
    env = {**os.environ, "TRITON_CACHE_DIR": cache, "GEMS_COMPILE": compile_mode}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, side],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {done.returncode}: {last[:300]}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": "the child printed no result"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure_cold(timeout: float = 600.0) -> dict[str, Any]:
    """The fresh-process runs; ``{side: {import_s, step_s, ...} or {error}}``."""
    with tempfile.TemporaryDirectory(prefix="gemsops-cold-") as cache:
        return {
            "torch": _run("torch", tempfile.mkdtemp(dir=cache), timeout),
            "gemsops cold": _run("gemsops", os.path.join(cache, "g"), timeout),
            "gemsops warm": _run("gemsops", os.path.join(cache, "g"), timeout),
            "gemsops cold, wait": _run("gemsops", os.path.join(cache, "w"), timeout, "wait"),
        }


def report(result: dict[str, Any], json_path: str | None = None) -> None:
    """Print one line per run; write JSON when a path is given."""
    print("first step of the model case in a fresh process (s)")
    for side, row in result.items():
        if "error" in row:
            print(f"  {side:<14} failed: {row['error']}")
        else:
            extra = ""
            if "compiled_s" in row:
                extra = (f"; its compiles done after {row['compiled_s']:.2f}, the next step "
                         f"{row['next_step_s']:.2f}")
            print(f"  {side:<20} step {row['step_s']:8.2f}   (import and set-up "
                  f"{row['import_s']:.2f}{extra})")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
