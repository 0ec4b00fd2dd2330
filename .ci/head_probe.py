"""A language-model head's three products at GPT-2's and BERT's vocabularies (50257 and
30522 columns: rows not 16-byte aligned) and Llama's aligned 128256, replayed from a CUDA
graph (kernel time), in one process: torch; gemsops' portable tile kernel (the route of
unaligned products); the persistent kernel with the unaligned matrix through pointers
(``persistent.POINTER_OPERANDS`` on); and the persistent kernel at
each config of its tuning entry (the best one, to see whether a table row would help).
Then ViT-B/16's attention products at 32 images (bmm, 384 heads of 197 tokens by 64:
rows of 197 elements are not 16-byte aligned), the compiled ViT's 10 ms loss with
matmuls kept (docs/compile.md), and 768-wide decode linears: torch against both routes
and against the portable kernel with SPLIT_K a category of its table lookup.

    python3 .ci/head_probe.py [--quick]

``--quick``: BERT's heads only, and no sweep of every config.

The native replay is off and the replay memo is cleared between routes, so each route's
time is its own kernel's.
"""
import os
import sys

os.environ["GEMS_NATIVE"] = "0"  # a native recipe would replay the route it first saw

import torch
import triton.testing

import gemshal
import gemshal.tune
import gemsops
from gemshal.kernel.compile import waiting
from gemsops.ops.matmul import mm as MM
from gemsops.ops import replay
from gemsops.ops.matmul import persistent

QUICK = "--quick" in sys.argv
BF16 = torch.bfloat16
CASES = [("bert", 2048, 30522), ("bert", 8192, 30522), ("gpt2", 8192, 50257),
         ("llama1b", 8192, 128256)]
if QUICK:
    CASES = CASES[:2]


def graph_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3


def products(t: int, vocab: int, h: int = 768):
    x = torch.randn(t, h, device="cuda", dtype=BF16)
    w = torch.randn(vocab, h, device="cuda", dtype=BF16) / h ** 0.5
    dy = torch.randn(t, vocab, device="cuda", dtype=BF16) / vocab ** 0.5
    return [("fwd", x, w.t()), ("dx", dy, w), ("dw", dy.t(), x)]


def with_categories(on: bool) -> None:
    """The portable kernel's table lookup with SPLIT_K a category (on) or a size (off)."""
    MM._mm_kernel.categories = frozenset({"SPLIT_K"} if on else ())
    gemshal.tune.clear_cache()  # a new tuning generation: the kernel chooses again
    replay.clear()  # the replay memo keeps the route it first saw


def routes(run, want, torch_us, which) -> list[str]:
    """``run()`` under use_gems by each (label, pointer operands, SPLIT_K category) route:
    its graph-replay time against torch's, and whether it matches ``want``."""
    out = []
    tol = 0.05 + 1e-2 * want.float().abs().max().item()
    with gemsops.use_gems():
        for label, pointers, categories in which:
            persistent.POINTER_OPERANDS = pointers
            with_categories(categories)
            with waiting():
                got = run()
            ok = (got.float() - want.float()).abs().max().item() < tol
            us = graph_us(run)
            out.append(f"{label} {us:.1f} ({torch_us / us:.2f}x{'' if ok else ' WRONG'})")
    persistent.POINTER_OPERANDS = False
    with_categories(False)
    return out


sweeps = []  # (label, a, b, want, torch_us): every config, after the other products
for model, t, vocab in CASES:
    h = 2048 if model.startswith("llama") else 768
    for what, a, b in products(t, vocab, h):
        want = (a.float() @ b.float()).to(BF16)

        def run(a=a, b=b):
            return torch.mm(a, b)

        torch_us = graph_us(run)
        row = [f"{model} {what} {a.shape[0]}x{b.shape[1]}x{a.shape[1]}: torch {torch_us:.1f}"]
        row += routes(run, want, torch_us, (("portable", False, False), ("pointers", True, False)))
        sweeps.append((f"{model} {what}", a, b, want, torch_us))
        print("; ".join(row), flush=True)


# ViT-B/16, 32 images: scores = q @ k^T and out = p @ v, per head (batch 32 x 12 heads);
# and 768-wide decode linears (4 and 16 rows). The portable kernel's picks there come
# from rows of another SPLIT_K (docs/performance.md, twenty-fourth session); "category"
# is the same route with SPLIT_K declared a category (only rows of the call's split).
q = torch.randn(384, 197, 64, device="cuda", dtype=BF16)
k = torch.randn(384, 197, 64, device="cuda", dtype=BF16)
p = torch.softmax(torch.randn(384, 197, 197, device="cuda", dtype=BF16), -1)
w768 = torch.randn(768, 768, device="cuda", dtype=BF16) / 768 ** 0.5
cases = [("vit scores", q, k.transpose(1, 2)), ("vit p@v", p, k),
         ("vit dp", q, k.transpose(1, 2).contiguous()), ("vit dv", p.transpose(1, 2), q)]
cases += [(f"decode {m}x768x768", torch.randn(m, 768, device="cuda", dtype=BF16), w768.t())
          for m in (4, 16)]
for what, a, b in cases:
    want = (a.float() @ b.float()).to(BF16)

    def run(a=a, b=b):
        return torch.bmm(a, b) if a.dim() == 3 else torch.mm(a, b)

    torch_us = graph_us(run)
    row = [f"{what} {tuple(a.shape)}@{tuple(b.shape)}: torch {torch_us:.1f}"]
    row += routes(run, want, torch_us, (("portable", False, False), ("category", False, True),
                                        ("pointers", True, False)))
    print("; ".join(row), flush=True)


# Every config of the persistent entry where a head's matrix goes through pointers (the
# best one says whether a table row would help); skipped with --quick.
persistent.POINTER_OPERANDS = True
for label, a, b, want, torch_us in [] if QUICK else sweeps:
    row = [f"{label} configs"]
    with gemsops.use_gems():
        c = torch.empty_like(want)
        grid, args, consts = persistent.plan(a, b, c, None, 1.0, 0.0)
        # Every config only where a matrix goes through pointers (Llama's aligned
        # head is the reference; its configs are the tables' business).
        if persistent.eligible(a, b, c) and not all(
                consts[k] for k in ("A_DESC", "B_DESC", "C_DESC")):
            kern = persistent._mm_persistent_kernel
            gemshal.ensure_scratch_allocator()
            best = None
            for config in kern.configs_for_current_device():
                kw = {**consts, **config.to_triton().all_kwargs()}
                try:
                    fn = kern.fn
                    def go(fn=fn, kw=kw):
                        fn[grid](*args, **kw)
                    go()
                    us = graph_us(go)
                except Exception as exc:  # a config that does not fit: say so
                    row.append(f"[{config}: {type(exc).__name__}]")
                    continue
                if best is None or us < best[0]:
                    best = (us, str(config))
            if best:
                row.append(f"best config {best[0]:.1f} ({torch_us / best[0]:.2f}x) {best[1]}")

    print("; ".join(row), flush=True)
persistent.POINTER_OPERANDS = False
