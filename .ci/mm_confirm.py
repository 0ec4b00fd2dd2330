"""The weight-gradient products of a 768-wide linear as a user's torch.mm reaches them
(gemsops on, compiles waited for), beside torch, in one process, eager and replayed from
a CUDA graph (kernel time): the split-K rule's before/after check (run once per tree).

    python3 .ci/mm_confirm.py LABEL
"""
import sys

import torch
import triton.testing

import gemsops
from gemshal.kernel.compile import waiting

rows = []
for n, k, t in [(768, 768, 8192), (768, 768, 6304), (3072, 768, 8192), (2304, 768, 8192)]:
    g = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    a = g.t()
    want = a.float() @ x.float()

    def run(a: torch.Tensor = a, x: torch.Tensor = x) -> torch.Tensor:
        return torch.mm(a, x)

    torch_us = triton.testing.do_bench(run, rep=100) * 1e3
    torch_graph = triton.testing.do_bench_cudagraph(run, rep=100) * 1e3
    with gemsops.use_gems():
        with waiting():
            got = torch.mm(a, x)
        ok = torch.allclose(got.float(), want, atol=1.0, rtol=0.05)
        gems_us = triton.testing.do_bench(run, rep=100) * 1e3
        gems_graph = triton.testing.do_bench_cudagraph(run, rep=100) * 1e3
    print(f"{sys.argv[1]}: wgrad {n}x{k} K{t}: eager torch {torch_us:.1f} us, gemsops "
          f"{gems_us:.1f} us ({torch_us / gems_us:.2f}x); graph replay torch {torch_graph:.1f} "
          f"us, gemsops {gems_graph:.1f} us ({torch_graph / gems_graph:.2f}x); matches torch: "
          f"{ok}", flush=True)
