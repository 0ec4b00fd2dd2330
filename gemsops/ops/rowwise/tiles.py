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
from gemsops.ops.rowwise.layout import Layout

__all__ = ["chunk_tile", "launch", "mid_block", "row_block", "split_bounds"]


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

    Both are :mod:`gemshal.autotune` kernels, launched through their ``launch`` with
    the arguments as one tuple; ``consts`` is passed on as it is (callers keep one dict
    per constant set and never change it). The kernels take ``(lay.src, *pointers, M,
    N[, K], stride_m, stride_n, *scalars, **consts)``; their grid is the row blocks
    (rows form) or the ``M * cdiv(K, BLOCK_K)`` column blocks, by ``parts`` along axis 1
    when given.
    """
    src, m, n, k, stride_m, stride_n = lay
    tail = () if parts is None else (parts,)
    with gemshal.device_guard(src):
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
