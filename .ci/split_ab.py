"""Reductions whose lines are long and few (full sums, a few long rows, a tall narrow
sum(dim=0)) beside torch, with the long-line split rule or without it (``--old``: small
problems never split, as before 2026-12-06). Kernel time from CUDA-graph replay and eager
time from ``triton.testing.do_bench``, medians; one JSON line per case.

    GEMS_COMPILE=wait python3 .ci/split_ab.py [--old]
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import triton.testing

import gemsops
from gemsops.ops.rowwise import layout

p = argparse.ArgumentParser()
p.add_argument("--old", action="store_true", help="no long-line split of small problems")
a = p.parse_args()
if a.old:
    layout.LONG_LINE = 1 << 62


def graph_ms(fn: Callable[[], object]) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    return float(triton.testing.do_bench(g.replay)) / 10


gen = torch.Generator(device="cuda").manual_seed(0)
f32 = {s: torch.randn(s, device="cuda", generator=gen) for s in
       [(2048 * 1024,), (4, 512, 1024), (16384,), (262144,), (8, 131072), (1 << 20, 2), (3000000,)]}
bf16 = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
mask = torch.ones(4, 512, device="cuda", dtype=torch.bool)
cases: list[tuple[str, Callable[[], object]]] = [
    ("sum() f32 2M", lambda: f32[(2048 * 1024,)].sum()),
    ("mean() f32 4x512x1024", lambda: f32[(4, 512, 1024)].mean()),
    ("sum() f32 16384", lambda: f32[(16384,)].sum()),
    ("sum() f32 256K", lambda: f32[(262144,)].sum()),
    ("amax() f32 3M", lambda: f32[(3000000,)].amax()),
    ("argmax() f32 3M", lambda: f32[(3000000,)].argmax()),
    ("sum(-1) f32 8x131072", lambda: f32[(8, 131072)].sum(-1)),
    ("sum(0) f32 1Mx2", lambda: f32[(1 << 20, 2)].sum(0)),
    ("cumsum f32 256K", lambda: f32[(262144,)].cumsum(0)),
    ("sum() bf16 4x512x1024", lambda: bf16.sum()),
    ("sum(-1) f32 4x512x1024 (norm row)", lambda: f32[(4, 512, 1024)].sum(-1, keepdim=True)),
    ("all() bool 4x512", lambda: mask.all()),
]
def run(label: str, fn: Callable[[], object]) -> None:
    ref: torch.Tensor = fn()  # type: ignore[assignment]
    t_eager, t_graph = triton.testing.do_bench(fn), graph_ms(fn)
    with gemsops.use_gems():
        with gemsops.record() as rec:
            out: torch.Tensor = fn()  # type: ignore[assignment]
        torch.cuda.synchronize()
        ok = bool(torch.allclose(out.float(), ref.float(), rtol=1e-3, atol=1e-2))
        g_eager, g_graph = triton.testing.do_bench(fn), graph_ms(fn)
    print(json.dumps({"case": label, "rule": "old" if a.old else "new", "torch_graph_us": round(t_graph * 1e3, 1),
                      "gems_graph_us": round(g_graph * 1e3, 1), "torch_eager_us": round(t_eager * 1e3, 1),
                      "gems_eager_us": round(g_eager * 1e3, 1), "close": ok,
                      "handed_back": sorted(str(k) for k in rec.fallbacks)}), flush=True)


for label, fn in cases:
    try:
        run(label, fn)
    except Exception as exc:  # one case's failure (a capture, say) must not stop the rest
        print(json.dumps({"case": label, "error": repr(exc)[:300]}), flush=True)
