"""Attention with dropout at BERT's and GPT-2's training shapes: each kernel's device
time (the profiler, 10 forward + backward calls), gemsops against torch's SDPA, with
dropout 0 and 0.1, so the cost of regenerating the dropout mask shows per kernel.

    python3 .ci/attn_drop_probe.py [LABEL]

Cases (bf16, q/k/v as [B, L, H, D] projections seen as [B, H, L, D], as HF models hand
them): BERT-base 16x12x512x64 with a boolean padding mask [B, 1, 1, L] (the last 64
keys of every other sequence masked), GPT-2 8x12x1024x64 causal. One line per case,
side and dropout: the kernels' microseconds a call, then the total.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import gemsops
from gemshal.kernel.compile import waiting

LABEL = sys.argv[1] if len(sys.argv) > 1 else "tree"
CALLS = 10
DEV = "cuda"


def _case(name: str) -> tuple[list[torch.Tensor], torch.Tensor | None, bool]:
    gen = torch.Generator(device=DEV).manual_seed(0)
    if name == "bert":
        B, L, H, D, causal = 16, 512, 12, 64, False
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device=DEV)
        mask[::2, ..., L - 64:] = False
    else:
        B, L, H, D, causal = 8, 1024, 12, 64, True
        mask = None
    qkv = [torch.randn(B, L, H, D, device=DEV, dtype=torch.bfloat16, generator=gen)
           .transpose(1, 2).requires_grad_() for _ in range(3)]
    return qkv, mask, causal


def _run(qkv: list[torch.Tensor], mask: torch.Tensor | None, causal: bool, p: float,
         grad: torch.Tensor) -> None:
    out = F.scaled_dot_product_attention(*qkv, attn_mask=mask, dropout_p=p, is_causal=causal)
    out.backward(grad)


def _kernels(fn: object) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()  # type: ignore[operator]
        torch.cuda.synchronize()
    got: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        dt = getattr(ev, "self_device_time_total", 0.0) or 0.0
        if dt > 0:
            got[ev.key[:48]] += dt / CALLS
    return got


for name in ("bert", "gpt2"):
    qkv, mask, causal = _case(name)
    grad = torch.randn_like(qkv[0])
    for p in (0.0, 0.1):
        for side in ("torch", "gemsops"):
            ctx = gemsops.use_gems() if side == "gemsops" else contextlib.nullcontext()
            with ctx:
                with waiting():
                    for _ in range(3):
                        _run(qkv, mask, causal, p, grad)
                torch.cuda.synchronize()
                got = _kernels(functools.partial(_run, qkv, mask, causal, p, grad))
            for t in qkv:
                t.grad = None
            top = sorted(got.items(), key=lambda kv: -kv[1])[:5]
            parts = ", ".join(f"{k.split('(')[0][:40]} {v:.1f}" for k, v in top)
            print(f"{LABEL} {name} p={p} {side}: total {sum(got.values()):.1f} us | {parts}",
                  flush=True)
