"""cumsum along any dim.

A program scans its lines in BLOCK_N chunks with ``tl.cumsum`` and carries each line's
running total into the next chunk. A long line with few siblings is cut into parts
scanned in parallel: one pass writes each part's total, a second scans those totals,
and a third scans every part again starting from the totals before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.autotune import autotune
from gemsops.errors import Unsupported
from gemsops.ops.reduce_layout import (
    Layout,
    acc_dtype,
    check_dtype,
    check_input,
    kernel_view,
    line_layout,
    split,
    tl_dtype,
    wrap_dim,
    write_out,
)

__all__ = ["IMPLS", "cumsum"]


@autotune("cumsum_rows", key=["M", "N"])
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
    pid_m = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    lo = part * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    cols = tl.arange(0, BLOCK_N)
    carry = tl.zeros((BLOCK_M,), ACC)
    if HAS_CARRY:
        # Part p starts from the total of parts 0..p-1; part 0 starts from zero.
        prev = tl.load(CARRY + rows64 * parts + tl.maximum(part - 1, 0), mask=row_ok, other=0)
        carry = tl.where(part > 0, prev.to(ACC), carry)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    total = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    for start in range(lo, hi, BLOCK_N):
        n = start + cols
        mask = row_ok[:, None] & (n < hi)[None, :]
        ptr = X + rows64[:, None] * stride_m + start * step_n
        x = tl.load(ptr + cols[None, :] * stride_n, mask=mask, other=0).to(ACC)
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


@autotune("cumsum_mid", key=["M", "N", "K"])
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
    pid = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    k_blocks = tl.cdiv(K, BLOCK_K)
    m = (pid // k_blocks).to(tl.int64)
    ks = (pid % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    lo = part * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    ns = tl.arange(0, BLOCK_N)
    carry = tl.zeros((BLOCK_K,), ACC)
    if HAS_CARRY:
        prev = tl.load(CARRY + (m * parts + tl.maximum(part - 1, 0)) * K + ks, mask=k_ok, other=0)
        carry = tl.where(part > 0, prev.to(ACC), carry)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    total = tl.zeros((BLOCK_N, BLOCK_K), ACC)
    for start in range(lo, hi, BLOCK_N):
        n = start + ns
        mask = (n < hi)[:, None] & k_ok[None, :]
        ptr = X + m * stride_m + start * step_n + ks[None, :]
        x = tl.load(ptr + ns[:, None] * stride_n, mask=mask, other=0).to(ACC)
        if TOTALS_ONLY:
            total += x
        else:
            y = tl.cumsum(x, 0) + carry[None, :]
            out = (m * N + n.to(tl.int64)[:, None]) * K + ks[None, :]
            tl.store(OUT + out, y, mask=mask)
            carry = tl.sum(tl.where(ns[:, None] == BLOCK_N - 1, y, 0), 0)
    if TOTALS_ONLY:
        tl.store(OUT + (m * parts + part) * K + ks, tl.sum(total, 0), mask=k_ok)


def _launch(lay: Layout, out: Tensor, carry: Tensor | None, parts: int, chunk: int,
            acc: torch.dtype, totals_only: bool) -> None:
    src, m, n, k = lay.src, lay.M, lay.N, lay.K
    consts = {"ACC": tl_dtype(acc), "HAS_CARRY": carry is not None, "TOTALS_ONLY": totals_only}
    carry_arg = out if carry is None else carry
    with gemshal.device_guard(src.device):
        if k == 1:
            _cumsum_rows_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), parts)](
                src, out, carry_arg, m, n, lay.stride_m, lay.stride_n, chunk, **consts
            )
        else:
            _cumsum_mid_kernel[lambda meta: (m * triton.cdiv(k, meta["BLOCK_K"]), parts)](
                src, out, carry_arg, m, n, k, lay.stride_m, lay.stride_n, chunk, **consts
            )


def cumsum(x: Tensor, dim: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """Cumulative sum along ``dim``, like ``torch.cumsum``.

    Integer and bool inputs give int64; half types accumulate in float32.

    Args:
        x: Input tensor.
        dim: The dim to scan.
        dtype: Result dtype; the input is converted to it first.
    """
    check_input(x)
    d = wrap_dim(dim, x.dim())
    out_dtype = dtype if dtype is not None else (
        x.dtype if x.dtype.is_floating_point else torch.int64)
    check_dtype(out_dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    acc = acc_dtype(out_dtype)
    exact = x.dtype in (out_dtype, torch.bool) or out_dtype == acc
    if not exact and (x.dtype.is_floating_point or out_dtype.is_floating_point):
        x = x.to(out_dtype)  # torch converts first; see reduce._reduce
    lay = line_layout(kernel_view(x), d)
    parts, chunk = split(lay)
    if parts == 1:
        _launch(lay, out, None, 1, lay.N, acc, False)
        return out
    totals = torch.empty((lay.M, parts, lay.K), dtype=acc, device=x.device)
    _launch(lay, totals, None, parts, chunk, acc, True)
    prefix = torch.empty_like(totals)
    _launch(Layout(totals, lay.M, parts, lay.K, parts * lay.K, lay.K), prefix, None, 1, parts,
            acc, False)
    _launch(lay, out, prefix, parts, chunk, acc, False)
    return out


def _cumsum_inplace(self: Tensor, dim: int, dtype: torch.dtype | None) -> Tensor:
    check_input(self)
    if (dtype is not None and dtype != self.dtype) or self.dtype == torch.bool:
        raise Unsupported("in-place cumsum to another dtype, or of bool")
    # The kernel reads a line while writing it, so scan into a new tensor first; an
    # integer tensor keeps its dtype (int64 accumulation wraps like torch's).
    if self.numel():
        write_out(self, cumsum(self, dim, dtype=self.dtype))
    return self


IMPLS: dict[str, Callable[..., Any]] = {
    "cumsum.default": lambda self, dim, *, dtype=None: cumsum(self, dim, dtype=dtype),
    "cumsum.out": lambda self, dim, *, dtype=None, out: write_out(
        out, cumsum(self, dim, dtype=dtype), self),
    "cumsum_.default": lambda self, dim, *, dtype=None: _cumsum_inplace(self, dim, dtype),
}
"""aten overloads served by this module (merged into gemsops.ops.reduce.IMPLS)."""
