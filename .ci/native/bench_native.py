"""Host time of the native fast-path prototype (.ci/native/native_add.cpp) on a GPU.

    python3 .ci/native/bench_native.py [--calls 20000]

In one process, on one 1024-element float32 add (20,000 calls after warm-up, one
synchronize per repeat, median of 5 repeats, us per call): torch's own kernel; gemsops'
Python path (``use_gems()``); then, after building and loading the prototype (which
overrides aten::add.Tensor at the CUDA key for the rest of the process), the C++
kernel launching the same Triton kernel, and the C++ kernel allocating only. Prints
one JSON line, with the extension's build time and a correctness check.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    for _ in range(500):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return round(statistics.median(times), 2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    calls = p.parse_args().calls
    x = torch.randn(1024, device="cuda")
    y = torch.randn_like(x)
    want = x.cpu() + y.cpu()
    out: dict[str, object] = {"case": "add 1024 float32", "calls": calls}
    out["torch_us"] = per_call_us(lambda: torch.add(x, y), calls)
    import gemsops
    from gemshal.kernel.compile import waiting

    with waiting(), gemsops.use_gems():  # gemsops' kernel from the first call
        out["gemsops_python_us"] = per_call_us(lambda: torch.add(x, y), calls)
    out["torch_again_us"] = per_call_us(lambda: torch.add(x, y), calls)

    from torch.utils.cpp_extension import load

    t = time.perf_counter()
    load(name="gemsops_native_add", sources=[str(HERE / "native_add.cpp")], with_cuda=True,
         is_python_module=False, verbose=False)
    out["build_s"] = round(time.perf_counter() - t, 1)

    compiled = add_kernel.warmup(x, y, x, x.numel(), BLOCK=1024, grid=(1,))
    compiled._init_handles()
    ptx = compiled.asm["ptx"]
    entry = re.search(r"\.entry\s+\w+\s*\((.*?)\)", ptx, re.S)
    assert entry is not None, "no .entry in the PTX"
    nparams = entry.group(1).count(".param")
    out["kernel_params"] = nparams
    meta = compiled.metadata
    torch.ops.gemsops_native.set_add_kernel(int(compiled.function), int(meta.num_warps),
                                            int(meta.shared), 1024, nparams, 0)
    got = torch.add(x, y)
    torch.cuda.synchronize()
    out["native_correct"] = bool(torch.equal(got.cpu(), want))
    half = torch.add(x.bfloat16(), y.bfloat16())  # not the fast case: torch's add.out
    half_want = x.cpu().bfloat16() + y.cpu().bfloat16()
    out["other_dtype_correct"] = bool(torch.equal(half.cpu(), half_want))
    out["native_us"] = per_call_us(lambda: torch.add(x, y), calls)
    torch.ops.gemsops_native.set_add_kernel(int(compiled.function), int(meta.num_warps),
                                            int(meta.shared), 1024, nparams, 1)
    out["native_alloc_only_us"] = per_call_us(lambda: torch.add(x, y), calls)
    torch_best = min(out["torch_us"], out["torch_again_us"])  # type: ignore[type-var]
    out["native_over_torch"] = round(out["native_us"] / torch_best, 2)  # type: ignore[operator]
    out["python_over_torch"] = round(out["gemsops_python_us"] / torch_best, 2)  # type: ignore[operator]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
