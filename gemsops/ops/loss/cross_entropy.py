"""Fused cross entropy: one pass over each row's classes, forward and backward.

The forward keeps an online logsumexp (per-lane running max and scaled sum) together with
the sums label smoothing and probability targets need, so a vocabulary-sized row is read
once, in ``BLOCK_C`` chunks; the backward reads it once more and writes the gradient.
Per-row losses are reduced by one program in a fixed order (deterministic).

``F.cross_entropy`` calls ``aten::cross_entropy_loss``, a composite that torch
decomposes (``_log_softmax`` + ``nll_loss``, plus pointwise ops for label smoothing)
before any backend key sees it; so gemsops serves it at the vendor's autograd key
(declared with ``autograd=True``), where :func:`cross_entropy` runs with its own backward
and torch's composite stays the fallback. It shares the target handling
(:mod:`~gemsops.ops.loss.inputs`) and the reduction kernel
(:mod:`~gemsops.ops.loss.reduction`) with :mod:`~gemsops.ops.loss.nll`.
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
from gemsops.ops.replay import replayable

__all__ = ["cross_entropy"]


@triton.jit
def _target_mix(T, W, r64, c, mask, C, stride_tn, stride_tc, smoothing,
                PROB: tl.constexpr, HAS_W: tl.constexpr, ACC: tl.constexpr,
                BLOCK_C: tl.constexpr):
    # w_c q_c over the chunk at columns c: with probability targets q is the smoothed
    # target (1 - eps) p_c + eps / C; with smoothed class targets q is 1 (the caller
    # scales by eps / C). Without a weight, w is 1.
    if HAS_W:
        q = tl.load(W + c, mask=c < C, other=0.0).to(ACC)[None, :]
    else:
        q = tl.full((1, BLOCK_C), 1.0, ACC)
    if PROB:
        p = tl.load(T + r64 * stride_tn + c[None, :] * stride_tc, mask=mask,
                    other=0.0).to(ACC)
        q = q * (p * (1.0 - smoothing) + smoothing / C)
    return q


@kernel("cross_entropy", key=["C"])
@triton.jit
def _ce_fwd_kernel(
    X, T, W,  # logits [N, C] (any strides), targets ([N] classes or [N, C] probabilities), weight
    Loss, RowW, LSE, Mass,  # per row: loss, weight for the mean, logsumexp, target mass
    N, C, stride_xn, stride_xc, stride_tn, stride_tc, ignore_index, smoothing,
    PROB: tl.constexpr,  # probability targets
    SMOOTH: tl.constexpr,  # class targets with label_smoothing > 0
    HAS_W: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
    STATS: tl.constexpr = True,  # store LSE and Mass (the backward reads them)
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    r64 = rows.to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK_C)
    m = tl.full((BLOCK_M,), float("-inf"), ACC)  # running row max
    s = tl.zeros((BLOCK_M,), ACC)  # running sum of exp(x - m)
    swx = tl.zeros((BLOCK_M,), ACC)  # sum of w_c q_c x_c (q = 1 for label smoothing)
    sw = tl.zeros((BLOCK_M,), ACC)  # sum of w_c q_c
    for k in range(0, C, BLOCK_C):
        c = k + cols
        mask = row_ok[:, None] & (c < C)[None, :]
        x = tl.load(X + r64 * stride_xn + c[None, :] * stride_xc, mask=mask,
                    other=float("-inf")).to(ACC)
        # Chunk-wise online logsumexp: one exp per element (exp throughput is the limit
        # on vocabulary rows), the running sum rescaled once per chunk.
        m_new = tl.maximum(m, tl.max(x, 1))
        # A row that has seen only -inf keeps s = 0 (exp(-inf - -inf) would be nan).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), 1)
        m = m_new
        if PROB or SMOOTH:
            q = _target_mix(T, W, r64, c, mask, C, stride_tn, stride_tc, smoothing,
                            PROB, HAS_W, ACC, BLOCK_C)
            # Summed per chunk: row accumulators keep registers free for the chunk.
            sw += tl.sum(tl.where(mask, q, 0.0), 1)
            swx += tl.sum(tl.where(mask, q * x, 0.0), 1)
    lse = tl.where(m == float("-inf"), 0.0, m) + tl.log(s)
    SW = sw
    SWX = swx
    if PROB:
        # -sum_c w_c q_c (x_c - lse)
        loss = lse * SW - SWX
        roww = tl.full((BLOCK_M,), 1.0, ACC)
        mass = SW
    else:
        t, valid, w = load_target(T, rows, row_ok, stride_tn, W, C, ignore_index, HAS_W, ACC)
        x_t = tl.load(X + rows.to(tl.int64) * stride_xn + t * stride_xc, mask=valid,
                      other=0.0).to(ACC)
        loss = (1.0 - smoothing) * w * (lse - x_t)
        mass = (1.0 - smoothing) * w
        if SMOOTH:
            loss += smoothing / C * (lse * SW - SWX)
            mass += smoothing / C * SW
        loss = tl.where(valid, loss, 0.0)
        mass = tl.where(valid, mass, 0.0)
        roww = w
    tl.store(Loss + rows, loss.to(Loss.dtype.element_ty), mask=row_ok)
    tl.store(RowW + rows, roww, mask=row_ok)
    if STATS:
        tl.store(LSE + rows, lse, mask=row_ok)
        tl.store(Mass + rows, mass, mask=row_ok)


@kernel("cross_entropy_backward", key=["C"])
@triton.jit
def _ce_bwd_kernel(
    X, T, W, LSE, Mass, G, Denom, GI,  # GI: [N, C] contiguous gradient of the logits
    N, C, stride_xn, stride_xc, stride_tn, stride_tc, stride_g, ignore_index, smoothing,
    PROB: tl.constexpr, SMOOTH: tl.constexpr, HAS_W: tl.constexpr, MEAN: tl.constexpr,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # d loss_i / d x_c = softmax_c * mass_i - w_c q_c (class targets: (1 - eps) w_t at c == t
    # plus eps / C * w_c), times the incoming gradient of row i.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    r64 = rows.to(tl.int64)[:, None]
    lse = tl.load(LSE + rows, mask=row_ok, other=0.0)[:, None]
    mass = tl.load(Mass + rows, mask=row_ok, other=0.0)[:, None]
    g = tl.load(G + rows * stride_g, mask=row_ok, other=0.0).to(ACC)
    if MEAN:
        g = g / tl.load(Denom).to(ACC)
    if PROB:
        live = row_ok
    else:
        t, live, w = load_target(T, rows, row_ok, stride_tn, W, C, ignore_index, HAS_W, ACC)
    g = g[:, None]
    for k in range(0, C, BLOCK_C):
        c = k + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (c < C)[None, :]
        x = tl.load(X + r64 * stride_xn + c[None, :] * stride_xc, mask=mask, other=0.0).to(ACC)
        grad = tl.exp(x - lse) * mass
        if PROB or SMOOTH:
            q = _target_mix(T, W, r64, c, mask, C, stride_tn, stride_tc, smoothing,
                            PROB, HAS_W, ACC, BLOCK_C)
            if PROB:
                grad -= q
            else:
                grad -= smoothing / C * q
        if not PROB:
            grad -= tl.where(c[None, :] == t[:, None], (1.0 - smoothing) * w[:, None], 0.0)
        grad = tl.where(live[:, None], grad * g, 0.0)
        tl.store(GI + r64 * C + c[None, :], grad.to(GI.dtype.element_ty), mask=mask)


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _consts(prob: bool, smooth: bool, has_w: bool, mean: bool | None, dtype: torch.dtype,
            stats: bool = True) -> dict[str, Any]:
    """The constant keywords of the forward (``mean`` None; ``stats``: store the row
    statistics) or backward launch (cached: one dict per key, never changed)."""
    key = (prob, smooth, has_w, mean, dtype, stats)
    try:
        return _CONSTS[key]
    except KeyError:
        pass
    consts = {"PROB": prob, "SMOOTH": smooth, "HAS_W": has_w}
    if mean is not None:
        consts["MEAN"] = mean
    else:
        consts["STATS"] = stats
    consts["ACC"] = tl_acc(dtype)
    _CONSTS[key] = consts
    return consts


def _ce_prepare(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                label_smoothing: float) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    """Logits as [R, C], targets as [R] classes or [R, C] probabilities, the weight, PROB."""
    check_input(input, target, weight)
    if not 0.0 <= label_smoothing <= 1.0:
        raise Unsupported("label_smoothing outside [0, 1]")
    x2, R, C = rows_of(input)
    prob = target.dtype.is_floating_point
    if prob:
        if target.shape != input.shape or target.dtype != input.dtype:
            raise Unsupported("probability targets must match the input's shape and dtype")
        t2 = rows_of(target)[0]
    else:
        if target.dim() != input.dim() - 1:
            raise Unsupported("class targets must have the input's shape without the class dim")
        t2 = class_targets(target, R, C, ignore_index)
    return x2, t2, class_weight(weight, input, C), prob


def _ce_forward(x2: Tensor, t2: Tensor, w: Tensor | None, prob: bool, red: int,
                ignore_index: int, eps: float, out_dtype: torch.dtype, stats: bool = True
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss [R] or 0-d, per-row logsumexp, per-row target mass, mean divisor).

    Without ``stats`` (no backward will run) the row statistics are not stored and the
    last three are placeholders: three allocations fewer on the host path."""
    R, C = x2.shape
    acc_tl, acc_t = tl_acc(x2.dtype), acc_dtype(x2.dtype)
    dev = x2.device
    roww = torch.empty(R, dtype=acc_t, device=dev)
    loss = torch.empty(R, dtype=out_dtype if red == 0 else acc_t, device=dev)
    if stats:
        lse = torch.empty(R, dtype=acc_t, device=dev)
        mass = torch.empty(R, dtype=acc_t, device=dev)
    else:
        lse = mass = roww  # passed, never stored
    st = t2.stride() if prob else (t2.stride(0) if R else 1, 0)
    if R:
        _ce_fwd_kernel.launch(
            lambda meta: (cdiv(R, meta["BLOCK_M"]),),
            (x2, t2, w if w is not None else x2, loss, roww, lse, mass, R, C, *x2.stride(),
             *st, ignore_index, float(eps)),
            _consts(prob, (not prob) and eps > 0, w is not None, None, x2.dtype, stats),
        )
    # Without statistics nothing reads the divisor: the reduction stores it over roww[0],
    # after its one program has summed roww (a zero-row call still needs a real slot).
    denom = roww if not stats and (R or not red) else torch.empty((), dtype=acc_t, device=dev)
    if red == 0:
        return loss, lse, mass, denom
    out = torch.empty((), dtype=out_dtype, device=dev)
    reduce_rows(loss, roww, out, denom, R, red == 1, prob, acc_tl)
    return out, lse, mass, denom


