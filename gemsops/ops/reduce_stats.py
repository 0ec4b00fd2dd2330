"""var_mean over any dims, in one pass, with torch's ``correction``.

Each chunk of a line is summarised as (count, mean, M2) in registers and merged into the
running summary with Chan's parallel formula
``M2 = M2_a + M2_b + delta^2 * n_a * n_b / (n_a + n_b)``, which stays accurate where
the one-pass ``E[x^2] - E[x]^2`` cancels. A split line's partial summaries (mean, M2;
the counts follow from the chunk size) are merged the same way by a second launch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.autotune import autotune
from gemsops.ops.reduce_layout import (
    Layout,
    acc_dtype,
    check_input,
    dim_list,
    plan,
    reduced_shape,
    split,
    tl_dtype,
    write_out,
)

__all__ = ["IMPLS", "var_mean"]


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
    pid_m = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_off = rows.to(tl.int64)[:, None] * stride_m
    lo = part * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    cols = tl.arange(0, BLOCK_N)
    n = tl.sum(tl.zeros((1,), ACC), 0)
    mean = tl.zeros((BLOCK_M,), ACC)
    m2 = tl.zeros((BLOCK_M,), ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        j = start + cols
        col_ok = j < hi
        mask = row_ok[:, None] & col_ok[None, :]
        off = row_off + start * step_n + cols[None, :] * stride_n
        x = tl.load(X + off, mask=mask, other=0.0).to(ACC)
        if PARTIAL:
            q = tl.load(Q_IN + off, mask=mask, other=0.0).to(ACC)
            w = tl.minimum(tl.maximum(TOTAL - j.to(tl.int64) * PART, 0), PART)
            w = tl.where(col_ok, w, 0).to(ACC)
        else:
            q = tl.zeros((BLOCK_M, BLOCK_N), ACC)
            w = col_ok.to(ACC)
        n, mean, m2 = _merge(n, mean, m2, w, x, q, 1)
    out = rows.to(tl.int64) * parts + part
    if FINAL:
        # The mean of nothing is nan (0 / 0), as in torch.
        mean = tl.where(n > 0, mean, float("nan"))
        m2 = m2 / tl.cast(DOF, ACC)
    tl.store(MEAN_OUT + out, mean, mask=row_ok)
    tl.store(VAR_OUT + out, m2, mask=row_ok)


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
    pid = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    k_blocks = tl.cdiv(K, BLOCK_K)
    m = pid // k_blocks
    ks = (pid % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    base = m.to(tl.int64) * stride_m + ks[None, :]
    lo = part * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    ns = tl.arange(0, BLOCK_N)
    n = tl.sum(tl.zeros((1,), ACC), 0)
    mean = tl.zeros((BLOCK_K,), ACC)
    m2 = tl.zeros((BLOCK_K,), ACC)
    step_n = tl.cast(stride_n, tl.int64)  # start * stride_n may pass 2**31
    for start in range(lo, hi, BLOCK_N):
        j = start + ns
        row_ok = j < hi
        mask = row_ok[:, None] & k_ok[None, :]
        off = base + start * step_n + ns[:, None] * stride_n
        x = tl.load(X + off, mask=mask, other=0.0).to(ACC)
        if PARTIAL:
            q = tl.load(Q_IN + off, mask=mask, other=0.0).to(ACC)
            w = tl.minimum(tl.maximum(TOTAL - j.to(tl.int64) * PART, 0), PART)
            w = tl.where(row_ok, w, 0).to(ACC)
        else:
            q = tl.zeros((BLOCK_N, BLOCK_K), ACC)
            w = row_ok.to(ACC)
        n, mean, m2 = _merge(n, mean, m2, w, x, q, 0)
    out = (m.to(tl.int64) * parts + part) * K + ks
    if FINAL:
        # The mean of nothing is nan (0 / 0), as in torch.
        mean = tl.where(n > 0, mean, float("nan"))
        m2 = m2 / tl.cast(DOF, ACC)
    tl.store(MEAN_OUT + out, mean, mask=k_ok)
    tl.store(VAR_OUT + out, m2, mask=k_ok)


def _launch(lay: Layout, q_in: Tensor | None, mean_out: Tensor, var_out: Tensor, parts: int,
            chunk: int, total: int, part: int, dof: float | int, acc: torch.dtype,
            final: bool) -> None:
    src, m, n, k = lay.src, lay.M, lay.N, lay.K
    consts = {"ACC": tl_dtype(acc), "PARTIAL": q_in is not None, "FINAL": final}
    q_arg = src if q_in is None else q_in
    with gemshal.device_guard(src.device):
        if k == 1:
            _var_mean_rows_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), parts)](
                src, q_arg, mean_out, var_out, m, n, lay.stride_m, lay.stride_n, chunk, total,
                part, dof, **consts,
            )
        else:
            _var_mean_mid_kernel[lambda meta: (m * triton.cdiv(k, meta["BLOCK_K"]), parts)](
                src, q_arg, mean_out, var_out, m, n, k, lay.stride_m, lay.stride_n, chunk,
                total, part, dof, **consts,
            )


def var_mean(
    x: Tensor, dim: int | Sequence[int] | None = None, *, correction: float | None = None,
    keepdim: bool = False,
) -> tuple[Tensor, Tensor]:
    """Variance and mean over ``dim`` (all dims when None or empty), like ``torch.var_mean``.

    The variance divides the sum of squared deviations by ``max(0, N - correction)``
    (``correction`` defaults to 1): no degrees of freedom give inf or nan, like torch.

    Raises:
        RuntimeError: ``x`` is not floating point (torch's message).
    """
    check_input(x)
    if not x.dtype.is_floating_point:
        raise RuntimeError("var_mean only support floating point and complex dtypes")
    dims = dim_list(dim, x.dim())
    shape = reduced_shape(x.shape, dims, keepdim)
    var = torch.empty(shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(shape, dtype=x.dtype, device=x.device)
    if var.numel() == 0:
        return var, mean
    lay = plan(x, dims)
    total = lay.N
    corr = 1 if correction is None else correction
    # An integral dof is passed as an integer so float64 keeps it exact at any size.
    dof: float | int = total - corr
    dof = dof if dof > 0 else 0
    if float(dof).is_integer():
        dof = int(dof)
    acc = acc_dtype(x.dtype)
    parts, chunk = split(lay)
    if parts == 1:
        _launch(lay, None, mean, var, 1, lay.N, total, 1, dof, acc, True)
        return var, mean
    p_mean = torch.empty((lay.M, parts, lay.K), dtype=acc, device=x.device)
    p_m2 = torch.empty((lay.M, parts, lay.K), dtype=acc, device=x.device)
    _launch(lay, None, p_mean, p_m2, parts, chunk, total, 1, 1, acc, False)
    second = Layout(p_mean, lay.M, parts, lay.K, parts * lay.K, lay.K)
    _launch(second, p_m2, mean, var, 1, parts, total, chunk, dof, acc, True)
    return var, mean


def _var_mean_out(self: Tensor, dim: Sequence[int] | None, correction: float | None,
                  keepdim: bool, out0: Tensor, out1: Tensor) -> tuple[Tensor, Tensor]:
    check_input(self)
    var, mean = var_mean(self, dim, correction=correction, keepdim=keepdim)
    return write_out(out0, var, self, out1), write_out(out1, mean, self, out0)


IMPLS: dict[str, Callable[..., Any]] = {
    "var_mean.correction": lambda self, dim=None, *, correction=None, keepdim=False: var_mean(
        self, dim, correction=correction, keepdim=keepdim),
    "var_mean.correction_out": lambda self, dim=None, *, correction=None, keepdim=False, out0,
    out1: _var_mean_out(self, dim, correction, keepdim, out0, out1),
}
"""aten overloads served by this module (merged into gemsops.ops.reduce.IMPLS)."""
