"""How a reduction, scan or softmax sees its input: dims, dtype rules and the (M, N, K) view.

Every kernel of the reduce / softmax family works on one of two shapes of problem:

* rows: ``x[m, n]`` at ``m * stride_m + n * stride_n``, reducing ``n`` (``K == 1``);
* middle: ``x[m, n, k]`` at ``m * stride_m + n * stride_n + k``, reducing ``n`` with
  ``k`` contiguous, so ``sum(dim=0)`` of a contiguous matrix reads coalesced rows.

:func:`plan` finds such a view of the input without copying when the strides allow it
(transposed, sliced and broadcast tensors included) and falls back to one
``permute().contiguous()`` copy otherwise (value reductions first try two passes over
views, see :mod:`gemsops.ops.rowwise.value`). This module holds no kernel, only the
host-side rules the family shares: dims, dtypes, layouts and splits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton.language as tl

import gemshal
from gemshal import VendorInfo
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, TL_DTYPES

__all__ = [
    "INDEX_SENTINEL",
    "Layout",
    "check_dtype",
    "check_input",
    "collapse",
    "dim_list",
    "kernel_view",
    "line_layout",
    "max_identity",
    "min_identity",
    "part_buffer",
    "part_layout",
    "plan",
    "reduced_shape",
    "split",
    "split_sizes",
    "tl_dtype",
    "view",
    "wrap_dim",
]

_SUPPORTED = frozenset((*FLOAT_DTYPES, *INT_DTYPES, torch.bool))

INDEX_SENTINEL = 2**31 - 1
"""Index carried by padding lanes of arg-reductions: larger than any real index, so it
never wins a tie (indices are int32 inside the kernels)."""

SPLIT_MIN_TOTAL = 1 << 22
"""Problems (elements read) from this size on split their lines in
:data:`SPLIT_MIN_CHUNK` pieces or more; smaller ones split only lines of
:data:`LONG_LINE` elements or more, in :data:`SHORT_CHUNK` pieces."""

SPLIT_MIN_CHUNK = 32768
"""Fewest elements one program reduces when a line of a large problem is split."""

LONG_LINE = 16384
"""Line length (elements along the reduced axis) from which a line is split even in a
small problem. One program walks its line one
chunk after another, each chunk's loads waiting on memory (about a microsecond a chunk),
so a long line in few programs is latency-bound: a 2M-element full sum in one program
would take over a millisecond, where split it takes a few microseconds and the second
launch. Shorter lines take less than the second launch costs."""

SHORT_CHUNK = 4096
"""Fewest elements one program reduces when a line of a small problem is split."""

SPLIT_WAVES = 16
"""Programs per multiprocessor a split aims for: enough loads in flight to reach the
memory bandwidth (a few programs per SM leave it latency-bound)."""

SPLIT_ALIGN = 1024
"""Split chunks start at multiples of this, so every chunk's loads stay aligned for
vectorisation whatever BLOCK size the tuner picks (all are powers of two up to it)."""


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """The Triton dtype of a torch dtype the family supports.

    Unlike :func:`gemsops.ops.dtypes.tl_dtype`, bool reads as uint8: the kernels see a
    bool tensor through :func:`kernel_view`, one byte per element.
    """
    return TL_DTYPES[torch.uint8 if dtype == torch.bool else dtype]


def max_identity(dtype: torch.dtype) -> float | int:
    """The identity of ``max`` for ``dtype`` (``-inf``, or the smallest integer)."""
    if dtype.is_floating_point:
        return float("-inf")
    return 0 if dtype == torch.bool else torch.iinfo(dtype).min


def min_identity(dtype: torch.dtype) -> float | int:
    """The identity of ``min`` for ``dtype`` (``inf``, or the largest integer)."""
    if dtype.is_floating_point:
        return float("inf")
    return 1 if dtype == torch.bool else torch.iinfo(dtype).max


def check_input(x: torch.Tensor, *, floating_only: bool = False) -> None:
    """Raise :class:`Unsupported` for an input the family's kernels do not handle.

    Args:
        x: The input tensor.
        floating_only: Also refuse integer and bool tensors.
    """
    if x.layout != torch.strided:
        raise Unsupported(f"layout {x.layout}")
    reason = refusal(x.dtype, x.device, floating_only)
    if reason is not None:
        raise Unsupported(reason)


_REFUSALS: tuple[object, dict[tuple[torch.dtype, torch.device, bool], str | None]] = (None, {})


def refusal(dtype: torch.dtype, device: torch.device, floating_only: bool) -> str | None:
    """Why the kernels refuse a tensor of ``dtype`` on ``device``, or None (cached).

    The answer depends only on these and the vendor; it is kept per (dtype, device)
    because ``device.type`` alone costs more than the lookup, and the launch path is
    paid per call. A vendor switch starts a new table.
    """
    global _REFUSALS
    vendor = gemshal.current_vendor()
    owner, table = _REFUSALS
    if owner is not vendor:
        table = {}
        _REFUSALS = (vendor, table)
    key = (dtype, device, floating_only)
    try:
        return table[key]
    except KeyError:
        reason = table[key] = _refusal(vendor, dtype, device.type, floating_only)
        return reason


def _refusal(
    vendor: VendorInfo, dtype: torch.dtype, device_type: str, floating_only: bool
) -> str | None:
    if dtype not in _SUPPORTED or (floating_only and dtype not in FLOAT_DTYPES):
        return f"dtype {dtype}"
    if device_type != vendor.device_type:
        return f"tensor on {device_type}, kernels run on {vendor.device_type}"
    reason = vendor.capabilities.refusal(dtype)
    if reason is None and not dtype.is_floating_point and not vendor.capabilities.int64:
        # Integers and bool accumulate in int64 (dtypes.acc_dtype), whatever their width.
        reason = "integer reduction needs int64 on the device"
    return reason


def check_dtype(dtype: torch.dtype) -> None:
    """Raise :class:`Unsupported` for a requested result dtype we do not produce.

    Bool results of sums and products are left to torch (they are not a count).
    """
    vendor = gemshal.current_vendor()
    try:
        reason = _DTYPE_REFUSALS[vendor, dtype]
    except KeyError:
        reason = _DTYPE_REFUSALS[vendor, dtype] = _dtype_refusal(vendor, dtype)
    if reason is not None:
        raise Unsupported(reason)


_DTYPE_REFUSALS: dict[tuple[VendorInfo, torch.dtype], str | None] = {}


def _dtype_refusal(vendor: VendorInfo, dtype: torch.dtype) -> str | None:
    if dtype not in _SUPPORTED or dtype == torch.bool:
        return f"result dtype {dtype}"
    reason = vendor.capabilities.refusal(dtype)
    if reason is None and not dtype.is_floating_point and not vendor.capabilities.int64:
        # An integer result is accumulated in int64 (dtypes.acc_dtype).
        reason = "integer result needs int64 on the device"
    return reason


def kernel_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the kernels read it: bool tensors are viewed (not copied) as uint8."""
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def wrap_dim(dim: int, ndim: int) -> int:
    """``dim`` made non-negative, raising torch's IndexError when out of range.

    A 0-dim tensor accepts dims 0 and -1, like torch.
    """
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], "
            f"but got {dim})"
        )
    return dim % rank


