"""Does leaving some of the tiled pointwise kernel's integer arguments unspecialized cost
kernel time? (The selftest compiles one kernel per specialization; see issue 27.)

For each broadcast or mixed-layout case, the launch gemsops makes is recorded, then the
same launch is timed (CUDA-graph replay, median) through three JITFunctions built from
the one kernel body: as shipped, with the row count and outer sizes unspecialized, and
with the outer strides unspecialized too. Each variant's first launch is timed as its
compile. Prints one row per case and dtype.

    python .ci/spec_ab.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import triton
import triton.testing

import gemsops
from gemshal.kernel import kernel, recording
from gemsops.ops.pointwise import codegen

SIZES = ["rows", "d1", "d2", "d3"]
STRIDES = [f"s{o}{i}" for o in "oabc" for i in range(1, 5)]
VARIANTS = {"shipped": [], "sizes": SIZES, "sizes+strides": SIZES + STRIDES}


def _cases(dtype: torch.dtype) -> list[tuple[str, Any]]:
    d = "cuda"

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=d, dtype=dtype)

    x, b = t(8192, 4096), t(4096)
    x3, b3 = t(4, 2048, 5632), t(5632)
    sq = t(4096, 4096)
    s = t(16384, 1)
    y = t(16384, 4096)
    m, mask = t(4, 16, 2048, 2048), t(4, 1, 1, 2048)
    o, ob = t(8191, 4095), t(4095)
    return [
        ("bias 8192x4096", lambda: torch.add(x, b)),
        ("bias 4x2048x5632", lambda: torch.add(x3, b3)),
        ("transposed 4096^2", lambda: torch.add(sq.t(), sq)),
        ("row scale 16384x4096", lambda: torch.mul(y, s)),
        ("mask 4x16x2048^2", lambda: torch.add(m, mask)),
        ("odd 8191x4095", lambda: torch.add(o, ob)),
    ]


def _launch(fn: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    with gemsops.use_gems(), recording() as rec:
        fn()
    tiled = [launch for launch in rec.launches if launch[0] is codegen._tiled_kernel]
    assert tiled, "no tiled launch"
    _kern, grid, args, kwargs = tiled[-1]
    return grid, args, kwargs


def _variant(nospec: list[str]) -> Any:
    # The shipped kernel's body and tuning entry; only do_not_specialize differs, so
    # gemshal chooses the same config for each variant.
    jit = triton.jit(codegen._tiled_kernel.fn.fn, do_not_specialize=["SIZE_CLASS", *nospec])
    return kernel("pointwise", key=["SIZE_CLASS", "OP"], restore_value=["out"],
                  prune=codegen._prune_small)(jit)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    ns = p.parse_args()
    variants = {name: _variant(nospec) for name, nospec in VARIANTS.items()}
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for name, fn in _cases(dtype):
            grid, args, kwargs = _launch(fn)
            row: dict[str, Any] = {"case": name, "dtype": str(dtype)[6:]}
            for variant, kern in variants.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                kern.launch(grid, args, kwargs)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0

                def step(kern: Any = kern, grid: Any = grid, args: Any = args,
                         kwargs: Any = kwargs) -> None:
                    kern.launch(grid, args, kwargs)

                ms = triton.testing.do_bench_cudagraph(step, rep=50)
                row[variant] = {"us": round(ms * 1000, 2), "compile_s": round(compile_s, 2)}
            base = row["shipped"]["us"]
            print(f"{name:<22} {row['dtype']:<9} "
                  + "  ".join(f"{v} {row[v]['us']:8.1f} us ({base / row[v]['us']:.3f}x, "
                              f"{row[v]['compile_s']:.2f} s)" for v in VARIANTS), flush=True)
            rows.append(row)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
