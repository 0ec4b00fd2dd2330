"""Negative log-likelihood loss: the aten kernels ``F.nll_loss`` and ``F.cross_entropy`` reach.

``nll_loss_forward`` gathers ``-w[t] * x[i, t]`` per row (ignored rows give 0) and, for
the mean and sum reductions, one program sums the per-row terms and weights in a fixed
order (deterministic, no atomics); ``nll_loss_backward`` writes each gradient row whole
(zeros and the target's term), so nothing needs zeroing first. The target handling and
the reduction kernel are shared with the fused :mod:`gemsops.ops.cross_entropy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.autotune import autotune
from gemsops.errors import Unsupported
from gemsops.ops.grid import cdiv
from gemsops.ops.pointwise_types import check_fp64

__all__ = ["IMPLS", "nll_loss", "nll_loss_backward", "nll_loss_forward"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TARGETS = (torch.int64, torch.uint8)
_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


@triton.jit
def _target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W: tl.constexpr,
            ACC: tl.constexpr):
    # Class targets of a block of rows: (target clamped into range, valid, weight of target).
    # Ignored rows (and rows past N) get weight 0; out-of-range targets assert in debug.
    t = tl.load(T + rows.to(tl.int64) * stride_t, mask=row_ok, other=0).to(tl.int64)
    valid = row_ok & (t != ignore_index)
    tl.device_assert(~valid | ((t >= 0) & (t < C)), "target out of bounds")
    valid = valid & (t >= 0) & (t < C)
    t = tl.where(valid, t, 0)
    if HAS_W:
        w = tl.load(W + t, mask=valid, other=0.0).to(ACC)
    else:
        w = tl.where(valid, 1.0, 0.0).to(ACC)
    return t, valid, w


@autotune("nll_loss", key=["N"])
@triton.jit
def _nll_rows_kernel(X, T, W, Loss, RowW, TotalW, N, C, stride_xn, stride_xc, stride_t,
                     ignore_index, ZERO_TOTAL: tl.constexpr, HAS_W: tl.constexpr,
                     ACC: tl.constexpr, BLOCK_M: tl.constexpr):
    # Loss[i] = -w[t_i] * X[i, t_i] (0 where ignored); RowW[i] = w[t_i]. With no reduction
    # torch reports a total weight of 0, written here by program 0.
    if ZERO_TOTAL:
        tl.store(TotalW, 0.0, mask=tl.program_id(0) == 0)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    t, valid, w = _target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W, ACC)
    x = tl.load(X + rows.to(tl.int64) * stride_xn + t * stride_xc, mask=valid, other=0.0).to(ACC)
    tl.store(Loss + rows, tl.where(valid, -w * x, 0.0).to(Loss.dtype.element_ty), mask=row_ok)
    tl.store(RowW + rows, w.to(RowW.dtype.element_ty), mask=row_ok)


@autotune("loss_reduce", key=["N"])
@triton.jit
def _reduce_kernel(Loss, RowW, Out, Denom, N, MEAN: tl.constexpr, PER_ROW: tl.constexpr,
                   ACC: tl.constexpr, BLOCK: tl.constexpr):
    # One program: Out = sum(Loss) (/ sum(RowW), or / N when PER_ROW); Denom = the divisor.
    # All rows ignored gives 0 / 0 = nan for the mean, as in torch.
    acc = tl.zeros((BLOCK,), ACC)
    wsum = tl.zeros((BLOCK,), ACC)
    for i in range(0, N, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(Loss + offs, mask=offs < N, other=0.0).to(ACC)
        wsum += tl.load(RowW + offs, mask=offs < N, other=0.0).to(ACC)
    total = tl.sum(acc, 0)
    denom = tl.sum(wsum, 0)
    if PER_ROW:
        denom = N * 1.0
    if MEAN:
        total = total / denom
    tl.store(Out, total.to(Out.dtype.element_ty))
    tl.store(Denom, denom.to(Denom.dtype.element_ty))


@autotune("nll_loss_backward", key=["C"])
@triton.jit
def _nll_bwd_kernel(G, T, W, TotalW, GI, N, C, stride_g, stride_t, ignore_index,
                    MEAN: tl.constexpr, HAS_W: tl.constexpr, ACC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    # GI[i, c] = -w[t_i] * g_i at c == t_i, else 0 (g_i: grad / total weight for the mean).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < N
    t, valid, w = _target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W, ACC)
    g = tl.load(G + rows * stride_g, mask=row_ok, other=0.0).to(ACC)
    if MEAN:
        g = g / tl.load(TotalW).to(ACC)
    v = tl.where(valid, -w * g, 0.0)
    gi = tl.where(cols[None, :] == t[:, None], v[:, None], 0.0)
    tl.store(GI + rows.to(tl.int64)[:, None] * C + cols[None, :], gi.to(GI.dtype.element_ty),
             mask=row_ok[:, None] & (cols < C)[None, :])


def _acc(dtype: torch.dtype) -> tuple[Any, torch.dtype]:
    return (tl.float64, torch.float64) if dtype == torch.float64 else (tl.float32, torch.float32)


def _check_input(x: Tensor, *others: Tensor | None) -> None:
    if x.layout != torch.strided or x.dtype not in _FLOATS:
        raise Unsupported(f"loss of a {x.layout} {x.dtype} input")
    check_fp64(x.dtype)
    for t in others:
        if t is not None and (t.device != x.device or t.layout != torch.strided):
            raise Unsupported("loss arguments on different devices or layouts")


def _weight(weight: Tensor | None, x: Tensor, C: int) -> Tensor | None:
    if weight is None:
        return None
    if weight.dtype != x.dtype or weight.numel() != C or weight.dim() != 1:
        raise Unsupported("class weight must be a [C] tensor of the input's dtype")
    return weight.contiguous()


def _class_targets(target: Tensor, R: int, C: int, ignore_index: int) -> Tensor:
    """Class targets as a flat [R] tensor, range-checked on the CPU (IndexError, as torch)."""
    if target.dtype not in _TARGETS:
        raise Unsupported(f"class targets of dtype {target.dtype}")
    flat = target if target.dim() == 1 else target.reshape(-1)
    if flat.numel() != R:
        raise Unsupported("target does not match the input's batch shape")
    if target.is_cpu and R:
        arr = flat.detach().numpy()
        bad = arr[(arr != ignore_index) & ((arr < 0) | (arr >= C))]
        if bad.size:
            raise IndexError(f"Target {int(bad[0])} is out of bounds.")
    return flat


def _rows_of(x: Tensor) -> tuple[Tensor, int, int]:
    """Logits as [R, C] (class dim last; strided view where possible), R and C."""
    if x.dim() == 0:
        raise Unsupported("a 0-d input has no class dim")
    if x.dim() == 1:
        return x.unsqueeze(0), 1, x.shape[0]
    C = x.shape[1]
    x2 = x if x.dim() == 2 else x.movedim(1, -1).reshape(-1, C)
    return x2, x2.shape[0], C


def _reduction(reduction: int | str) -> int:
    code = _REDUCTIONS.get(reduction, -1) if isinstance(reduction, str) else int(reduction)
    if code not in (0, 1, 2):
        raise Unsupported(f"reduction {reduction!r}")
    return code


_REDUCE_CONSTS: dict[tuple[bool, bool, Any], dict[str, Any]] = {}


def _reduce(loss: Tensor, roww: Tensor, out: Tensor, denom: Tensor, R: int, mean: bool,
            per_row: bool, acc: Any) -> None:
    key = (mean, per_row, acc)
    consts = _REDUCE_CONSTS.get(key)
    if consts is None:
        # One dict per key, never changed.
        consts = _REDUCE_CONSTS[key] = {"MEAN": mean, "PER_ROW": per_row, "ACC": acc}
    _reduce_kernel.launch((1,), (loss, roww, out, denom, R), consts)


def nll_loss_forward(self: Tensor, target: Tensor, weight: Tensor | None, reduction: int,
                     ignore_index: int) -> tuple[Tensor, Tensor]:
    """aten's ``nll_loss_forward``: ``-w[t] * self[i, t]`` per row, reduced.

    Args:
        self: Log-probabilities, [N, C] or [C].
        target: Class indices (int64 or uint8), [N] or 0-d.
        weight: Optional [C] class weights.
        reduction: 0 none, 1 mean (by the summed weights of non-ignored rows), 2 sum.
        ignore_index: Rows with this target contribute nothing.

    Returns:
        ``(output, total_weight)``; the mean of all-ignored rows is nan, as in torch.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs this kernel does not take.
    """
    _check_input(self, target, weight)
    red = _reduction(reduction)
    if self.dim() not in (1, 2) or target.dim() != self.dim() - 1:
        raise Unsupported("nll_loss_forward takes a [N, C] or [C] input")
    x2, R, C = _rows_of(self)
    t = _class_targets(target, R, C, int(ignore_index))
    w = _weight(weight, self, C)
    acc_tl, acc_t = _acc(self.dtype)
    dev = self.device
    total = torch.empty((), dtype=self.dtype, device=dev)
    roww = torch.empty(R, dtype=acc_t, device=dev)
    unreduced = red == 0 and self.dim() == 2
    loss = torch.empty(R, dtype=self.dtype if unreduced else acc_t, device=dev)
    with gemshal.device_guard(dev):
        _nll_rows_kernel[lambda meta: (max(1, cdiv(R, meta["BLOCK_M"])),)](
            x2, t, w if w is not None else x2, loss, roww, total, R, C, *x2.stride(),
            t.stride(0) if R else 1, int(ignore_index),
            ZERO_TOTAL=unreduced, HAS_W=w is not None, ACC=acc_tl)
        if unreduced:
            return loss, total
        # A [C] input reduces even with reduction none (torch: one term, total = its weight).
        out = torch.empty((), dtype=self.dtype, device=dev)
        _reduce(loss, roww, out, total, R, red == 1, False, acc_tl)
    return out, total


def nll_loss_backward(grad_output: Tensor, self: Tensor, target: Tensor, weight: Tensor | None,
                      reduction: int, ignore_index: int, total_weight: Tensor) -> Tensor:
    """aten's ``nll_loss_backward``: ``-w[t] * grad`` at each row's target, zeros elsewhere.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs this kernel does not take.
    """
    _check_input(self, target, weight, grad_output, total_weight)
    red = _reduction(reduction)
    if self.dim() not in (1, 2) or target.dim() != self.dim() - 1:
        raise Unsupported("nll_loss_backward takes a [N, C] or [C] input")
    _, R, C = _rows_of(self)
    t = _class_targets(target, R, C, int(ignore_index))
    w = _weight(weight, self, C)
    if red == 0 and grad_output.numel() != R:
        raise Unsupported("grad_output does not match the unreduced loss")
    stride_g = grad_output.reshape(-1).stride(0) if red == 0 and grad_output.dim() else 0
    g = grad_output.reshape(-1) if red == 0 and grad_output.dim() else grad_output
    gi = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    if R and C:
        with gemshal.device_guard(self.device):
            _nll_bwd_kernel[lambda meta: (cdiv(R, meta["BLOCK_M"]),
                                          cdiv(C, meta["BLOCK_C"]))](
                g, t, w if w is not None else gi, total_weight, gi, R, C, stride_g,
                t.stride(0), int(ignore_index), MEAN=red == 1, HAS_W=w is not None,
                ACC=_acc(self.dtype)[0])
    return gi


class _NLLLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, target: Tensor, weight: Tensor | None, red: int,
                ignore_index: int) -> Tensor:
        out, total = nll_loss_forward(x, target, weight, red, ignore_index)
        ctx.save_for_backward(x, target, weight, total)
        ctx.meta = (red, ignore_index)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, target, weight, total = ctx.saved_tensors
        red, ignore_index = ctx.meta
        gi = nll_loss_backward(grad, x, target, weight, red, ignore_index, total)
        return gi, None, None, None, None


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """``torch.nn.functional.nll_loss`` for [N, C] or [C] log-probabilities, differentiable.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs these kernels do not take.
    """
    red = _reduction(reduction)
    if torch.is_grad_enabled() and input.requires_grad:
        return _NLLLoss.apply(input, target, weight, red,
                              int(ignore_index))
    return nll_loss_forward(input, target, weight, red, int(ignore_index))[0]


IMPLS: dict[str, Callable[..., Any]] = {
    "nll_loss_forward.default": nll_loss_forward,
    "nll_loss_backward.default": nll_loss_backward,
}
