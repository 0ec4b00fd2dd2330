"""The engine of the value reductions (sum, prod, max, min) over any set of dims.

Two kernels serve every op: one reduces the last axis of an (M, N) view, the other the
middle axis of an (M, N, K) view with K contiguous (``sum(dim=0)`` without a copy);
:func:`gemsops.ops.rowwise.layout.plan` picks the view. Long lines loop over N in
BLOCK_N chunks with float32 (float64 for float64) or int64 accumulators; long lines with
few outputs are split across programs and finished by a second launch. Dims no single
view covers (0 and 2 of a contiguous 3-D tensor) are reduced in two passes over views,
the inner run first. What a call decides from shapes and dtypes alone is cached.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.ops.dtypes import acc_dtype
from gemsops.ops.rowwise.layout import (
    Layout,
    kernel_view,
    max_identity,
    min_identity,
    part_buffer,
    part_layout,
    plan,
    reduced_shape,
    split,
    tl_dtype,
    view,
)
from gemsops.ops.rowwise.tiles import (
    chunk_tile,
    launch,
    mid_block,
    row_block,
    split_bounds,
    wide_split,
)

__all__ = ["MAX", "MIN", "PROD", "SUM", "reduce"]

SUM, PROD, MAX, MIN = 0, 1, 2, 3
"""The OP codes of the kernels: constexpr values selecting the combine step."""


@triton.jit
def _times(a, b):
    return a * b


@triton.jit
def _max_nan(a, b):
    # The larger, or nan where either is nan (one instruction where the device has a
    # nan-propagating max); integers compare plainly.
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _fold(acc, x, OP: tl.constexpr):
    """One element-wise step of the reduction ``OP`` (x is the new value).

    max and min propagate nan, as torch's do: once a lane holds nan it keeps it.
    """
    if OP == 0:
        r = acc + x
    elif OP == 1:
        r = acc * x
    elif OP == 2:
        r = _max_nan(acc, x)
    else:
        r = _min_nan(acc, x)
    return r


@triton.jit
def _fold_axis(acc, AXIS: tl.constexpr, OP: tl.constexpr):
    """Reduce the accumulator tile along ``AXIS`` with ``OP``."""
    if OP == 0:
        r = tl.sum(acc, AXIS)
    elif OP == 1:
        r = tl.reduce(acc, AXIS, _times)
    elif OP == 2:
        r = tl.reduce(acc, AXIS, _max_nan)
    else:
        r = tl.reduce(acc, AXIS, _min_nan)
    return r


@kernel("reduce_rows", key=["M", "N"])
@triton.jit
def _reduce_rows_kernel(
    X,  # input: x[m, n] at X + m * stride_m + n * stride_n
    OUT,  # output (M, S) contiguous, S = programs per row (grid axis 1)
    M,  # rows
    N,  # reduced length
    stride_m,
    stride_n,
    CHUNK,  # elements of a row one split covers (N when a row is not split)
    DIVISOR,  # the count a mean divides by
    OP: tl.constexpr,  # SUM, PROD, MAX or MIN
    ACC: tl.constexpr,  # accumulator dtype
    INIT: tl.constexpr,  # identity of OP: fills masked lanes and the accumulator
    MEAN: tl.constexpr,  # divide the result by DIVISOR
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    row_ptr = X + rows.to(tl.int64)[:, None] * stride_m
    cols = tl.arange(0, BLOCK_N)
    acc = tl.full((BLOCK_M, BLOCK_N), INIT, ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        # Lanes past the row's end (or this split's) read INIT, which leaves acc as is.
        _, _, mask, ptr = chunk_tile(start, cols, hi, row_ptr, row_ok, step_n, stride_n, 1)
        x = tl.load(ptr, mask=mask, other=INIT)
        acc = _fold(acc, x.to(ACC), OP)
    res = _fold_axis(acc, 1, OP)
    if MEAN:
        res = res / tl.cast(DIVISOR, ACC)
    tl.store(OUT + rows.to(tl.int64) * parts + part, res, mask=row_ok)


@kernel("reduce_mid", key=["M", "N", "K"])
@triton.jit
def _reduce_mid_kernel(
    X,  # input: x[m, n, k] at X + m * stride_m + n * stride_n + k
    OUT,  # output (M, S, K) contiguous, S = programs per line (grid axis 1)
    M,  # outer extent
    N,  # reduced length
    K,  # inner extent (contiguous)
    stride_m,
    stride_n,
    CHUNK,  # elements of N one split covers (N when not split)
    DIVISOR,  # the count a mean divides by
    OP: tl.constexpr,
    ACC: tl.constexpr,
    INIT: tl.constexpr,
    MEAN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    base = X + m * stride_m + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    acc = tl.full((BLOCK_N, BLOCK_K), INIT, ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        _, _, mask, ptr = chunk_tile(start, ns, hi, base, k_ok, step_n, stride_n, 0)
        x = tl.load(ptr, mask=mask, other=INIT)
        acc = _fold(acc, x.to(ACC), OP)
    res = _fold_axis(acc, 0, OP)
    if MEAN:
        res = res / tl.cast(DIVISOR, ACC)
    tl.store(OUT + (m * parts + part) * K + ks, res, mask=k_ok)


_WIDEST: tuple[Any, int] = (None, 0)


def _mid_width() -> int:
    """The widest column tile (``BLOCK_K``) the ``reduce_mid`` entry lists on this device,
    which :func:`~gemsops.ops.rowwise.tiles.wide_split` plans splits for (kept until
    the tuning data is read again)."""
    global _WIDEST
    configs = _reduce_mid_kernel.configs_for_current_device()
    if _WIDEST[0] is not configs:
        widths = [int(dict(c.meta).get("BLOCK_K", 1)) for c in configs]
        _WIDEST = (configs, max(widths, default=1))
    return _WIDEST[1]


def _launch(
    lay: Layout,
    out: Tensor,
    parts: int,
    chunk: int,
    consts: dict[str, Any],
    count: int | None,
) -> None:
    """Run one pass over ``lay`` writing ``parts`` values per output into ``out``.

    ``consts`` is one of :func:`_consts`' dicts; with a ``count`` (and ``MEAN`` set in
    ``consts``) the results are divided by it (a mean; 0 gives nan like torch).
    """
    launch(_reduce_rows_kernel, _reduce_mid_kernel, lay, (out,), (chunk, count or 0), consts, parts)


def _consts(op: int, acc: torch.dtype, init: float | int, mean: bool) -> dict[str, Any]:
    """The kernels' constant keywords (built once per recipe, never changed)."""
    return {"OP": op, "ACC": tl_dtype(acc), "INIT": init, "MEAN": mean}


