"""Embedding lookup and its dense backward.

The forward gathers rows: each program copies ``BLOCK_M`` whole looked-up rows, reading
each row's index once and walking the row ``BLOCK_D`` columns at a time (a config whose
BLOCK_D covers the row, as 4096 for LLM widths, copies it in one step of wide vector
loads). The backward scatters gradient rows into an fp32 (fp64 for fp64)
accumulator with atomic adds, sort-free, then (for half types or ``scale_grad_by_freq``)
a finishing kernel divides by the index counts and casts. Atomic accumulation is
order-dependent, so under ``torch.use_deterministic_algorithms(True)`` the backward is
left to torch.

An index outside ``[0, num_weights)`` is an error in torch. Kernels never read or write
out of bounds for one (such rows are masked off) and assert under ``TRITON_DEBUG``; on the
CPU, where checking costs no device sync, the host raises ``IndexError`` as torch does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, acc_dtype, check_supported
from gemsops.ops.grid import cdiv, next_power_of_2
from gemsops.ops.higher_order import gems_backward, higher_order
from gemsops.registry import running

__all__ = ["embedding", "embedding_dense_backward"]

_INDEX_DTYPES = (torch.int32, torch.int64)
_TABLE_DTYPES = FLOAT_DTYPES + INT_DTYPES  # the real dtypes a lookup copies


def _prune_rows(configs: Sequence[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """Drop configs whose column step is wider than the row (they only mask lanes off),
    keeping the narrowest ones when every config is wider."""
    need = next_power_of_2(named_args["D"])
    limit = max(need, min(c.kwargs["BLOCK_D"] for c in configs))
    return [c for c in configs if c.kwargs["BLOCK_D"] <= limit]


@kernel("embedding", key=["D"], prune=_prune_rows)
@triton.jit
def _embedding_kernel(
    Idx,  # [n] flattened indices
    W,  # [V, D] table, any strides
    Out,  # [n, D] result, contiguous
    n,
    V,
    D,
    stride_wv, stride_wd,
    BLOCK_M: tl.constexpr,  # looked-up rows per program
    BLOCK_D: tl.constexpr,  # columns per step along a row
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n
    idx = tl.load(Idx + rows, mask=row_ok, other=0).to(tl.int64)  # once per row
    tl.device_assert((idx >= 0) & (idx < V), "embedding index out of range")
    # An out-of-range index reads nothing (its row would be garbage, never memory past W).
    ok = row_ok & (idx >= 0) & (idx < V)
    src = W + idx[:, None] * stride_wv
    dst = Out + rows.to(tl.int64)[:, None] * D
    for start in range(0, D, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        col_ok = (cols < D)[None, :]
        vals = tl.load(src + cols[None, :] * stride_wd, mask=ok[:, None] & col_ok, other=0)
        tl.store(dst + cols[None, :], vals, mask=row_ok[:, None] & col_ok)


@kernel("embedding_zero", key=["n"])
@triton.jit
def _zero_kernel(P, n, BLOCK: tl.constexpr):
    # P[0:n] = 0, the accumulator's start (torch.zeros would go through an aten op that
    # gemsops itself may serve).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(P + offs, tl.zeros((BLOCK,), P.dtype.element_ty), mask=offs < n)


@kernel("embedding_backward_count", key=["n"], reset_to_zero=["Count"])
@triton.jit
def _count_kernel(Idx, Count, n, V, padding_idx, BLOCK: tl.constexpr):
    # Count[v] += number of positions holding index v (padding and out-of-range skipped).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    idx = tl.load(Idx + offs, mask=offs < n, other=-1).to(tl.int64)
    ok = (offs < n) & (idx != padding_idx) & (idx >= 0) & (idx < V)
    tl.atomic_add(Count + idx, tl.full((BLOCK,), 1, tl.int32), mask=ok)


@kernel("embedding_backward", key=["D"], reset_to_zero=["Acc"])
@triton.jit
def _scatter_kernel(
    G,  # [n, D] gradient rows, contiguous
    Idx,  # [n] indices
    Acc,  # [V, D] zeroed accumulator (fp32/fp64, or the fp32 result itself)
    n,
    V,
    D,
    padding_idx,  # rows at this index get no gradient (-1: none, indices are >= 0)
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n
    col_ok = cols < D
    idx = tl.load(Idx + rows, mask=row_ok, other=-1).to(tl.int64)
    tl.device_assert(~row_ok | ((idx >= 0) & (idx < V)), "embedding index out of range")
    ok = row_ok & (idx != padding_idx) & (idx >= 0) & (idx < V)
    mask = ok[:, None] & col_ok[None, :]
    g = tl.load(G + rows.to(tl.int64)[:, None] * D + cols[None, :], mask=mask, other=0.0)
    tl.atomic_add(Acc + idx[:, None] * D + cols[None, :], g.to(Acc.dtype.element_ty), mask=mask)


@kernel("embedding_backward_finish", key=["D"])
@triton.jit
def _finish_kernel(Acc, Count, Out, V, D, SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    # Out = Acc (/ Count per row when scaling by frequency), cast to the gradient dtype.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < V)[:, None] & (cols < D)[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    acc = tl.load(Acc + offs, mask=mask, other=0.0)
    if SCALE:
        # Rows never looked up have count 0 and a zero sum: divide by 1 instead.
        cnt = tl.load(Count + rows, mask=rows < V, other=1)
        acc = acc / tl.maximum(cnt, 1).to(acc.dtype)[:, None]
    tl.store(Out + offs, acc.to(Out.dtype.element_ty), mask=mask)


def _check_indices(indices: Tensor, num: int) -> Tensor:
    """The indices as a flat [n] tensor (a view when possible), checked on the CPU."""
    if indices.layout != torch.strided or indices.dtype not in _INDEX_DTYPES:
        raise Unsupported(f"indices of dtype {indices.dtype} / layout {indices.layout}")
    flat = indices if indices.dim() == 1 else indices.reshape(-1)
    if flat.stride(0) != 1:
        flat = flat.contiguous()
    if indices.is_cpu and flat.numel():
        # No device sync here, so validate like torch (numpy: no aten op re-enters gemsops).
        arr = flat.detach().numpy()
        if arr.min() < 0 or arr.max() >= num:
            raise IndexError("index out of range in self")
    return flat


@op("embedding.default", public=False)
def _lookup(weight: Tensor, indices: Tensor, padding_idx: int = -1,
            scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    # aten::embedding's kernel (autograd is torch's business at the backend key, so the
    # overload is served by this lookup; the public embedding() adds its own backward).
    if weight.dim() != 2 or weight.layout != torch.strided or weight.dtype not in _TABLE_DTYPES:
        raise Unsupported("embedding table must be a 2-D strided tensor of a real dtype")
    if weight.device != indices.device:
        raise Unsupported("table and indices on different devices")
    check_supported(weight.dtype)
    V, D = weight.shape
    flat = _check_indices(indices, V)
    n = flat.numel()
    out = torch.empty((n, D), dtype=weight.dtype, device=weight.device)
    if n and D:
        _embedding_kernel.launch(
            lambda meta: (cdiv(n, meta["BLOCK_M"]),),
            (flat, weight, out, n, V, D, *weight.stride()),
            _NO_CONSTS,
        )
    # A 1-D index tensor gives the [n, D] result as allocated; others take its shape.
    return out if indices.dim() == 1 else out.view(*indices.shape, D)


_NO_CONSTS: dict[str, Any] = {}  # shared, never changed


@op()
def embedding(weight: Tensor, indices: Tensor, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Look up rows of ``weight``: ``out[..., :] = weight[indices[...], :]``.

    Args:
        weight: The [num_embeddings, D] table (any strides).
        indices: int32/int64 indices of any shape.
        padding_idx: Rows at this index get no gradient (-1: none).
        scale_grad_by_freq: Divide each row's gradient by its index count.
        sparse: Ask for a sparse gradient (left to torch: the backward raises Unsupported).

    Returns:
        ``indices.shape + (D,)`` rows of ``weight``; differentiable.

    Raises:
        IndexError: an index out of range (checked on the CPU).
        Unsupported: a table or index tensor these kernels do not take.
    """
    if torch.is_grad_enabled() and weight.requires_grad:
        if sparse:
            raise Unsupported("sparse embedding gradients")
        return _Embedding.apply(weight, indices, padding_idx,
                                scale_grad_by_freq, sparse)
    return _lookup(weight, indices, padding_idx, scale_grad_by_freq, sparse)


