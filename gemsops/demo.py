"""The main job: a small decoder block, forward and backward, with and without gemsops.

The block is plain torch (embedding, RMSNorm, causal attention with softmax, an MLP
with SiLU, cross-entropy). It runs once on torch's own kernels and once with gemsops
serving aten ops, on the same weights and tokens, and reports the largest difference,
which aten ops gemsops served, which it handed back to torch and why, and the times.
"""

from __future__ import annotations

import copy
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import gemshal
from gemsops import registry

__all__ = ["DecoderBlock", "DemoReport", "run_demo"]


class DecoderBlock(nn.Module):
    """One pre-norm transformer block with an LM head, written in plain torch."""

    def __init__(self, vocab: int, dim: int, heads: int, hidden: int, max_seq: int) -> None:
        super().__init__()
        self.heads = heads
        # Built once, as real models do: True where a position may attend.
        causal = torch.ones(max_seq, max_seq, dtype=torch.bool).tril()
        self.register_buffer("masked", ~causal, persistent=False)
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of next-token logits against ``targets``."""
        batch, seq = tokens.shape
        x = self.embed(tokens)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        shape = (batch, seq, self.heads, -1)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        masked: torch.Tensor = self.masked  # type: ignore[assignment]  # a registered buffer
        scores = scores.masked_fill(masked[:seq, :seq], float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, -1))
        x = x + self.down(F.silu(self.up(self.norm2(x))))
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(batch * seq, -1), targets.reshape(-1))


class _AtenLog(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts every aten overload that reaches a kernel (views and metadata ops left out)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # Calls gemsops makes itself (allocations inside a fused op) are not the block's.
        if not func.is_view and func.namespace == "aten" and not registry.in_gemsops():
            name = func.name().split("::", 1)[1]
            self.calls[name if "." in name else f"{name}.default"] += 1
        return func(*args, **(kwargs or {}))


# Why the block's remaining aten ops stay with torch.
NOT_SERVED_WHY = {
    "_unsafe_view.default": "a reshape under another name: metadata, no kernel",
    "ones_like.default": "composite: torch allocates, and gemsops serves the fill_ it calls",
    "empty_like.default": "allocation only",
}


@attrs.frozen
class DemoReport:
    """What the demo measured."""

    device: str
    loss_torch: float
    loss_gemsops: float
    max_grad_diff: float
    aten_ops: dict[str, int]
    served: dict[str, int]
    handed_back: dict[str, list[str]]
    not_implemented: list[str]
    seconds_torch: float
    seconds_gemsops: float
    seconds_first: float
    compiled: bool = True


def _step(model: DecoderBlock, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss: torch.Tensor = model(tokens, targets)
    loss.backward()  # type: ignore[no-untyped-call]
    return loss.detach()


def _timed(fn: Callable[[], torch.Tensor], sync: Callable[[], None]) -> tuple[torch.Tensor, float]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def run_demo(*, batch: int, seq: int, vocab: int, dim: int, heads: int, hidden: int) -> DemoReport:
    """Run the block with torch's kernels and with gemsops; compare and count."""
    dev = gemshal.current_device()
    torch.manual_seed(0)
    base = DecoderBlock(vocab, dim, heads, hidden, seq).to(dev.torch_device)
    ours = copy.deepcopy(base)
    tokens = torch.randint(0, vocab, (batch, seq), device=dev.torch_device)
    targets = torch.randint(0, vocab, (batch, seq), device=dev.torch_device)
    module = gemshal.device_module()

    def sync() -> None:
        if not dev.interpreter:
            module.synchronize()

    _step(base, tokens, targets)  # warm-up: allocator and torch's own kernels
    loss_ref, t_ref = _timed(lambda: _step(base, tokens, targets), sync)
    with registry.use_gems():
        # Warm-up: compiles (and on a GPU, tunes) every gemsops kernel once.
        _, t_first = _timed(lambda: _step(ours, tokens, targets), sync)
        with registry.record() as rec:
            loss_ours, t_ours = _timed(lambda: _step(ours, tokens, targets), sync)
        log = _AtenLog()
        with log:
            _step(ours, tokens, targets)
    diffs = [
        (p.grad - q.grad).abs().max().item()
        for p, q in zip(base.parameters(), ours.parameters(), strict=True)
        if p.grad is not None and q.grad is not None
    ]
    served_or_back = set(rec.served) | {op for op, _ in rec.fallbacks}
    not_implemented = sorted(op for op in log.calls if op not in served_or_back)
    return DemoReport(
        device=f"{dev.torch_device} ({dev.vendor.display_name}, {dev.name})",
        loss_torch=float(loss_ref),
        loss_gemsops=float(loss_ours),
        max_grad_diff=max(diffs, default=0.0),
        aten_ops=dict(sorted(log.calls.items())),
        served=dict(sorted(rec.served.items())),
        handed_back=rec.fallback_ops(),
        not_implemented=not_implemented,
        seconds_torch=t_ref,
        seconds_gemsops=t_ours,
        seconds_first=t_first,
        compiled=not dev.interpreter,
    )


def print_report(report: DemoReport) -> None:
    """Print the demo's findings as a short readable report."""
    print(f"gemsops demo on {report.device}")
    print(f"  loss            torch {report.loss_torch:.6f}   gemsops {report.loss_gemsops:.6f}")
    print(f"  max |loss diff| {abs(report.loss_torch - report.loss_gemsops):.3e}")
    print(f"  max |grad diff| {report.max_grad_diff:.3e}")
    print(
        f"  step time       torch {report.seconds_torch * 1e3:.1f} ms   "
        f"gemsops {report.seconds_gemsops * 1e3:.1f} ms"
    )
    what = "compiling and tuning its kernels" if report.compiled else "the interpreter's warm-up"
    print(f"  first gemsops step ({what}) {report.seconds_first:.1f} s")
    print(f"served by gemsops ({len(report.served)} aten ops):")
    for op, n in report.served.items():
        print(f"  {op:<40} {n} call(s)")
    print(f"handed back to torch ({len(report.handed_back)}):")
    for op, reasons in report.handed_back.items():
        print(f"  {op:<40} {'; '.join(reasons)}")
    print(f"not implemented by gemsops, run by torch ({len(report.not_implemented)}):")
    for op in report.not_implemented:
        print(f"  {op:<40} {NOT_SERVED_WHY.get(op, 'no gemsops kernel yet')}")