def _runs(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``dims`` (sorted) cut into runs of consecutive dims: (0, 2, 3) -> [(0,), (2, 3)]."""
    runs: list[list[int]] = []
    for d in dims:
        if runs and runs[-1][-1] == d - 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return [tuple(r) for r in runs]


class _Recipe(NamedTuple):
    """Everything :func:`reduce` decides from shapes and dtypes alone (cached)."""

    out_shape: tuple[int, ...]
    acc: torch.dtype
    init: float | int
    convert: bool  # convert the input to the result dtype first
    view: tuple[int, int, int, int, int] | None  # (M, N, K, stride_m, stride_n)
    runs: tuple[tuple[int, ...], ...]
    empty: bool  # the result has no elements
    plain: dict[str, Any]  # the kernels' keywords for a pass that does not divide
    mean: dict[str, Any]  # ... and for one that divides by the count


@functools.lru_cache(maxsize=4096)
def _recipe(
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: torch.dtype,
    dims: tuple[int, ...],
    keepdim: bool,
    op: int,
    out_dtype: torch.dtype,
    converted: bool,
) -> _Recipe:
    # Pure in its arguments, so the per-call host work is a lookup: deciding these
    # each time was most of a small reduction's host cost.
    convert = False
    if op in (MAX, MIN):
        # Comparisons are exact in the input's dtype; half types compare as float32
        # (also exact), which every backend and the interpreter handle natively.
        acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        init: float | int = max_identity(acc) if op == MAX else min_identity(acc)
    else:
        acc = acc_dtype(out_dtype)
        init = 1 if op == PROD else 0
        # torch converts the input to the result dtype first; converting it straight to
        # the accumulator inside the kernel gives the same values unless that first
        # conversion rounds (to a narrower float, or float -> int), so only then copy.
        exact = converted or dtype in (out_dtype, torch.bool) or out_dtype == acc
        convert = not exact and (dtype.is_floating_point or out_dtype.is_floating_point)
    if dtype.is_floating_point:
        init = float(init)  # an int `other` reaches bfloat16 loads as raw bits
    out_shape = reduced_shape(shape, dims, keepdim)
    return _Recipe(
        out_shape,
        acc,
        init,
        convert,
        view(shape, strides, dims),
        tuple(_runs(dims)),
        math.prod(out_shape) == 0,
        _consts(op, acc, init, False),
        _consts(op, acc, init, True),
    )


def reduce(
    x: Tensor,
    dims: tuple[int, ...],
    keepdim: bool,
    op: int,
    out_dtype: torch.dtype,
    *,
    count: int | None = None,
    converted: bool = False,
) -> Tensor:
    """Reduce ``dims`` of ``x`` (already checked) with ``op`` into a new ``out_dtype`` tensor.

    Args:
        count: Divide the result by this (a mean).
        converted: ``x`` already holds partial results in the accumulator dtype.
    """
    r = _recipe(x.shape, x.stride(), x.dtype, dims, keepdim, op, out_dtype, converted)
    if r.convert:
        return reduce(x.to(out_dtype), dims, keepdim, op, out_dtype, count=count, converted=True)
    out = torch.empty(r.out_shape, dtype=out_dtype, device=x.device)
    if r.empty:
        return out
    src = kernel_view(x)
    if r.view is not None:
        lay = Layout(src, *r.view)
    elif len(r.runs) > 1:
        # No one view covers dims apart from each other (0 and 2 of a contiguous 3-D
        # tensor): reduce the last run first, keeping its dims, into the accumulator
        # dtype, then the rest. Both passes read views; a permuted copy would move
        # the whole input once more.
        last = r.runs[-1]
        inner = reduce(x, last, True, op, x.dtype if op in (MAX, MIN) else r.acc, converted=True)
        rest = tuple(d for d in dims if d not in last)
        done = reduce(inner, rest, True, op, out_dtype, count=count, converted=True)
        return done.view(out.shape)
    else:
        planned = plan(src, dims)
        assert planned is not None  # copy=True (the default): plan never returns None
        lay = planned
    # Middle-form lines (sum(dim=0)) split so that even the widest tiles fill the device.
    parts, chunk = split(lay) if lay.K == 1 else wide_split(lay, _mid_width())
    out_view = kernel_view(out)
    final = r.plain if count is None else r.mean
    if parts == 1:
        _launch(lay, out_view, 1, lay.N, final, count)
        return out
    partial = part_buffer(lay, parts, r.acc)
    _launch(lay, partial, parts, chunk, r.plain, None)
    _launch(part_layout(lay, partial), out_view, 1, parts, final, count)
    return out