def dim_list(dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """The sorted, non-negative dims a reduction runs over; ``None`` or ``[]`` mean all.

    For a 0-dim tensor the result is ``()`` (nothing to reduce).

    Raises:
        IndexError: a dim out of range.
        RuntimeError: a dim listed twice (torch's message).
    """
    key = dim if dim is None or isinstance(dim, int) else tuple(dim)
    return _dim_list(key, ndim)


@functools.lru_cache(maxsize=1024)
def _dim_list(dim: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(ndim))
    seen: set[int] = set()
    for d in dims:
        w = wrap_dim(int(d), ndim)
        if w in seen:
            raise RuntimeError(f"dim {w} appears multiple times in the list of dims")
        seen.add(w)
    return tuple(sorted(seen)) if ndim else ()


def reduced_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    """The result shape of reducing ``dims`` of ``shape``."""
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


class Layout(NamedTuple):
    """The (M, N, K) problem a kernel solves; ``K == 1`` is the rows form.

    Attributes:
        src: The tensor the kernel reads (the input, or a contiguous copy of it).
        M: Outer extent (kept dims before the reduced ones, or all kept dims).
        N: Reduced extent.
        K: Inner extent, contiguous in memory (kept dims after the reduced ones).
        stride_m: Element stride between consecutive ``m``.
        stride_n: Element stride between consecutive ``n``.
    """

    src: torch.Tensor
    M: int
    N: int
    K: int
    stride_m: int
    stride_n: int


def collapse(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """Dims (outer to inner) as one (extent, stride), or None when they do not merge."""
    pairs = [(s, t) for s, t in zip(sizes, strides, strict=True) if s != 1]
    if not pairs:
        return 1, 1
    if any(s == 0 for s, _ in pairs):
        return 0, 1
    extent, stride = pairs[-1]
    span = extent * stride
    for s, t in reversed(pairs[:-1]):
        if t != span:
            return None
        extent *= s
        span = s * t
    return extent, stride


def plan(
    x: torch.Tensor, dims: Sequence[int], *, reorder: bool = True, copy: bool = True
) -> Layout | None:
    """The (M, N, K) view of ``x`` reducing ``dims``, copying only when no view exists.

    Args:
        x: The input (already through :func:`kernel_view`).
        dims: Sorted non-negative dims to reduce.
        reorder: The reduced dims may be walked in memory order rather than logical
            order (true for sums and extrema; false where a flat index is returned).
        copy: When no view exists, return a layout of a permuted contiguous copy;
            otherwise return None.
    """
    view = _view(x.shape, x.stride(), tuple(dims), reorder)
    if view is not None:
        return Layout(x, *view)
    if not copy:
        return None
    kept = [d for d in range(x.dim()) if d not in dims]
    src = x.permute(kept + sorted(dims)).contiguous()
    m = math.prod(x.shape[d] for d in kept)
    n = math.prod(x.shape[d] for d in dims)
    return Layout(src, m, n, 1, n, 1)


def view(
    shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...], reorder: bool = True
) -> tuple[int, int, int, int, int] | None:
    """(M, N, K, stride_m, stride_n) of a copy-free (M, N, K) view, or None."""
    return _view(shape, strides, dims, reorder)


@functools.lru_cache(maxsize=4096)
def _view(
    shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...], reorder: bool
) -> tuple[int, int, int, int, int] | None:
    """(M, N, K, stride_m, stride_n) of a copy-free view, or None (cached: pure)."""
    red = list(dims)
    if reorder:
        red.sort(key=lambda d: -strides[d])
    kept = [d for d in range(len(shape)) if d not in dims]
    n_view = collapse([shape[d] for d in red], [strides[d] for d in red])
    if n_view is None:
        return None
    n, sn = n_view
    whole = collapse([shape[d] for d in kept], [strides[d] for d in kept])
    if whole is not None and (sn == 1 or n <= 1 or not kept):
        return whole[0], n, 1, whole[1], sn
    # Split the kept dims into outer (m) and a contiguous inner block (k).
    for cut in range(len(kept)):
        inner = collapse([shape[d] for d in kept[cut:]], [strides[d] for d in kept[cut:]])
        if inner is None or inner[1] != 1:
            continue
        if inner[0] <= 1:
            break
        outer = collapse([shape[d] for d in kept[:cut]], [strides[d] for d in kept[:cut]])
        if outer is not None:
            return outer[0], n, inner[0], outer[1], sn
        break
    if whole is not None:
        return whole[0], n, 1, whole[1], sn
    return None


