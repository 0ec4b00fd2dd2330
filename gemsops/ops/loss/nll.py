"""Negative log-likelihood loss: the aten kernels ``F.nll_loss`` and ``F.cross_entropy`` reach.

``nll_loss_forward`` gathers ``-w[t] * x[i, t]`` per row (ignored rows give 0) and, for
the mean and sum reductions, one program sums the per-row terms and weights in a fixed
order (deterministic, no atomics); ``nll_loss_backward`` writes each gradient row whole
(zeros and the target's term), so nothing needs zeroing first. The target handling and
the reduction kernel (:mod:`~gemsops.ops.loss.inputs`, :mod:`~gemsops.ops.loss.reduction`)
are shared with the fused :mod:`~gemsops.ops.loss.cross_entropy`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import acc_dtype, tl_acc
from gemsops.ops.grid import cdiv
from gemsops.ops.higher_order import gems_backward, higher_order, torch_gradients
from gemsops.ops.loss.inputs import (
    check_input,
    class_targets,
    class_weight,
    load_target,
    rows_of,
)
from gemsops.ops.loss.reduction import reduce_rows, reduction_code

__all__ = ["nll_loss", "nll_loss_backward", "nll_loss_forward"]


@kernel("nll_loss", key=["N"])
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
    t, valid, w = load_target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W, ACC)
    x = tl.load(X + rows.to(tl.int64) * stride_xn + t * stride_xc, mask=valid, other=0.0).to(ACC)
    tl.store(Loss + rows, tl.where(valid, -w * x, 0.0).to(Loss.dtype.element_ty), mask=row_ok)
    tl.store(RowW + rows, w.to(RowW.dtype.element_ty), mask=row_ok)


@kernel("nll_loss_backward", key=["C"])
@triton.jit
def _nll_bwd_kernel(G, T, W, TotalW, GI, N, C, stride_g, stride_t, ignore_index,
                    MEAN: tl.constexpr, HAS_W: tl.constexpr, ACC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    # GI[i, c] = -w[t_i] * g_i at c == t_i, else 0 (g_i: grad / total weight for the mean).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < N
    t, valid, w = load_target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W, ACC)
    g = tl.load(G + rows * stride_g, mask=row_ok, other=0.0).to(ACC)
    if MEAN:
        g = g / tl.load(TotalW).to(ACC)
    v = tl.where(valid, -w * g, 0.0)
    gi = tl.where(cols[None, :] == t[:, None], v[:, None], 0.0)
    tl.store(GI + rows.to(tl.int64)[:, None] * C + cols[None, :], gi.to(GI.dtype.element_ty),
             mask=row_ok[:, None] & (cols < C)[None, :])


@op("nll_loss_forward.default")
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
    check_input(self, target, weight)
    red = reduction_code(reduction)
    if self.dim() not in (1, 2) or target.dim() != self.dim() - 1:
        raise Unsupported("nll_loss_forward takes a [N, C] or [C] input")
    x2, R, C = rows_of(self)
    t = class_targets(target, R, C, int(ignore_index))
    w = class_weight(weight, self, C)
    acc_tl, acc_t = tl_acc(self.dtype), acc_dtype(self.dtype)
    dev = self.device
    total = torch.empty((), dtype=self.dtype, device=dev)
    roww = torch.empty(R, dtype=acc_t, device=dev)
    unreduced = red == 0 and self.dim() == 2
    loss = torch.empty(R, dtype=self.dtype if unreduced else acc_t, device=dev)
    _nll_rows_kernel[lambda meta: (max(1, cdiv(R, meta["BLOCK_M"])),)](
        x2, t, w if w is not None else x2, loss, roww, total, R, C, *x2.stride(),
        t.stride(0) if R else 1, int(ignore_index),
        ZERO_TOTAL=unreduced, HAS_W=w is not None, ACC=acc_tl)
    if unreduced:
        return loss, total
    # A [C] input reduces even with reduction none (torch: one term, total = its weight).
    out = torch.empty((), dtype=self.dtype, device=dev)
    reduce_rows(loss, roww, out, total, R, red == 1, False, acc_tl)
    return out, total


@op("nll_loss_backward.default")
def nll_loss_backward(grad_output: Tensor, self: Tensor, target: Tensor, weight: Tensor | None,
                      reduction: int, ignore_index: int, total_weight: Tensor) -> Tensor:
    """aten's ``nll_loss_backward``: ``-w[t] * grad`` at each row's target, zeros elsewhere.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs this kernel does not take.
    """
    check_input(self, target, weight, grad_output, total_weight)
    red = reduction_code(reduction)
    if self.dim() not in (1, 2) or target.dim() != self.dim() - 1:
        raise Unsupported("nll_loss_backward takes a [N, C] or [C] input")
    _, R, C = rows_of(self)
    t = class_targets(target, R, C, int(ignore_index))
    w = class_weight(weight, self, C)
    if red == 0 and grad_output.numel() != R:
        raise Unsupported("grad_output does not match the unreduced loss")
    stride_g = grad_output.reshape(-1).stride(0) if red == 0 and grad_output.dim() else 0
    g = grad_output.reshape(-1) if red == 0 and grad_output.dim() else grad_output
    gi = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    if R and C:
        _nll_bwd_kernel[lambda meta: (cdiv(R, meta["BLOCK_M"]),
                                      cdiv(C, meta["BLOCK_C"]))](
            g, t, w if w is not None else gi, total_weight, gi, R, C, stride_g,
            t.stride(0), int(ignore_index), MEAN=red == 1, HAS_W=w is not None,
            ACC=tl_acc(self.dtype))
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
        twice = higher_order()
        gi = None if twice else gems_backward("nll_loss backward", lambda: nll_loss_backward(
            grad, x, target, weight, red, ignore_index, total))
        if gi is None:
            name = {0: "none", 1: "mean", 2: "sum"}[red]
            (gx,) = torch_gradients(
                lambda: torch.nn.functional.nll_loss(x, target, weight, ignore_index=ignore_index,
                                                     reduction=name), (x,), grad,
                create_graph=twice)
            return gx, None, None, None, None
        return gi, None, None, None, None


@op()
def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """``torch.nn.functional.nll_loss`` for [N, C] or [C] log-probabilities, differentiable.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs these kernels do not take.
    """
    red = reduction_code(reduction)
    if torch.is_grad_enabled() and input.requires_grad:
        return _NLLLoss.apply(input, target, weight, red,
                              int(ignore_index))
    return nll_loss_forward(input, target, weight, red, int(ignore_index))[0]

