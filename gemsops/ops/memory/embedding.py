"""Embedding lookup and its dense backward.

The forward gathers rows: each program copies ``BLOCK_M`` whole looked-up rows, reading
each row's index once and walking the row ``BLOCK_D`` columns at a time (a config whose
BLOCK_D covers the row, as 4096 for LLM widths, copies it in one step of wide vector
loads). The backward never builds a [V, D] accumulator: it zeroes the [V, D] result
in its own dtype, sorts the indices stably (torch's sort, keeping each one's position),
and the program of each sorted position that starts a run of equal indices sums that
run's gradient rows in sorted order, in float32 (float64 for float64), divides by the
run's length for ``scale_grad_by_freq``, skips ``padding_idx``'s run, and writes the row
cast to the gradient dtype. A program walks at most one ``SEG``-position segment of the
sorted order: a run that goes on past it (a token-type table's one index over the whole
batch) is summed a segment per program, and a second kernel adds the segments' partial
sums in order. The summation order is fixed by the stable sort and ``SEG`` (the same for
every config), so the result is deterministic: the backward is served under
``torch.use_deterministic_algorithms(True)`` too.

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
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, acc_dtype, check_supported, tl_acc
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
    # P[0:n] = 0, the gradient's start (torch.zeros would go through an aten op that
    # gemsops itself may serve).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(P + offs, tl.zeros((BLOCK,), P.dtype.element_ty), mask=offs < n)


SEG = 64
"""Sorted positions a program of the backward walks at most: a long run of one index (a
token-type table's 2 rows over a whole batch) is summed by many programs at once, a
segment each, and their partial sums combined in position order by a second kernel.
Fixed, not tuned, so the summation order is the same for every config."""


@kernel("embedding_backward_rows", key=["D"])
@triton.jit
def _rows_kernel(
    G,  # [n, D] gradient rows, any strides
    Sorted,  # [n] indices in ascending order (a stable sort)
    Order,  # [n] int64: the position each sorted index came from
    Out,  # [V, D] zeroed result, contiguous
    Part,  # [n_seg, 2, D] ACC: per segment, the head (a run continued) and tail partials
    Count,  # [n_seg, 2] int64: the partials' row counts (written with SCALE)
    n,
    V,
    D,
    stride_gn, stride_gd,
    padding_idx,  # rows at this index get no gradient (-1: none, indices are >= 0)
    SCALE: tl.constexpr,  # divide each row by its index count
    ACC: tl.constexpr,  # float32, or float64 for float64 gradients
    SEG: tl.constexpr,  # positions a program walks at most (segments of the sorted order)
    BLOCK_N: tl.constexpr,  # sorted positions read per step of a run
    BLOCK_D: tl.constexpr,
):
    # The program of sorted position p works when p starts a run of equal indices or
    # starts a segment (p % SEG == 0) inside one: it sums the run's gradient rows in
    # sorted order up to the run's end or the segment's, one column chunk per program
    # along axis 1. A run that starts and ends in one segment is written to out here; a
    # run start whose run goes on writes the segment's tail partial, and a segment start
    # inside a run its head partial, for _runs_kernel to combine.
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cur = tl.load(Sorted + p).to(tl.int64)
    prev = tl.load(Sorted + tl.maximum(p - 1, 0)).to(tl.int64)
    ok = (cur >= 0) & (cur < V)
    tl.device_assert(ok, "embedding index out of range")
    # An out-of-range index writes nothing (and its run is never walked).
    first = (p == 0) | (prev != cur)
    seg = p // SEG
    live = (first | (p % SEG == 0)) & ok & (cur != padding_idx)
    limit = tl.minimum((seg + 1) * SEG, n)
    acc = tl.zeros((BLOCK_D,), ACC)
    count = p * 0  # int64 scalar
    q = p
    go = live
    while go:
        # BLOCK_N positions a step, their loads independent (in flight together); rows
        # past the run or the segment are masked off, and adding their 0.0 leaves the
        # sum as it was.
        for i in tl.static_range(BLOCK_N):
            at = q + i
            inside = at < limit
            same = inside & (tl.load(Sorted + at, mask=inside, other=0).to(tl.int64) == cur)
            pos = tl.load(Order + at, mask=same, other=0)
            src = G + pos * stride_gn + cols.to(tl.int64) * stride_gd
            # (A scalar flag and a block mask combine as `cols < width`: the interpreter's
            # `scalar & block` is no boolean.)
            g = tl.load(src, mask=cols < tl.where(same, D, 0), other=0.0)
            acc += g.to(ACC)
            count += same.to(tl.int64)
        q += BLOCK_N
        go = same  # the step's last position is still in the run: it may go on
    # Whether the run goes on past this segment.
    more = limit < n
    crossed = more & (tl.load(Sorted + tl.minimum(limit, n - 1)).to(tl.int64) == cur)
    whole = live & first & (crossed == 0)
    full = acc
    if SCALE:
        full = acc / tl.maximum(count, 1).to(ACC)
    tl.store(Out + cur * D + cols, full.to(Out.dtype.element_ty), mask=cols < tl.where(whole, D, 0))
    # The tail (slot 1) of a run that starts here and goes on; the head (slot 0) of a
    # segment that a run entered from before.
    slot = tl.where(first, 1, 0)
    partial = live & (whole == 0)
    tl.store(Part + (seg * 2 + slot) * D + cols, acc, mask=cols < tl.where(partial, D, 0))
    if SCALE:
        tl.store(Count + seg * 2 + slot, count, mask=partial)


@kernel("embedding_backward_runs", key=["D"])
@triton.jit
def _runs_kernel(
    Sorted,  # [n] indices in ascending order
    Out,  # [V, D] result
    Part,  # [n_seg, 2, D] ACC partials (_rows_kernel)
    Count,  # [n_seg, 2] int64 counts (read with SCALE)
    n,
    n_seg,
    V,
    D,
    padding_idx,
    SCALE: tl.constexpr,
    SEG: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Segment s owns the run that crosses its end when that run started inside it: its
    # tail partial, then each later segment's head while the run goes on, summed in
    # that (position) order and written to out.
    s = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    end = tl.minimum((s + 1) * SEG, n)  # the first position after segment s
    last = tl.load(Sorted + end - 1).to(tl.int64)
    nxt = tl.load(Sorted + tl.minimum(end, n - 1)).to(tl.int64)
    before = tl.load(Sorted + tl.maximum(s * SEG - 1, 0)).to(tl.int64)
    started_here = (s == 0) | (before != last)
    own = (end < n) & (nxt == last) & started_here & (last >= 0) & (last < V) & (
        last != padding_idx)
    acc = tl.load(Part + (s * 2 + 1) * D + cols, mask=cols < tl.where(own, D, 0), other=0.0)
    count = s * 0
    if SCALE:
        count = tl.load(Count + s * 2 + 1, mask=own, other=0)
    t = s + 1
    go = own
    while go:
        acc += tl.load(Part + (t * 2) * D + cols, mask=cols < D, other=0.0)
        if SCALE:
            count += tl.load(Count + t * 2)
        t += 1
        go = t < n_seg
        if go:
            go = tl.load(Sorted + t * SEG).to(tl.int64) == last
    if SCALE:
        acc = acc / tl.maximum(count, 1).to(acc.dtype)
    tl.store(Out + last * D + cols, acc.to(Out.dtype.element_ty), mask=cols < tl.where(own, D, 0))


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
        Unsupported: inputs these kernels do not take.
    """
    if grad_output.dtype not in FLOAT_DTYPES or grad_output.layout != torch.strided:
        raise Unsupported(f"embedding gradient of {grad_output.dtype}")
    if grad_output.device != indices.device:
        raise Unsupported("gradient and indices on different devices")
    check_supported(grad_output.dtype)
    if tuple(grad_output.shape[:-1]) != tuple(indices.shape) and grad_output.numel():
        raise Unsupported("grad_output does not match the indices")
    V, D = int(num_weights), grad_output.shape[-1]
    flat = _check_indices(indices, V)
    n = flat.numel()
    out = torch.empty((V, D), dtype=grad_output.dtype, device=grad_output.device)
    if V * D == 0:
        return out
    total = V * D
    _zero_kernel[lambda meta: (cdiv(total, meta["BLOCK"]),)](out, total)
    if n:
        g = grad_output.reshape(n, D)  # a view when the layout allows (strides go along)
        with running():  # torch's own stable sort, never one gemsops serves
            ordered, order = torch.sort(flat, stable=True)
        n_seg = cdiv(n, SEG)
        acc = tl_acc(grad_output.dtype)
        scale = bool(scale_grad_by_freq)
        # (One segment: no run crosses one and nothing is written to part; it is
        # allocated anyway, so every call compiles to one kernel.)
        part = torch.empty((n_seg, 2, D), dtype=acc_dtype(grad_output.dtype),
                           device=out.device)
        count = torch.empty((n_seg, 2), dtype=torch.int64, device=out.device) if scale \
            else order  # read and written only with SCALE
        _rows_kernel[lambda meta: (n, cdiv(D, meta["BLOCK_D"]))](
            g, ordered, order, out, part, count, n, V, D, *g.stride(), int(padding_idx),
            SCALE=scale, ACC=acc, SEG=SEG)
        if n_seg > 1:
            _runs_kernel[lambda meta: (n_seg, cdiv(D, meta["BLOCK_D"]))](
                ordered, out, part, count, n, n_seg, V, D, int(padding_idx),
                SCALE=scale, SEG=SEG)
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