def line_layout(x: torch.Tensor, d: int) -> Layout:
    """The (M, N, K) view of ``x`` along dim ``d`` for ops whose result has ``x``'s shape.

    Such results (cumsum, softmax) are written contiguous, so the dims before ``d`` must
    form M and those after it K (contiguous in ``x`` too); ``x`` is copied when its
    strides do not allow that.
    """
    if x.dim() == 0:
        return Layout(x, 1, 1, 1, 1, 1)
    view = _line_view(x.shape, x.stride(), d)
    if view is None:
        x = x.contiguous()
        view = _line_view(x.shape, x.stride(), d)
        assert view is not None
    return Layout(x, *view)


@functools.lru_cache(maxsize=4096)
def _line_view(
    shape: tuple[int, ...], strides: tuple[int, ...], d: int
) -> tuple[int, int, int, int, int] | None:
    outer = collapse(shape[:d], strides[:d])
    inner = collapse(shape[d + 1 :], strides[d + 1 :])
    if outer is None or inner is None or (inner[0] > 1 and inner[1] != 1):
        return None
    return outer[0], shape[d], inner[0], outer[1], strides[d]


MID_WIDTH = 128
"""Typical BLOCK_K of the (M, N, K) kernels: one program covers this many outputs."""


def split(lay: Layout) -> tuple[int, int]:
    """How many programs share one reduced line of ``lay``, and the chunk each takes.

    Long lines with few programs to run them (a full reduction, ``sum(dim=0)`` of a
    tall matrix) are split so the whole device works; a second launch combines the
    partial results. Returns ``(splits, chunk)``; ``splits == 1`` means one pass.
    """
    m, n, k = lay.M, lay.N, lay.K
    if _least_chunk(m, n, k) is None:
        return 1, max(n, 1)  # split_sizes' answer, without looking up the device
    return split_sizes(m, n, k, gemshal.device_of(lay.src).multiprocessor_count)