def _ce_backward(grad: Tensor, x2: Tensor, t2: Tensor, w: Tensor | None, prob: bool, red: int,
                 ignore_index: int, eps: float, lse: Tensor, mass: Tensor,
                 denom: Tensor) -> Tensor:
    R, C = x2.shape
    gi = torch.empty((R, C), dtype=x2.dtype, device=x2.device)
    g = grad.reshape(-1) if red == 0 else grad
    st = t2.stride() if prob else (t2.stride(0) if R else 1, 0)
    if R and C:
        _ce_bwd_kernel.launch(
            lambda meta: (cdiv(R, meta["BLOCK_M"]),),
            (x2, t2, w if w is not None else x2, lse, mass, g, denom, gi, R, C,
             *x2.stride(), *st, g.stride(0) if red == 0 else 0, ignore_index, float(eps)),
            _consts(prob, (not prob) and eps > 0, w is not None, red == 1, x2.dtype),
        )
    return gi


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, x2: Tensor, t2: Tensor, w: Tensor | None, prob: bool,
                red: int, ignore_index: int, eps: float) -> Tensor:
        out, lse, mass, denom = _ce_forward(x2, t2, w, prob, red, ignore_index, eps, x.dtype)
        ctx.save_for_backward(x2, t2, w, lse, mass, denom, x)
        ctx.meta = (prob, red, ignore_index, eps, x.shape)
        return out.view(_loss_shape(x.shape)) if red == 0 else out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x2, t2, w, lse, mass, denom, x = ctx.saved_tensors
        prob, red, ignore_index, eps, shape = ctx.meta
        twice = higher_order()
        got = None if twice else gems_backward("cross_entropy backward", lambda: _ce_backward(
            grad, x2, t2, w, prob, red, ignore_index, eps, lse, mass, denom))
        if got is None:
            # The gradient kernel is not differentiable (or is compiling): torch's own
            # loss, on the [M, C] rows (a view of x), differentiated back to x.
            name = _REDUCTION_NAMES[red]
            flat = grad.reshape(-1) if red == 0 else grad
            (gx,) = torch_gradients(
                lambda: torch.nn.functional.cross_entropy(
                    x2, t2, w, ignore_index=ignore_index, reduction=name, label_smoothing=eps),
                (x,), flat, create_graph=twice)
            return gx, None, None, None, None, None, None, None
        gi = got
        if len(shape) > 2:
            gi = gi.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)
        return gi.view(shape) if len(shape) <= 2 else gi, None, None, None, None, None, None, None


