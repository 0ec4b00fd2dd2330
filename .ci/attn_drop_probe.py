"""Attention with dropout at BERT's and GPT-2's training shapes: each kernel's device
time (the profiler, 10 forward + backward calls), gemsops against torch's SDPA, with
dropout 0 and 0.1, so the cost of regenerating the dropout mask shows per kernel.

    python3 .ci/attn_drop_probe.py [LABEL]

Cases (bf16, q/k/v as [B, L, H, D] projections seen as [B, H, L, D], as HF models hand
them): the attention of `.ci/steps.py`'s BERT step, 4x12x512x64 with a boolean padding
mask [B, 1, 1, L] (the last quarter of the keys masked), and of its GPT-2 step,
4x12x512x64 causal; and the model-shape suite's BERT-base, 16x12x512x64 with that mask.
One line per case, side and dropout: the total of the kernels' microseconds a call,
then the largest five.
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
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run, tiny shapes


CASES = {"bert": (4, False, True), "gpt2": (4, True, False), "bert-b16": (16, False, True)}


def _case(name: str) -> tuple[list[torch.Tensor], torch.Tensor | None, bool]:
    gen = torch.Generator(device=DEV).manual_seed(0)
    B, causal, masked = CASES[name]
    L, H, D = (512, 12, 64) if DEV == "cuda" else (32, 2, 16)
    B = B if DEV == "cuda" else 1
    mask = None
    if masked:
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device=DEV)
        mask[..., L - L // 4:] = False
    qkv = [torch.randn(B, L, H, D, device=DEV, dtype=torch.bfloat16, generator=gen)
           .transpose(1, 2).requires_grad_() for _ in range(3)]
    return qkv, mask, causal


def _run(qkv: list[torch.Tensor], mask: torch.Tensor | None, causal: bool, p: float,
         grad: torch.Tensor) -> None:
    out = F.scaled_dot_product_attention(*qkv, attn_mask=mask, dropout_p=p, is_causal=causal)
    out.backward(grad)


def _kernels(fn: object) -> dict[str, float]:
    activity = ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(CALLS):
            fn()  # type: ignore[operator]
        if DEV == "cuda":
            torch.cuda.synchronize()
    got: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        dt = (getattr(ev, "self_device_time_total", 0.0) if DEV == "cuda"
              else ev.self_cpu_time_total) or 0.0
        if dt > 0:
            got[ev.key[:48]] += dt / CALLS
    return got


for name in CASES:
    qkv, mask, causal = _case(name)
    grad = torch.randn_like(qkv[0])
    for p in (0.0, 0.1):
        for side in ("torch", "gemsops"):
            ctx = gemsops.use_gems() if side == "gemsops" else contextlib.nullcontext()
            with ctx:
                with waiting():
                    for _ in range(3):
                        _run(qkv, mask, causal, p, grad)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                got = _kernels(functools.partial(_run, qkv, mask, causal, p, grad))
            for t in qkv:
                t.grad = None
            top = sorted(got.items(), key=lambda kv: -kv[1])[:5]
            parts = ", ".join(f"{k.split('(')[0][:40]} {v:.1f}" for k, v in top)
            print(f"{LABEL} {name} p={p} {side}: total {sum(got.values()):.1f} us | {parts}",
                  flush=True)
