"""Reductions that return an index: argmax, argmin, and max / min over one dim.

Each lane of the accumulator tile keeps its best value while the kernel walks the line,
and the start of the chunk it came from: a lane only ever sees later positions, so a
later value replaces the kept one only when strictly better, and a tie keeps the
earlier position without comparing indices. Per element that is one comparison, a nan
test and two selects; the lanes' positions (chunk start + lane) and one tuple
reduction across lanes finish. The order is torch's: nan beats everything (max and
min propagate nan; argmax of a line with nan points at the first nan), then the
larger (smaller) value, and ties go to the lowest index. A second pass over a split
line's partial results compares (value, index) pairs in full.
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
from gemsops.ops.rowwise.layout import (
    INDEX_SENTINEL,
    Layout,
    check_input,
    dim_list,
    kernel_view,
    max_identity,
    min_identity,
    part_buffer,
    part_layout,
    plan,
    reduced_shape,
    split,
    tl_dtype,
    wrap_dim,
)
from gemsops.ops.rowwise.tiles import chunk_tile, launch, mid_block, row_block, split_bounds

__all__ = ["argmax", "argmin", "max_dim", "min_dim"]

_SENTINEL = tl.constexpr(INDEX_SENTINEL)


@triton.jit
def _pick(v1, i1, v2, i2, IS_MAX: tl.constexpr):
    """The better of two (value, index) pairs: nan, then larger (smaller), then lower index."""
    nan1 = v1 != v1
    nan2 = v2 != v2
    strict = v1 > v2 if IS_MAX else v1 < v2
    tie = (v1 == v2) | (nan1 & nan2)
    first = strict | (nan1 & ~nan2) | (tie & (i1 < i2))
    return tl.where(first, v1, v2), tl.where(first, i1, i2)


@triton.jit
def _pick_axis(vals, idxs, AXIS: tl.constexpr, IS_MAX: tl.constexpr, INIT: tl.constexpr):
    """The best (value, index) along AXIS, from built-in reductions only.

    The best value ignoring nan comes from max/min; the answer is the lowest index
    holding it, or the lowest index holding nan when there is one.
    """
    is_nan = vals != vals
    clean = tl.where(is_nan, INIT, vals)
    top = tl.max(clean, AXIS) if IS_MAX else tl.min(clean, AXIS)
    has_nan = tl.max(is_nan.to(tl.int32), AXIS) > 0
    if AXIS == 1:
        hit = tl.where(has_nan[:, None], is_nan, clean == top[:, None])
    else:
        hit = tl.where(has_nan[None, :], is_nan, clean == top[None, :])
    idx = tl.min(tl.where(hit, idxs, _SENTINEL), AXIS)
    if tl.constexpr(vals.dtype.is_floating()):
        top = tl.where(has_nan, float("nan"), top)
    return top, idx


@triton.jit
def _load_pairs(
    X,
    IDX_IN,
    off,
    mask,
    n,
    AXIS: tl.constexpr,
    CMP: tl.constexpr,
    INIT: tl.constexpr,
    HAS_IDX_IN: tl.constexpr,
):
    """The (value, index) pairs of a tile: indices read from IDX_IN (a second pass) or
    the positions ``n`` along AXIS; masked lanes get INIT and the sentinel."""
    v = tl.load(X + off, mask=mask, other=INIT).to(CMP)
    if HAS_IDX_IN:
        i = tl.load(IDX_IN + off, mask=mask, other=_SENTINEL)
    elif AXIS == 1:
        i = tl.where(mask, n[None, :], _SENTINEL)
    else:
        i = tl.where(mask, n[:, None], _SENTINEL)
    return v, i


@triton.jit
def _keep_better(best_v, best_s, v, start, IS_MAX: tl.constexpr):
    """One step of a lane's walk: take ``v`` (and the chunk ``start``) where it is better
    than the kept value: strictly larger (smaller), or the first nan. ``v`` comes from a
    later position than the kept value, so a tie keeps the kept one."""
    better = v > best_v if IS_MAX else v < best_v
    take = better | ((v != v) & (best_v == best_v))
    return tl.where(take, v, best_v), tl.where(take, start, best_s)


@triton.jit
def _walk(X, IDX_IN, base, lo, hi, line_ok, idx, step_n, stride_n, best_v, best_i,
          AXIS: tl.constexpr, IS_MAX: tl.constexpr, CMP: tl.constexpr, INIT: tl.constexpr,
          HAS_IDX_IN: tl.constexpr, BLOCK_N: tl.constexpr):
    """The best (value, index) pair of each lane over positions [lo, hi) of the lines.

    A first pass keeps values and chunk starts (:func:`_keep_better`), the first chunk
    filling the lanes so that no comparison with INIT is needed (a line of -inf still
    has its argmax), and gives the lanes' positions at the end; lanes past ``hi`` get
    INIT and the sentinel. A second pass (HAS_IDX_IN) compares pairs with :func:`_pick`.
    """
    if HAS_IDX_IN:
        for start in range(lo, hi, BLOCK_N):
            n, _, mask, off = chunk_tile(start, idx, hi, base, line_ok, step_n, stride_n, AXIS)
            v, i = _load_pairs(X, IDX_IN, off, mask, n, AXIS, CMP, INIT, HAS_IDX_IN)
            best_v, best_i = _pick(v, i, best_v, best_i, IS_MAX)
    else:
        n, n_ok, mask, off = chunk_tile(lo, idx, hi, base, line_ok, step_n, stride_n, AXIS)
        best_v = tl.load(X + off, mask=mask, other=INIT).to(CMP)
        best_s = tl.full(best_v.shape, 0, tl.int32) + lo
        for start in range(lo + BLOCK_N, hi, BLOCK_N):
            _, _, mask, off = chunk_tile(start, idx, hi, base, line_ok, step_n, stride_n, AXIS)
            v = tl.load(X + off, mask=mask, other=INIT).to(CMP)
            best_v, best_s = _keep_better(best_v, best_s, v, start, IS_MAX)
        if AXIS == 1:
            best_i = tl.where(n_ok[None, :], best_s + idx[None, :], _SENTINEL)
            best_v = tl.where(n_ok[None, :], best_v, INIT)
        else:
            best_i = tl.where(n_ok[:, None], best_s + idx[:, None], _SENTINEL)
            best_v = tl.where(n_ok[:, None], best_v, INIT)
    return best_v, best_i


@triton.jit
def _store_best(
    VAL_OUT,
    IDX_OUT,
    out,
    ok,
    best_v,
    best_i,
    AXIS: tl.constexpr,
    IS_MAX: tl.constexpr,
    INIT: tl.constexpr,
    WRITE_VAL: tl.constexpr,
):
    """Reduce the accumulator tiles along AXIS and store the winner at ``out``."""
    v, i = _pick_axis(best_v, best_i, AXIS, IS_MAX, INIT)
    if WRITE_VAL:
        tl.store(VAL_OUT + out, v, mask=ok)
    tl.store(IDX_OUT + out, i, mask=ok)


@kernel("arg_reduce_rows", key=["M", "N"])
@triton.jit
def _arg_rows_kernel(
    X,  # values: x[m, n] at X + m * stride_m + n * stride_n
    IDX_IN,  # with HAS_IDX_IN, the index of each value, laid out like X (second pass)
    VAL_OUT,  # best values, (M, S) contiguous, S = programs per row; written if WRITE_VAL
    IDX_OUT,  # their indices along n, (M, S) contiguous
    M,
    N,
    stride_m,
    stride_n,
    CHUNK,  # elements of a row one split covers (N when a row is not split)
    IS_MAX: tl.constexpr,
    CMP: tl.constexpr,  # dtype values are compared in (float32 for half types: exact)
    INIT: tl.constexpr,  # the worst value: fills masked lanes
    HAS_IDX_IN: tl.constexpr,
    WRITE_VAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    row_off = rows.to(tl.int64)[:, None] * stride_m
    cols = tl.arange(0, BLOCK_N)
    best_v = tl.full((BLOCK_M, BLOCK_N), INIT, CMP)
    # Masked lanes carry the sentinel index, so they lose every tie to a real element.
    best_i = tl.full((BLOCK_M, BLOCK_N), _SENTINEL, tl.int32)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    best_v, best_i = _walk(X, IDX_IN, row_off, lo, hi, row_ok, cols, step_n, stride_n,
                           best_v, best_i, 1, IS_MAX, CMP, INIT, HAS_IDX_IN, BLOCK_N)
    _store_best(
        VAL_OUT,
        IDX_OUT,
        rows.to(tl.int64) * parts + part,
        row_ok,
        best_v,
        best_i,
        1,
        IS_MAX,
        INIT,
        WRITE_VAL,
    )


@kernel("arg_reduce_mid", key=["M", "N", "K"])
@triton.jit
def _arg_mid_kernel(
    X,  # values: x[m, n, k] at X + m * stride_m + n * stride_n + k
    IDX_IN,  # with HAS_IDX_IN, the index of each value, laid out like X (second pass)
    VAL_OUT,  # best values, (M, S, K) contiguous; written if WRITE_VAL
    IDX_OUT,  # their indices along n, (M, S, K) contiguous
    M,
    N,
    K,
    stride_m,
    stride_n,
    CHUNK,
    IS_MAX: tl.constexpr,
    CMP: tl.constexpr,
    INIT: tl.constexpr,
    HAS_IDX_IN: tl.constexpr,
    WRITE_VAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    base = m * stride_m + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    best_v = tl.full((BLOCK_N, BLOCK_K), INIT, CMP)
    best_i = tl.full((BLOCK_N, BLOCK_K), _SENTINEL, tl.int32)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    best_v, best_i = _walk(X, IDX_IN, base, lo, hi, k_ok, ns, step_n, stride_n,
                           best_v, best_i, 0, IS_MAX, CMP, INIT, HAS_IDX_IN, BLOCK_N)
    _store_best(
        VAL_OUT,
        IDX_OUT,
        (m * parts + part) * K + ks,
        k_ok,
        best_v,
        best_i,
        0,
        IS_MAX,
        INIT,
        WRITE_VAL,
    )


def _launch(
    lay: Layout,
    idx_in: Tensor | None,
    val_out: Tensor | None,
    idx_out: Tensor,
    parts: int,
    chunk: int,
    is_max: bool,
    init: float | int,
) -> None:
    src = lay.src
    cmp = torch.float32 if src.dtype in (torch.float16, torch.bfloat16) else src.dtype
    consts = {
        "IS_MAX": is_max,
        "CMP": tl_dtype(cmp),
        "INIT": init,
        "HAS_IDX_IN": idx_in is not None,
        "WRITE_VAL": val_out is not None,
    }
    # Unused pointer arguments get a real tensor so every launch has the same signature.
    idx_arg = src if idx_in is None else idx_in
    val_arg = idx_out if val_out is None else val_out
    launch(
        _arg_rows_kernel,
        _arg_mid_kernel,
        lay,
        (idx_arg, val_arg, idx_out),
        (chunk,),
        consts,
        parts,
    )


def _arg_reduce(
    name: str, x: Tensor, dim: int | None, keepdim: bool, is_max: bool, with_values: bool
) -> tuple[Tensor | None, Tensor]:
    """Best values (if ``with_values``) and their int64 indices over ``dim`` (None: flat)."""
    check_input(x)
    if x.dtype == torch.bool and not with_values:
        raise RuntimeError(f"{name}(): does not support bool input")
    if dim is None:
        if x.numel() == 0:
            raise IndexError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
            )
        dims = dim_list(None, x.dim())
    else:
        d = wrap_dim(dim, x.dim())
        if x.dim() and x.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        dims = dim_list(d, x.dim())
    shape = reduced_shape(x.shape, dims, keepdim)
    values = torch.empty(shape, dtype=x.dtype, device=x.device) if with_values else None
    indices = torch.empty(shape, dtype=torch.int64, device=x.device)
    if indices.numel() == 0:
        return values, indices
    src = kernel_view(x)
    lay = plan(src, dims, reorder=False)
    assert lay is not None  # copy=True (the default): plan never returns None
    if lay.N > INDEX_SENTINEL:
        raise Unsupported("reduced length needs 64-bit indices")
    init = max_identity(x.dtype) if is_max else min_identity(x.dtype)
    val_out = None if values is None else kernel_view(values)
    parts, chunk = split(lay)
    if parts == 1:
        _launch(lay, None, val_out, indices, 1, lay.N, is_max, init)
        return values, indices
    part_v = part_buffer(lay, parts, src.dtype)
    part_i = part_buffer(lay, parts, torch.int32)
    _launch(lay, None, part_v, part_i, parts, chunk, is_max, init)
    _launch(part_layout(lay, part_v), part_i, val_out, indices, 1, parts, is_max, init)
    return values, indices


@op("argmax.default", out="argmax.out")
def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the largest value over ``dim`` (of the flattened tensor when None).

    nan counts as the largest value; ties give the first index, like ``torch.argmax``.

    Raises:
        IndexError: the reduced dim (or the whole tensor, for ``dim=None``) is empty.
        RuntimeError: ``x`` is bool (torch does not support it either).
    """
    return _arg_reduce("argmax", x, dim, keepdim, True, False)[1]


@op("argmin.default", out="argmin.out")
def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the smallest value over ``dim``; nan counts as smallest, like ``torch.argmin``."""
    return _arg_reduce("argmin", x, dim, keepdim, False, False)[1]


@op("max.dim", out="max.dim_max")
def max_dim(x: Tensor, dim: int, keepdim: bool = False) -> Any:
    """``torch.max(x, dim)``: ``(values, indices)`` of the largest values along ``dim``."""
    values, indices = _arg_reduce("max", x, dim, keepdim, True, True)
    assert values is not None  # with_values=True: _arg_reduce allocates them
    return torch.return_types.max((values, indices))


@op("min.dim", out="min.dim_min")
def min_dim(x: Tensor, dim: int, keepdim: bool = False) -> Any:
    """``torch.min(x, dim)``: ``(values, indices)`` of the smallest values along ``dim``."""
    values, indices = _arg_reduce("min", x, dim, keepdim, False, True)
    assert values is not None  # with_values=True: _arg_reduce allocates them
    return torch.return_types.min((values, indices))

