"""var_mean over any dims, in one pass, with torch's ``correction``.

Each lane of a tile keeps its own running (count, mean, M2) over the values it sees as
the kernel walks the line: a Welford update per element, with no reduction across
lanes inside the loop. Every lane of a whole chunk gains one value, so the counts and
the update's weights are one scalar per chunk; only the last, partial chunk (and the
partial summaries of a second pass, merged with Chan's parallel formula
``M2 = M2_a + M2_b + delta^2 * n_a * n_b / (n_a + n_b)``) need counts per lane. At the
end the lanes' summaries give the line's as ``mean = sum(n_i mean_i) / n`` and
``M2 = sum(M2_i + n_i (mean_i - mean)^2)``: three sums across lanes, accurate where the
one-pass ``E[x^2] - E[x]^2`` cancels. A split line's partial summaries (mean, M2; the
counts follow from the chunk size) are merged by a second launch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
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
from gemsops.ops.rowwise.tiles import (
    chunk_tile,
    full_end,
    launch,
    line_tile,
    mid_block,
    row_block,
    split_bounds,
)

__all__ = ["var_mean"]


@triton.jit
def _merge_lanes(cnt, mean, m2, w, x, q, AXIS: tl.constexpr):
    """Merge the summaries (w, x, q) of a tile into the lanes' running (cnt, mean, m2).

    ``w`` and ``cnt`` are vectors along the line axis AXIS (every line of a tile sees the
    same counts): ``w`` is 1 for a raw value, 0 for a masked lane, the part size for a
    partial summary; ``x`` holds values or means and ``q`` M2s.
    """
    total = cnt + w
    frac = w / tl.maximum(total, 1.0)
    gain = cnt * frac  # n_a * n_b / (n_a + n_b), per unit of n_b
    if AXIS == 1:
        fb = frac[None, :]
        gb = gain[None, :]
        wb = w[None, :]
    else:
        fb = frac[:, None]
        gb = gain[:, None]
        wb = w[:, None]
    d = x - mean
    # Lanes without a new value keep theirs (a masked x is 0, an infinite mean stays).
    mean = tl.where(wb > 0, mean * (1.0 - fb) + x * fb, mean)
    m2 = m2 + tl.where(wb > 0, q + d * d * gb, 0.0)
    return total, mean, m2


@triton.jit
def _summaries(X, Q_IN, off, mask, j, j_ok, TOTAL, PART, ACC: tl.constexpr, PARTIAL: tl.constexpr):
    """A tile as the summaries (w, x, q) :func:`_merge_lanes` takes; ``j`` are the
    positions along the line and ``j_ok`` those in it.

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
def _lanes(X, Q_IN, base, lo, hi, line_ok, idx, step_n, stride_n, TOTAL, PART,
           ACC: tl.constexpr, PARTIAL: tl.constexpr, AXIS: tl.constexpr,
           LINES: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(count, mean - shift, M2, shift)`` of each of the tile's LINES lines over
    positions [lo, hi).

    Each lane keeps its own summary, merged across lanes at the end (:func:`_combine`).
    Raw values are shifted by their line's first value, so a large common offset
    (1e4 + noise) costs no digits, then run Welford's update with the scalar weights of
    whole chunks and one masked step for the tail; partial summaries (PARTIAL, shift 0)
    merge with per-lane weights throughout.
    """
    if AXIS == 1:
        mean = tl.zeros((LINES, BLOCK_N), ACC)
        first = base + tl.zeros((LINES, 1), tl.int32)
        first_ok = line_ok[:, None]
    else:
        mean = tl.zeros((BLOCK_N, LINES), ACC)
        first = base + tl.zeros((1, LINES), tl.int32)
        first_ok = line_ok[None, :]
    m2 = tl.zeros_like(mean)
    cnt = tl.zeros((BLOCK_N,), ACC)
    if not PARTIAL:
        # Every part of a split line shifts by the line's first value, so the partial
        # means stay small (exact in float32) until the second pass adds it back.
        # (A line of no elements has no first value: its mask is all off.)
        shift = tl.load(X + first, mask=first_ok & ((first * 0 + hi) > 0), other=0.0).to(ACC)
        # An infinite or nan first value is no offset (inf - inf would make the mean nan).
        shift = tl.where(shift - shift == 0, shift, 0.0)
        k = tl.sum(tl.zeros((1,), ACC), 0)  # a 0-d ACC: the count of every lane so far
        for start in range(lo, full_end(lo, hi, BLOCK_N), BLOCK_N):
            mask, off = line_tile(start, idx, base, line_ok, step_n, stride_n, AXIS)
            x = tl.load(X + off, mask=mask, other=0.0).to(ACC) - shift
            k += 1.0
            frac = 1.0 / k
            d = x - mean
            mean = mean * (1.0 - frac) + x * frac
            m2 += d * (d * ((k - 1.0) * frac))
        cnt += k
        tail = full_end(lo, hi, BLOCK_N)
        if tail < hi:  # the last, partial chunk: its lanes past hi are masked (w = 0)
            j, j_ok, mask, off = chunk_tile(tail, idx, hi, base, line_ok, step_n, stride_n,
                                            AXIS)
            w, x, q = _summaries(X, Q_IN, off, mask, j, j_ok, TOTAL, PART, ACC, False)
            cnt, mean, m2 = _merge_lanes(cnt, mean, m2, w, x - shift, q, AXIS)
        n, line_mean, line_m2 = _combine(cnt, mean, m2, AXIS)
        line_shift = tl.sum(shift, AXIS)  # as a vector over the lines
    else:
        for start in range(lo, hi, BLOCK_N):
            j, j_ok, mask, off = chunk_tile(start, idx, hi, base, line_ok, step_n, stride_n,
                                            AXIS)
            w, x, q = _summaries(X, Q_IN, off, mask, j, j_ok, TOTAL, PART, ACC, True)
            cnt, mean, m2 = _merge_lanes(cnt, mean, m2, w, x, q, AXIS)
        n, line_mean, line_m2 = _combine(cnt, mean, m2, AXIS)
        line_shift = tl.zeros(line_mean.shape, ACC)
    return n, line_mean, line_m2, line_shift


@triton.jit
def _combine(cnt, mean, m2, AXIS: tl.constexpr):
    """The lines' (count, mean, M2) from their lanes': ``mean = sum(n_i mean_i) / n`` and
    ``M2 = sum(M2_i + n_i (mean_i - mean)^2)``, exact and stable (the deviations of the
    lane means from the line's are small), in three sums across lanes. The weighted
    sum keeps an infinite mean infinite, as torch.mean's is; lanes without values
    (``n_i = 0``) add nothing."""
    n = tl.sum(cnt, 0)
    if AXIS == 1:  # noqa: SIM108 - a static if in Triton, not a select
        cb = cnt[None, :]
    else:
        cb = cnt[:, None]
    line_mean = tl.sum(tl.where(cb > 0, cb * mean, 0.0), AXIS) / tl.maximum(n, 1.0)
    if AXIS == 1:  # noqa: SIM108 - a static if in Triton, not a select
        d = mean - line_mean[:, None]
    else:
        d = mean - line_mean[None, :]
    return n, line_mean, tl.sum(tl.where(cb > 0, m2 + cb * d * d, 0.0), AXIS)


@triton.jit
def _store(MEAN_OUT, VAR_OUT, SHIFT, out, line, ok, part, n, mean, m2, shift, DOF,
           ACC: tl.constexpr, PARTIAL: tl.constexpr, FINAL: tl.constexpr):
    """Store a line's summary at ``out``: when FINAL as (mean, variance), else as (mean
    less the line's shift, M2), part 0 also storing the shift at SHIFT + line; a second
    pass (PARTIAL) adds the shift stored there back to the mean."""
    if PARTIAL:
        mean += tl.load(SHIFT + line, mask=ok, other=0.0)
    elif FINAL:
        mean += shift
    else:
        tl.store(SHIFT + line, shift, mask=ok & ((line * 0 + part) == 0))
    if FINAL:
        # The mean of nothing is nan (0 / 0), as in torch.
        mean = tl.where(n > 0, mean, float("nan"))
        m2 = m2 / tl.cast(DOF, ACC)
    tl.store(MEAN_OUT + out, mean, mask=ok)
    tl.store(VAR_OUT + out, m2, mask=ok)


@kernel("var_mean_rows", key=["M", "N"])
@triton.jit
def _var_mean_rows_kernel(
    X,  # values x[m, n] at X + m * stride_m + n * stride_n (partial means when PARTIAL)
    Q_IN,  # with PARTIAL: partial M2, laid out like X
    MEAN_OUT,  # (M, S) contiguous: means (final, or partial less the shift if not FINAL)
    VAR_OUT,  # (M, S) contiguous: variances when FINAL, else partial M2
    SHIFT,  # (M,): each row's shift, written by a split's first pass, read by its second
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
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    n, mean, m2, shift = _lanes(X, Q_IN, row_off, lo, hi, row_ok, cols, step_n, stride_n,
                                TOTAL, PART, ACC, PARTIAL, 1, BLOCK_M, BLOCK_N)
    _store(MEAN_OUT, VAR_OUT, SHIFT, rows.to(tl.int64) * parts + part, rows, row_ok, part,
           n, mean, m2, shift, DOF, ACC, PARTIAL, FINAL)


@kernel("var_mean_mid", key=["M", "N", "K"])
@triton.jit
def _var_mean_mid_kernel(
    X,  # values x[m, n, k] at X + m * stride_m + n * stride_n + k (partial means if PARTIAL)
    Q_IN,  # with PARTIAL: partial M2, laid out like X
    MEAN_OUT,  # (M, S, K) contiguous
    VAR_OUT,  # (M, S, K) contiguous
    SHIFT,  # (M, K): each line's shift (see the rows kernel)
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
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    n, mean, m2, shift = _lanes(X, Q_IN, base, lo, hi, k_ok, ns, step_n, stride_n, TOTAL,
                                PART, ACC, PARTIAL, 0, BLOCK_K, BLOCK_N)
    _store(MEAN_OUT, VAR_OUT, SHIFT, (m * parts + part) * K + ks, m * K + ks, k_ok, part,
           n, mean, m2, shift, DOF, ACC, PARTIAL, FINAL)


def _launch(
    lay: Layout,
    q_in: Tensor | None,
    mean_out: Tensor,
    var_out: Tensor,
    shift: Tensor | None,
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
        (q_arg, mean_out, var_out, mean_out if shift is None else shift),
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
        _launch(lay, None, mean, var, None, 1, lay.N, total, 1, dof, acc, True)
        return var, mean, no_dof
    p_mean = part_buffer(lay, parts, acc)
    p_m2 = part_buffer(lay, parts, acc)
    shift = torch.empty((lay.M, lay.K), dtype=acc, device=x.device)
    _launch(lay, None, p_mean, p_m2, shift, parts, chunk, total, 1, 1, acc, False)
    _launch(part_layout(lay, p_mean), p_m2, mean, var, shift, 1, parts, total, chunk, dof, acc,
            True)
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
