"""What the reduce / scan / softmax kernels share: their tile indexing and their launch.

Every kernel of the family solves one of the two problems of
:mod:`gemsops.ops.rowwise.layout`: in the rows form (``K == 1``) a program takes
BLOCK_M rows of ``x[m, n]``; in the middle form it takes BLOCK_K contiguous columns
``k`` of one ``m`` of ``x[m, n, k]`` (grid axis 0 runs over ``M * cdiv(K, BLOCK_K)``
blocks, ``m`` major). A long line may be split along ``n`` over grid axis 1 into
``parts`` chunks of CHUNK elements. The @triton.jit helpers here are that index
arithmetic, written once; Triton inlines them, so a kernel does the same loads,
stores and loops as with the lines written out in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import triton
import triton.language as tl

import gemshal
from gemsops.ops.grid import cdiv
from gemsops.ops.rowwise import layout as _layout
from gemsops.ops.rowwise.layout import Layout

__all__ = ["chunk_tile", "full_end", "launch", "line_tile", "mid_block", "row_block",
           "split_bounds", "wide_split"]


@triton.jit
def row_block(M, BLOCK_M: tl.constexpr):
    """The rows this program takes in the rows form, and which of them exist."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows, rows < M


@triton.jit
def mid_block(K, BLOCK_K: tl.constexpr):
    """The ``m`` (int64) and columns ``ks`` this program takes in the middle form, and
    which columns exist."""
    pid = tl.program_id(0)
    k_blocks = tl.cdiv(K, BLOCK_K)
    m = (pid // k_blocks).to(tl.int64)
    ks = (pid % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    return m, ks, ks < K


@triton.jit
def split_bounds(CHUNK, N):
    """This program's part of a split line: ``(part, parts, lo, hi)``, it reads [lo, hi).

    An unsplit line has one part with CHUNK == N.
    """
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    lo = part * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    return part, parts, lo, hi


@triton.jit
def chunk_tile(start, idx, hi, base, line_ok, step_n, stride_n, AXIS: tl.constexpr):
    """The tile of the chunk at ``start``: ``(n, n_ok, mask, off)``.

    ``idx`` is ``tl.arange(0, BLOCK_N)``, laid along tile axis AXIS (1 in the rows form,
    0 in the middle form); ``line_ok`` says which lines of the other axis exist and
    ``base`` (offsets or pointers) addresses their first element. ``n`` are the
    positions along the line and ``n_ok`` those before ``hi``. ``step_n`` is
    ``stride_n`` as int64: ``start * stride_n`` may pass 2**31.
    """
    n = start + idx
    n_ok = n < hi
    if AXIS == 1:
        mask = line_ok[:, None] & n_ok[None, :]
        off = base + start * step_n + idx[None, :] * stride_n
    else:
        mask = n_ok[:, None] & line_ok[None, :]
        off = base + start * step_n + idx[:, None] * stride_n
    return n, n_ok, mask, off


@triton.jit
def full_end(lo, hi, BLOCK_N: tl.constexpr):
    """Where the whole chunks of ``[lo, hi)`` end: ``[lo, full_end)`` is a whole number of
    BLOCK_N chunks, what is left (fewer than BLOCK_N) a tail."""
    return lo + (hi - lo) // BLOCK_N * BLOCK_N


@triton.jit
def line_tile(start, idx, base, line_ok, step_n, stride_n, AXIS: tl.constexpr):
    """A whole chunk's tile at ``start`` (every position before the line's end):
    ``(mask, off)`` as :func:`chunk_tile`'s, the mask saying only which lines exist, so
    it is constant along the line and never splits a vector load."""
    if AXIS == 1:
        mask = tl.broadcast_to(line_ok[:, None], (line_ok.shape[0], idx.shape[0]))
        off = base + start * step_n + idx[None, :] * stride_n
    else:
        mask = tl.broadcast_to(line_ok[None, :], (idx.shape[0], line_ok.shape[0]))
        off = base + start * step_n + idx[:, None] * stride_n
    return mask, off


def launch(
    rows_kernel: Any,
    mid_kernel: Any,
    lay: Layout,
    pointers: Sequence[Any],
    scalars: Sequence[Any],
    consts: dict[str, Any],
    parts: int | None = None,
) -> None:
    """Launch ``rows_kernel`` (``lay.K == 1``) or ``mid_kernel`` over ``lay``.

    Both are :mod:`gemshal.kernel` kernels, launched through their ``launch`` with
    the arguments as one tuple; ``consts`` is passed on as it is (callers keep one dict
    per constant set and never change it). The kernels take ``(lay.src, *pointers, M,
    N[, K], stride_m, stride_n, *scalars, **consts)``; their grid is the row blocks
    (rows form) or the ``M * cdiv(K, BLOCK_K)`` column blocks, by ``parts`` along axis 1
    when given.
    """
    src, m, n, k, stride_m, stride_n = lay
    tail = () if parts is None else (parts,)
    if k == 1:
        rows_kernel.launch(
            lambda meta: (cdiv(m, meta["BLOCK_M"]), *tail),
            (src, *pointers, m, n, stride_m, stride_n, *scalars),
            consts,
        )
    else:
        mid_kernel.launch(
            lambda meta: (m * cdiv(k, meta["BLOCK_K"]), *tail),
            (src, *pointers, m, n, k, stride_m, stride_n, *scalars),
            consts,
        )


def wide_split(lay: Layout, width: int) -> tuple[int, int]:
    """:func:`gemsops.ops.rowwise.layout.split` for kernels whose middle-form programs may
    take up to ``width`` columns (``BLOCK_K``) each: ``(splits, chunk)``.

    ``split`` counts a program as :data:`~gemsops.ops.rowwise.layout.MID_WIDTH` columns,
    so a config with wider tiles would get fewer programs than the device needs to
    reach its bandwidth (``sum(dim=0)`` of a 16384 x 16384 matrix: 17 splits, 544
    programs of 512 columns). Counting programs at ``width`` columns keeps the wide
    configs at :data:`~gemsops.ops.rowwise.layout.SPLIT_WAVES` programs per
    multiprocessor; narrow ones then get more, which costs them nothing (the partial
    results are a few megabytes at most). The rows form is ``split``'s answer.
    """
    m, n, k = lay.M, lay.N, lay.K
    if k == 1 or width <= _layout.MID_WIDTH or m * n * k < _layout.SPLIT_MIN_TOTAL:
        return _layout.split(lay)
    programs = m * -(-k // width)
    target = _layout.SPLIT_WAVES * max(1, gemshal.device_of(lay.src).multiprocessor_count)
    # As split: at least SPLIT_MIN_CHUNK elements for the narrowest program.
    want = min(-(-target // programs), n * min(k, _layout.MID_WIDTH) // _layout.SPLIT_MIN_CHUNK)
    if want <= 1:
        return _layout.split(lay)
    chunk = -(-n // want)
    parts = -(-n // chunk)
    return (parts, chunk) if parts > 1 else (1, n)