def _loss_shape(shape: torch.Size) -> tuple[int, ...]:
    # The unreduced loss: the input's shape without its class dim (dim 1, or dim 0 of a [C]).
    return () if len(shape) == 1 else (shape[0], *shape[2:])


@op()
def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """``torch.nn.functional.cross_entropy`` in one fused pass per row, differentiable.

    Args:
        input: Logits, [N, C], [C] or [N, C, d1, ...] (class dim 1).
        target: Class indices (int64/uint8) of the input's shape without the class dim,
            or class probabilities of the input's shape and dtype.
        weight: Optional [C] class weights.
        ignore_index: Class-index rows with this target contribute nothing.
        reduction: ``"none"``, ``"mean"`` (class targets: divided by the summed weights of
            non-ignored rows, nan when all are ignored; probabilities: by the row count)
            or ``"sum"``.
        label_smoothing: Mixes the target with the uniform distribution, as in torch.

    Returns:
        The loss in the input's dtype.

    Raises:
        IndexError: a target out of range (checked on the CPU).
        Unsupported: inputs these kernels do not take.
    """
    red = reduction_code(reduction)
    x2, t2, w, prob = _ce_prepare(input, target, weight, int(ignore_index), float(label_smoothing))
    args = (x2, t2, w, prob, red, int(ignore_index), float(label_smoothing))
    if torch.is_grad_enabled() and input.requires_grad:
        return _CrossEntropy.apply(input, *args)
    out = _ce_forward(*args, input.dtype, stats=False)[0]
    return out.view(_loss_shape(input.shape)) if red == 0 else out


