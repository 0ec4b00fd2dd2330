"""embedding_dense_backward at BERT's three tables (word 30522, position 512, token type
2; 4x512 tokens, width 768, bf16) and at a long run of one index (8192 tokens of one
type), gemsops against torch, each timed eagerly and from a CUDA graph (kernel time).

    python3 .ci/emb_probe.py
"""
import torch
import triton.testing

import gemsops
from gemshal.kernel.compile import waiting

D = 768
for name, V, n, kind in [("word", 30522, 2048, "random"), ("position", 512, 2048, "position"),
                         ("token type", 2, 2048, "zeros"), ("token type", 2, 8192, "zeros")]:
    gen = torch.Generator().manual_seed(0)
    if kind == "random":
        idx = torch.randint(0, V, (n,), generator=gen)
    elif kind == "position":
        idx = torch.arange(n) % V
    else:
        idx = torch.zeros(n, dtype=torch.long)
    idx = idx.cuda()
    g = torch.randn(n, D, device="cuda", dtype=torch.bfloat16)

    def fn(g: torch.Tensor = g, idx: torch.Tensor = idx, V: int = V) -> torch.Tensor:
        return torch.ops.aten.embedding_dense_backward(g, idx, V, -1, False)

    want = fn().float()
    t_eager = triton.testing.do_bench(fn, rep=100) * 1e3
    t_graph = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
    with gemsops.use_gems():
        with waiting():
            got = fn()
        err = (got.float() - want).abs().max().item()
        g_eager = triton.testing.do_bench(fn, rep=100) * 1e3
        g_graph = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
    print(f"{name} V={V} n={n}: eager torch {t_eager:.1f} us, gemsops {g_eager:.1f}; graph "
          f"torch {t_graph:.1f} us, gemsops {g_graph:.1f} ({t_graph / g_graph:.2f}x); "
          f"max |diff| {err:.3g}", flush=True)
