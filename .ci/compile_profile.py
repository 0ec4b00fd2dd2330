"""Where a cold compile's time goes on this machine (issue 27's selftest).

Checks a few selftest cases in this process with ``GEMS_COMPILE=wait`` (every first
launch compiles on the calling thread) under cProfile, then prints the kernels
compiled, the seconds per kernel, and the functions with the most cumulative time (the
frontend, the MLIR passes, ptxas, launcher builds). Run it with empty caches:

    .ci/fresh python .ci/compile_profile.py [--ops add,mul,...] [--out PATH]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
import warnings

os.environ["GEMS_COMPILE"] = "wait"
os.environ.setdefault("GEMS_AUTOTUNE", "first")

from gemsops.selftest.cases import CASES
from gemsops.selftest.runner import check


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="add,mul,clamp,gelu_backward,sum,where,layer_norm")
    p.add_argument("--out")
    ns = p.parse_args()
    warnings.simplefilter("ignore")
    cases = [c for c in CASES if c.op in ns.ops.split(",")]
    import triton.compiler.compiler as tc

    count = [0]
    real = tc.compile

    def counted(*a: object, **k: object) -> object:
        count[0] += 1
        return real(*a, **k)

    import triton.compiler

    tc.compile = counted  # type: ignore[assignment]
    triton.compiler.compile = counted  # type: ignore[assignment]  # what JITFunction imports
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    for case in cases:
        for dtype in case.dtypes:
            check(case, dtype, examples=10, light=True)
    prof.disable()
    took = time.perf_counter() - start
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(20)
    head = (f"{len(cases)} cases, {count[0]} triton.compile calls, {took:.1f} s "
            f"({took / max(count[0], 1):.3f} s a compile)\n")
    print(head + text.getvalue())
    if ns.out:
        prof.dump_stats(ns.out)


if __name__ == "__main__":
    main()