def _least_chunk(m: int, n: int, k: int) -> int | None:
    # The fewest elements a split program of an (M, N, K) problem reads (its chunk times
    # its columns), or None when the problem's lines are too short to split. A small
    # problem is split only for lines of LONG_LINE elements or more: a middle-form
    # program's columns (BLOCK_K, as few as 4 in the tables) load side by side, so its
    # time follows the line's length alone.
    width = 1 if k == 1 else min(k, MID_WIDTH)
    if m * n * k >= SPLIT_MIN_TOTAL:
        return SPLIT_MIN_CHUNK if n * width >= 2 * SPLIT_MIN_CHUNK else None
    return SHORT_CHUNK if n >= LONG_LINE else None


def split_sizes(m: int, n: int, k: int, sms: int) -> tuple[int, int]:
    """:func:`split` for an (M, N, K) problem given by its sizes."""
    least = _least_chunk(m, n, k)
    if least is None:
        return 1, max(n, 1)
    width = 1 if k == 1 else min(k, MID_WIDTH)
    programs = m if k == 1 else m * -(-k // MID_WIDTH)
    target = SPLIT_WAVES * max(1, sms)
    if programs >= target:
        return 1, n
    want = min(-(-target // programs), n * width // least)
    chunk = -(-n // want)
    if k == 1:
        chunk = -(-chunk // SPLIT_ALIGN) * SPLIT_ALIGN
    parts = -(-n // chunk)
    return (parts, chunk) if parts > 1 else (1, n)


def part_buffer(lay: Layout, parts: int, dtype: torch.dtype) -> torch.Tensor:
    """The (M, parts, K) buffer a pass split into ``parts`` (see :func:`split`) writes."""
    return torch.empty((lay.M, parts, lay.K), dtype=dtype, device=lay.src.device)


def part_layout(lay: Layout, buf: torch.Tensor) -> Layout:
    """The layout of ``buf`` (from :func:`part_buffer`) for the launch that combines
    its parts: the parts are the reduced extent, the rest is ``lay``'s."""
    parts = buf.shape[1]
    return Layout(buf, lay.M, parts, lay.K, parts * lay.K, lay.K)

