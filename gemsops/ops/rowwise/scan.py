"""cumsum along any dim.

A program scans its lines in BLOCK_N chunks with ``tl.cumsum`` and carries each line's
running total into the next chunk. A long line with few siblings is cut into parts
scanned in parallel: one pass writes each part's total, a second scans those totals,
and a third scans every part again starting from the totals before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import acc_dtype
from gemsops.ops.outputs import write_inplace, write_out
from gemsops.ops.rowwise.layout import (
    Layout,
    check_dtype,
    check_input,
    kernel_view,
    line_layout,
    part_buffer,
    part_layout,
    split,
    tl_dtype,
    wrap_dim,
)
from gemsops.ops.rowwise.tiles import chunk_tile, launch, mid_block, row_block, split_bounds

__all__ = ["cumsum"]


@kernel("cumsum_rows", key=["M", "N"])
@triton.jit
def _cumsum_rows_kernel(
    X,  # input x[m, n] at X + m * stride_m + n * stride_n
    OUT,  # (M, N) contiguous result; with TOTALS_ONLY, (M, S) part totals
    CARRY,  # with HAS_CARRY: (M, S) inclusive prefix of the part totals
    M,
    N,
    stride_m,
    stride_n,
    CHUNK,  # elements of a row one part covers (N when a row is not split)
    ACC: tl.constexpr,  # accumulator dtype
    HAS_CARRY: tl.constexpr,
    TOTALS_ONLY: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    carry = tl.zeros((BLOCK_M,), ACC)
    if HAS_CARRY:
        # Part p starts from the total of parts 0..p-1; part 0 starts from zero.
        prev = tl.load(CARRY + rows64 * parts + tl.maximum(part - 1, 0), mask=row_ok, other=0)
        carry = tl.where(part > 0, prev.to(ACC), carry)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    total = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    row_ptr = X + rows64[:, None] * stride_m
    for start in range(lo, hi, BLOCK_N):
        n, _, mask, ptr = chunk_tile(start, cols, hi, row_ptr, row_ok, step_n, stride_n, 1)
        x = tl.load(ptr, mask=mask, other=0).to(ACC)
        if TOTALS_ONLY:
            total += x
        else:
            y = tl.cumsum(x, 1) + carry[:, None]
            tl.store(OUT + rows64[:, None] * N + n[None, :], y, mask=mask)
            # The next chunk starts from this one's last prefix (padding adds 0). Taking
            # it from y, not as carry + sum(x), also sidesteps a Triton 3.6 compiler
            # crash on a reduction added to a loop-carried value that the loop reads.
            carry = tl.sum(tl.where(cols[None, :] == BLOCK_N - 1, y, 0), 1)
    if TOTALS_ONLY:
        tl.store(OUT + rows64 * parts + part, tl.sum(total, 1), mask=row_ok)


@kernel("cumsum_mid", key=["M", "N", "K"])
@triton.jit
def _cumsum_mid_kernel(
    X,  # input x[m, n, k] at X + m * stride_m + n * stride_n + k
    OUT,  # (M, N, K) contiguous result; with TOTALS_ONLY, (M, S, K) part totals
    CARRY,  # with HAS_CARRY: (M, S, K) inclusive prefix of the part totals
    M,
    N,
    K,
    stride_m,
    stride_n,
    CHUNK,
    ACC: tl.constexpr,
    HAS_CARRY: tl.constexpr,
    TOTALS_ONLY: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    ns = tl.arange(0, BLOCK_N)
    carry = tl.zeros((BLOCK_K,), ACC)
    if HAS_CARRY:
        prev = tl.load(CARRY + (m * parts + tl.maximum(part - 1, 0)) * K + ks, mask=k_ok, other=0)
        carry = tl.where(part > 0, prev.to(ACC), carry)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    total = tl.zeros((BLOCK_N, BLOCK_K), ACC)
    base = X + m * stride_m + ks[None, :]
    for start in range(lo, hi, BLOCK_N):
        n, _, mask, ptr = chunk_tile(start, ns, hi, base, k_ok, step_n, stride_n, 0)
        x = tl.load(ptr, mask=mask, other=0).to(ACC)
        if TOTALS_ONLY:
            total += x
        else:
            y = tl.cumsum(x, 0) + carry[None, :]
            out = (m * N + n.to(tl.int64)[:, None]) * K + ks[None, :]
            tl.store(OUT + out, y, mask=mask)
            carry = tl.sum(tl.where(ns[:, None] == BLOCK_N - 1, y, 0), 0)
    if TOTALS_ONLY:
        tl.store(OUT + (m * parts + part) * K + ks, tl.sum(total, 0), mask=k_ok)


def _launch(
    lay: Layout,
    out: Tensor,
    carry: Tensor | None,
    parts: int,
    chunk: int,
    acc: torch.dtype,
    totals_only: bool,
) -> None:
    consts = {"ACC": tl_dtype(acc), "HAS_CARRY": carry is not None, "TOTALS_ONLY": totals_only}
    carry_arg = out if carry is None else carry
    launch(_cumsum_rows_kernel, _cumsum_mid_kernel, lay, (out, carry_arg), (chunk,), consts, parts)


@op("cumsum.default", out="cumsum.out", inplace="cumsum_.default")
def cumsum(
    x: Tensor,
    dim: int,
    *,
    dtype: torch.dtype | None = None,
    out: Tensor | None = None,
    inplace: bool = False,
) -> Tensor:
    """Cumulative sum along ``dim``, like ``torch.cumsum``.

    Integer and bool inputs give int64; half types accumulate in float32.

    Args:
        x: Input tensor.
        dim: The dim to scan.
        dtype: Result dtype; the input is converted to it first.
        out: Write the result here (aten's ``out=``; with ``inplace``, ``x`` itself).
        inplace: ``x.cumsum_(dim)``: the result keeps ``x``'s dtype (an integer tensor's
            int64 accumulation wraps like torch's). Another ``dtype`` and bool tensors
            are torch's to refuse.

    Raises:
        Unsupported: an input or ``out`` the kernels do not take (torch's kernel serves
            it); ``out`` is not written then.
    """
    check_input(x)
    if inplace:
        if (dtype is not None and dtype != x.dtype) or x.dtype == torch.bool:
            raise Unsupported("in-place cumsum to another dtype, or of bool")
        dtype = x.dtype
    result = _cumsum(x, dim, dtype)
    if out is None:
        return result
    # The kernel reads a line while writing it, so even in place the scan goes into a
    # new tensor first and is copied.
    return write_inplace(out, result) if inplace else write_out(out, result, x)


def _cumsum(x: Tensor, dim: int, dtype: torch.dtype | None) -> Tensor:
    d = wrap_dim(dim, x.dim())
    out_dtype = (
        dtype if dtype is not None else (x.dtype if x.dtype.is_floating_point else torch.int64)
    )
    check_dtype(out_dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    acc = acc_dtype(out_dtype)
    exact = x.dtype in (out_dtype, torch.bool) or out_dtype == acc
    if not exact and (x.dtype.is_floating_point or out_dtype.is_floating_point):
        x = x.to(out_dtype)  # torch converts first; see value.reduce
    lay = line_layout(kernel_view(x), d)
    parts, chunk = split(lay)
    if parts == 1:
        _launch(lay, out, None, 1, lay.N, acc, False)
        return out
    totals = part_buffer(lay, parts, acc)
    _launch(lay, totals, None, parts, chunk, acc, True)
    prefix = torch.empty_like(totals)
    _launch(part_layout(lay, totals), prefix, None, 1, parts, acc, False)
    _launch(lay, out, prefix, parts, chunk, acc, False)
    return out