@op("embedding_dense_backward.default")
def embedding_dense_backward(grad_output: Tensor, indices: Tensor, num_weights: int,
                             padding_idx: int, scale_grad_by_freq: bool) -> Tensor:
    """The gradient of :func:`embedding`'s table: rows of ``grad_output`` summed per index.

    Args:
        grad_output: ``indices.shape + (D,)`` gradient of the lookup.
        indices: The indices of the lookup.
        num_weights: Rows of the table.
        padding_idx: Positions holding this index contribute nothing.
        scale_grad_by_freq: Divide each row by how often its index occurs.

    Returns:
        The [num_weights, D] gradient, in ``grad_output``'s dtype.

    Raises:
        IndexError: an index out of range (checked on the CPU).
        Unsupported: deterministic algorithms requested, or inputs these kernels do not take.
    """
    if grad_output.dtype not in FLOAT_DTYPES or grad_output.layout != torch.strided:
        raise Unsupported(f"embedding gradient of {grad_output.dtype}")
    if grad_output.device != indices.device:
        raise Unsupported("gradient and indices on different devices")
    if torch.are_deterministic_algorithms_enabled():
        raise Unsupported("atomic accumulation is not deterministic")
    check_supported(grad_output.dtype)
    if tuple(grad_output.shape[:-1]) != tuple(indices.shape) and grad_output.numel():
        raise Unsupported("grad_output does not match the indices")
    V, D = int(num_weights), grad_output.shape[-1]
    flat = _check_indices(indices, V)
    n = flat.numel()
    dev = grad_output.device
    out = torch.empty((V, D), dtype=grad_output.dtype, device=dev)
    if V * D == 0:
        return out
    acc_t = acc_dtype(grad_output.dtype)
    direct = grad_output.dtype == acc_t and not scale_grad_by_freq
    acc = out if direct else torch.empty((V, D), dtype=acc_t, device=dev)
    count = torch.empty(V if scale_grad_by_freq else 1, dtype=torch.int32, device=dev)
    g = grad_output.reshape(n, D)
    if g.stride(1) != 1 or g.stride(0) != D:
        g = g.contiguous()
    for buf in (acc, count) if scale_grad_by_freq else (acc,):
        total = buf.numel()
        _zero_kernel[lambda meta, t=total: (cdiv(t, meta["BLOCK"]),)](buf, total)
    if n:
        if scale_grad_by_freq:
            _count_kernel[lambda meta: (cdiv(n, meta["BLOCK"]),)](
                flat, count, n, V, int(padding_idx))
        _scatter_kernel[lambda meta: (cdiv(n, meta["BLOCK_M"]),
                                      cdiv(D, meta["BLOCK_D"]))](
            g, flat, acc, n, V, D, int(padding_idx))
    if not direct:
        _finish_kernel[lambda meta: (cdiv(V, meta["BLOCK_M"]),
                                     cdiv(D, meta["BLOCK_D"]))](
            acc, count, out, V, D, SCALE=scale_grad_by_freq)
    return out


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: Tensor, indices: Tensor, padding_idx: int,
                scale_grad_by_freq: bool, sparse: bool) -> Tensor:
        ctx.save_for_backward(indices)
        ctx.meta = (weight.shape[0], padding_idx, scale_grad_by_freq, sparse)
        return _lookup(weight, indices, padding_idx, scale_grad_by_freq, sparse)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (indices,) = ctx.saved_tensors
        num, padding_idx, scale, _ = ctx.meta
        got = None if higher_order() else gems_backward(
            "embedding backward",
            lambda: embedding_dense_backward(grad, indices, num, padding_idx, scale))
        if got is None:
            # Linear in grad: torch's own (differentiable) scatter of it.
            with running():
                got = torch.ops.aten.embedding_dense_backward(
                    grad, indices, num, padding_idx, scale)
        return got, None, None, None, None