def _forward_only(self: Tensor, target: Tensor, weight: Tensor | None = None,
                  *_rest: Any, **_kw: Any) -> bool:
    # The calls whose host code is structure alone, replayed (and so native at the
    # autograd key): no autograd graph to build, rows that are views of the logits
    # ([C] or [N, C]), device targets (CPU ones are range-checked by value) and a
    # contiguous weight (another would be copied by a torch call a replay skips).
    if torch.is_grad_enabled() and self.requires_grad:
        return False
    if target.requires_grad or target.is_cpu or self.dim() > 2:
        return False
    return weight is None or (weight.is_contiguous() and not weight.requires_grad)


@op("cross_entropy_loss.default", autograd=True, public=False)
@replayable(when=_forward_only, workspaces=True)
def _cross_entropy_loss(self: Tensor, target: Tensor, weight: Tensor | None = None,
                        reduction: int = 1, ignore_index: int = -100,
                        label_smoothing: float = 0.0) -> Tensor:
    # aten::cross_entropy_loss, what F.cross_entropy calls. It is a composite in torch
    # (log_softmax, then nll_loss), so it is served at the autograd key, before torch
    # decomposes it: the fused kernels and their own backward replace the composite.
    if target.requires_grad or (weight is not None and weight.requires_grad):
        raise Unsupported("gradients for the target or the class weights")
    name = _REDUCTION_NAMES.get(reduction, str(reduction))  # others: Unsupported
    return cross_entropy(self, target, weight, ignore_index, name, label_smoothing)


_REDUCTION_NAMES = {0: "none", 1: "mean", 2: "sum"}
