"""var_mean over any dims, in one pass, with torch's ``correction``.

Each chunk of a line is summarised as (count, mean, M2) in registers and merged into the
running summary with Chan's parallel formula
``M2 = M2_a + M2_b + delta^2 * n_a * n_b / (n_a + n_b)``, which stays accurate where
the one-pass ``E[x^2] - E[x]^2`` cancels. A split line's partial summaries (mean, M2;
the counts follow from the chunk size) are merged the same way by a second launch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.autotune import autotune
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import acc_dtype, tl_dtype
from gemsops.ops.outputs import write_outs
from gemsops.ops.pointwise.types import holds_large
from gemsops.ops.rowwise.layout import (
    Layout,
    check_input,
    dim_list,
    part_buffer,
    part_layout,
    plan,
    reduced_shape,
    split,
)
from gemsops.ops.rowwise.tiles import chunk_tile, launch, mid_block, row_block, split_bounds

__all__ = ["var_mean"]


@triton.jit
def _merge(n, mean, m2, w, x, q, AXIS: tl.constexpr):
    """Merge the summaries (w, x, q) along AXIS of a tile into the running (n, mean, m2).

    ``w`` (a vector along AXIS) holds each position's count: 1 for a raw value, 0 for a
    masked lane, the part size for a partial summary; ``x`` holds means and ``q`` M2s.
    ``n`` is a scalar: every output line of a tile sees the same counts.
    """
    c = tl.sum(w, 0)
    wb = w[None, :] if AXIS == 1 else w[:, None]
    # Masked lanes load x = 0, so w * x is 0 there without a select.
    c_mean = tl.sum(wb * x, AXIS) / tl.maximum(c, 1.0)
    d = x - c_mean[:, None] if AXIS == 1 else x - c_mean[None, :]
    c_m2 = tl.sum(q + tl.where(wb > 0, wb * d * d, 0.0), AXIS)
    total = n + c
    frac = tl.where(total > 0, c / tl.maximum(total, 1.0), 0.0)
    delta = c_mean - mean
    # The mean as a weighted average rather than mean + delta * frac, so an infinite
    # mean stays infinite (inf + -inf * frac would be nan), as torch.mean's does.
    new_mean = mean * (1.0 - frac) + c_mean * frac
    return total, new_mean, m2 + c_m2 + delta * delta * n * frac


@triton.jit
def _summaries(X, Q_IN, off, mask, j, j_ok, TOTAL, PART, ACC: tl.constexpr, PARTIAL: tl.constexpr):
    """A tile as the summaries (w, x, q) :func:`_merge` takes; ``j`` are the positions
    along the line and ``j_ok`` those in it.

    Raw values count 1 each with M2 0; with PARTIAL, X and Q_IN hold partial means and
    M2s, and partial ``j`` covers PART elements, fewer for the last (TOTAL in all).
    """
    x = tl.load(X + off, mask=mask, other=0.0).to(ACC)
    if PARTIAL:
        q = tl.load(Q_IN + off, mask=mask, other=0.0).to(ACC)
        w = tl.minimum(tl.maximum(TOTAL - j.to(tl.int64) * PART, 0), PART)
        w = tl.where(j_ok, w, 0).to(ACC)
    else:
        q = tl.zeros_like(x)
        w = j_ok.to(ACC)
    return w, x, q


@triton.jit
def _store(MEAN_OUT, VAR_OUT, out, ok, n, mean, m2, DOF, ACC: tl.constexpr, FINAL: tl.constexpr):
    """Store a summary at ``out``: when FINAL as (mean, variance), else as (mean, M2)."""
    if FINAL:
        # The mean of nothing is nan (0 / 0), as in torch.
        mean = tl.where(n > 0, mean, float("nan"))
        m2 = m2 / tl.cast(DOF, ACC)
    tl.store(MEAN_OUT + out, mean, mask=ok)
    tl.store(VAR_OUT + out, m2, mask=ok)


@autotune("var_mean_rows", key=["M", "N"])
@triton.jit
def _var_mean_rows_kernel(
    X,  # values x[m, n] at X + m * stride_m + n * stride_n (partial means when PARTIAL)
    Q_IN,  # with PARTIAL: partial M2, laid out like X
    MEAN_OUT,  # (M, S) contiguous: means (final, or partial when not FINAL)
    VAR_OUT,  # (M, S) contiguous: variances when FINAL, else partial M2
    M,
    N,
    stride_m,
    stride_n,
    CHUNK,  # elements of a row one split covers (N when a row is not split)
    TOTAL,  # elements per output in the original input
    PART,  # with PARTIAL: elements behind each partial summary (the first pass's CHUNK)
    DOF,  # the variance divides M2 by this: max(0, TOTAL - correction)
    ACC: tl.constexpr,
    PARTIAL: tl.constexpr,
    FINAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    row_off = rows.to(tl.int64)[:, None] * stride_m
    cols = tl.arange(0, BLOCK_N)
    n = tl.sum(tl.zeros((1,), ACC), 0)
    mean = tl.zeros((BLOCK_M,), ACC)
    m2 = tl.zeros((BLOCK_M,), ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        j, col_ok, mask, off = chunk_tile(start, cols, hi, row_off, row_ok, step_n, stride_n, 1)
        w, x, q = _summaries(X, Q_IN, off, mask, j, col_ok, TOTAL, PART, ACC, PARTIAL)
        n, mean, m2 = _merge(n, mean, m2, w, x, q, 1)
    _store(
        MEAN_OUT, VAR_OUT, rows.to(tl.int64) * parts + part, row_ok, n, mean, m2, DOF, ACC, FINAL
    )


@autotune("var_mean_mid", key=["M", "N", "K"])
@triton.jit
def _var_mean_mid_kernel(
    X,  # values x[m, n, k] at X + m * stride_m + n * stride_n + k (partial means if PARTIAL)
    Q_IN,  # with PARTIAL: partial M2, laid out like X
    MEAN_OUT,  # (M, S, K) contiguous
    VAR_OUT,  # (M, S, K) contiguous
    M,
    N,
    K,
    stride_m,
    stride_n,
    CHUNK,
    TOTAL,
    PART,
    DOF,
    ACC: tl.constexpr,
    PARTIAL: tl.constexpr,
    FINAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    base = m * stride_m + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    n = tl.sum(tl.zeros((1,), ACC), 0)
    mean = tl.zeros((BLOCK_K,), ACC)
    m2 = tl.zeros((BLOCK_K,), ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        j, row_ok, mask, off = chunk_tile(start, ns, hi, base, k_ok, step_n, stride_n, 0)
        w, x, q = _summaries(X, Q_IN, off, mask, j, row_ok, TOTAL, PART, ACC, PARTIAL)
        n, mean, m2 = _merge(n, mean, m2, w, x, q, 0)
    _store(MEAN_OUT, VAR_OUT, (m * parts + part) * K + ks, k_ok, n, mean, m2, DOF, ACC, FINAL)


def _launch(
    lay: Layout,
    q_in: Tensor | None,
    mean_out: Tensor,
    var_out: Tensor,
    parts: int,
    chunk: int,
    total: int,
    part: int,
    dof: float | int,
    acc: torch.dtype,
    final: bool,
) -> None:
    consts = {"ACC": tl_dtype(acc), "PARTIAL": q_in is not None, "FINAL": final}
    q_arg = lay.src if q_in is None else q_in
    launch(
        _var_mean_rows_kernel,
        _var_mean_mid_kernel,
        lay,
        (q_arg, mean_out, var_out),
        (chunk, total, part, dof),
        consts,
        parts,
    )


_DOF_WARNING = (
    "var_mean(): degrees of freedom is <= 0. Correction should be strictly less than the "
    "reduction factor (input numel divided by output numel)."
)


@op("var_mean.correction")
def var_mean(
    x: Tensor,
    dim: int | Sequence[int] | None = None,
    *,
    correction: float | None = None,
    keepdim: bool = False,
) -> tuple[Tensor, Tensor]:
    """Variance and mean over ``dim`` (all dims when None or empty), like ``torch.var_mean``.

    The variance divides the sum of squared deviations by ``max(0, N - correction)``
    (``correction`` defaults to 1): no degrees of freedom give inf or nan, and torch's
    warning.

    Raises:
        RuntimeError: ``x`` is not floating point (torch's message).
        Unsupported: on the CPU, an input holding an infinity or a value huge enough
            for the squared deviations to overflow (torch's own kernel answers those).
    """
    var, mean, no_dof = _var_mean(x, dim, correction, keepdim)
    if no_dof:
        warnings.warn(_DOF_WARNING, UserWarning, stacklevel=2)
    return var, mean


def _var_mean(
    x: Tensor, dim: int | Sequence[int] | None, correction: float | None, keepdim: bool
) -> tuple[Tensor, Tensor, bool]:
    """(var, mean, whether torch warns that no degrees of freedom are left)."""
    check_input(x)
    if not x.dtype.is_floating_point:
        raise RuntimeError("var_mean only support floating point and complex dtypes")
    dims = dim_list(dim, x.dim())
    shape = reduced_shape(x.shape, dims, keepdim)
    corr = 1 if correction is None else correction
    var = torch.empty(shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(shape, dtype=x.dtype, device=x.device)
    outputs = var.numel()
    if outputs == 0:
        return var, mean, corr >= 0  # torch counts 0 elements per output here
    total = x.numel() // outputs
    acc = acc_dtype(x.dtype)
    if x.is_cpu and total and holds_large(x, math.sqrt(torch.finfo(acc).max / (4 * total))):
        # torch's CPU kernel (a Welford pass accumulating in float64) gives the mean of a
        # line holding an infinity as inf or nan by its position, and keeps huge float32
        # lines finite; off the CPU no input is read (a device sync).
        raise Unsupported("an infinite or huge input: torch's answer depends on its order")
    lay = plan(x, dims)
    assert lay is not None  # copy=True (the default): plan never returns None
    # An integral dof is passed as an integer so float64 keeps it exact at any size.
    dof: float | int = total - corr
    no_dof = dof <= 0
    dof = dof if dof > 0 else 0
    if float(dof).is_integer():
        dof = int(dof)
    parts, chunk = split(lay)
    if parts == 1:
        _launch(lay, None, mean, var, 1, lay.N, total, 1, dof, acc, True)
        return var, mean, no_dof
    p_mean = part_buffer(lay, parts, acc)
    p_m2 = part_buffer(lay, parts, acc)
    _launch(lay, None, p_mean, p_m2, parts, chunk, total, 1, 1, acc, False)
    _launch(part_layout(lay, p_mean), p_m2, mean, var, 1, parts, total, chunk, dof, acc, True)
    return var, mean, no_dof


@op("var_mean.correction_out", public=False)
def _var_mean_out(
    self: Tensor,
    dim: Sequence[int] | None = None,
    *,
    correction: float | None = None,
    keepdim: bool = False,
    out0: Tensor,
    out1: Tensor,
) -> tuple[Tensor, Tensor]:
    """aten's ``var_mean.correction_out``, declared directly rather than derived: torch's
    degrees-of-freedom warning comes after the writes, so a call the writer hands to
    torch (an ``out`` it would cast or resize) gets torch's warning alone."""
    var, mean, no_dof = _var_mean(self, dim, correction, keepdim)
    if out0.numel() and out1.numel() and _shares_storage(out0, out1):
        raise Unsupported("the two out tensors share storage")
    result = write_outs((out0, out1), (var, mean), self)
    if no_dof:
        warnings.warn(_DOF_WARNING, UserWarning, stacklevel=2)
    return result[0], result[1]


def _shares_storage(a: Tensor, b: Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
