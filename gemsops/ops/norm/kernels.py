"""Triton kernels of the norms (see :mod:`gemsops.ops.norm.norm` for the host side).

Each kernel body serves layer norm and RMS norm (``IS_RMS``) and is jitted once per norm,
so the two are tuned separately (``layer_norm``, ``rms_norm``, ``*_backward``,
``*_weight_grad`` entries). Rows are walked in ``BLOCK_N`` chunks; statistics are fp32
(fp64 for fp64 inputs). A row that fits one chunk (``ONE_TILE``, set per launch from
the tuned ``BLOCK_N``) is loaded once and its statistics taken in two passes over
registers; longer rows keep a Welford pair per lane.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from gemshal.autotune import autotune, heuristics

__all__ = ["KERNELS", "column_sum_kernel"]


@triton.jit
def _normalize(x, mean, rstd, W, B, c, N, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
               HAS_B: tl.constexpr, ACC: tl.constexpr):
    # x: [BLOCK_M, BLOCK_N] chunk at columns c; mean, rstd: [BLOCK_M] row statistics.
    # Columns past N load weight 0 / bias 0; their results are never stored.
    y = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
    if HAS_W:
        y = y * tl.load(W + c, mask=c < N, other=0.0).to(ACC)[None, :]
    if HAS_B:
        y = y + tl.load(B + c, mask=c < N, other=0.0).to(ACC)[None, :]
    return y


def _fwd(X, W, B, Y, Mean, Rstd, M, N, stride_x, stride_y, eps,
         IS_RMS: tl.constexpr,  # rms norm: no centring, statistic is mean(x^2)
         HAS_W: tl.constexpr, HAS_B: tl.constexpr,
         ACC: tl.constexpr,  # statistics type: fp32, or fp64 for fp64 inputs
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         ONE_TILE: tl.constexpr):  # N <= BLOCK_N: the row stays in registers
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M  # the last program's rows past M are computed but never stored
    x_row = X + rows.to(tl.int64)[:, None] * stride_x
    y_row = Y + rows.to(tl.int64)[:, None] * stride_y
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    if ONE_TILE:
        # Two passes over the tile in registers: the mean, then the squared deviations.
        mask = row_ok[:, None] & (cols < N)[None, :]
        x = tl.load(x_row + cols[None, :], mask=mask, other=0.0).to(ACC)
        if IS_RMS:
            mean = tl.zeros((BLOCK_M,), ACC)
            var = tl.sum(x * x, 1) / N
        else:
            mean = tl.sum(x, 1) / N
            d = tl.where(mask, x - mean[:, None], 0.0)
            var = tl.sum(d * d, 1) / N
    else:
        mean_l = tl.zeros((BLOCK_M, BLOCK_N), ACC)  # per-lane running mean
        m2_l = tl.zeros((BLOCK_M, BLOCK_N), ACC)  # per-lane sum of squared deviations (or x^2)
        x = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        one = tl.full((), 1.0, ACC)
        for k in range(n_chunks):
            c = k * BLOCK_N + cols
            mask = row_ok[:, None] & (c < N)[None, :]
            x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(ACC)
            if IS_RMS:
                m2_l += x * x
            else:
                # Lanes past N in the last chunk keep their state (their count is one
                # less). One division per chunk, not per element.
                inv = one / (k + 1)
                delta = x - mean_l
                mean_l += tl.where(mask, delta * inv, 0.0)
                m2_l += tl.where(mask, delta * (x - mean_l), 0.0)
        if IS_RMS:
            mean = tl.zeros((BLOCK_M,), ACC)
            var = tl.sum(m2_l, 1) / N
        else:
            # Combine the lanes: lane j saw cdiv(N - j, BLOCK_N) elements of its row.
            cnt = ((N - cols + BLOCK_N - 1) // BLOCK_N).to(ACC)[None, :]
            mean = tl.sum(mean_l * cnt, 1) / N
            d = mean_l - mean[:, None]
            var = tl.sum(m2_l + cnt * d * d, 1) / N
    # A row holding an infinity has an infinite statistic: its rstd is 0, as torch's
    # rsqrt gives (the GPU's fast reciprocal of inf is not relied on).
    rstd = tl.where(var == float("inf"), 0.0, 1.0 / tl.sqrt(var + eps))
    if not IS_RMS:
        tl.store(Mean + rows, mean.to(Mean.dtype.element_ty), mask=row_ok)
    tl.store(Rstd + rows, rstd.to(Rstd.dtype.element_ty), mask=row_ok)

    # The last chunk is still in registers; normalize it, then reload the others.
    c = (n_chunks - 1) * BLOCK_N + cols
    y = _normalize(x, mean, rstd, W, B, c, N, IS_RMS, HAS_W, HAS_B, ACC)
    tl.store(y_row + c[None, :], y.to(Y.dtype.element_ty), mask=row_ok[:, None] & (c < N)[None, :])
    for k in range(n_chunks - 1):
        c = k * BLOCK_N + cols
        mask = row_ok[:, None] & (c < N)[None, :]
        x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(ACC)
        y = _normalize(x, mean, rstd, W, B, c, N, IS_RMS, HAS_W, HAS_B, ACC)
        tl.store(y_row + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_terms(W, x_row, dy_row, mean, rstd, c, N, mask, IS_RMS: tl.constexpr,
               HAS_W: tl.constexpr, ACC: tl.constexpr):
    # x_hat and w * dy of one chunk; masked lanes give 0 for w * dy.
    x = tl.load(x_row + c[None, :], mask=mask, other=0.0).to(ACC)
    wdy = tl.load(dy_row + c[None, :], mask=mask, other=0.0).to(ACC)
    if HAS_W:
        wdy = wdy * tl.load(W + c, mask=c < N, other=0.0).to(ACC)[None, :]
    x_hat = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
    return x_hat, wdy


def _bwd(DY, X, W, Mean, Rstd, DX, M, N, stride_dy, stride_x, stride_dx,
         IS_RMS: tl.constexpr, HAS_W: tl.constexpr, ACC: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # dx = rstd * (w*dy - x_hat * mean(x_hat * w*dy) - mean(w*dy)); rms drops the last term.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    x_row = X + rows.to(tl.int64)[:, None] * stride_x
    dy_row = DY + rows.to(tl.int64)[:, None] * stride_dy
    dx_row = DX + rows.to(tl.int64)[:, None] * stride_dx
    rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0).to(ACC)
    mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0).to(ACC)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    s1 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    s2 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    x_hat = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    wdy = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    for k in range(n_chunks):
        c = k * BLOCK_N + cols
        mask = row_ok[:, None] & (c < N)[None, :]
        x_hat, wdy = _bwd_terms(W, x_row, dy_row, mean, rstd, c, N, mask, IS_RMS, HAS_W, ACC)
        s1 += x_hat * wdy
        s2 += wdy
    c1 = (tl.sum(s1, 1) / N)[:, None]
    c2 = tl.zeros((BLOCK_M, 1), ACC) if IS_RMS else (tl.sum(s2, 1) / N)[:, None]
    c = (n_chunks - 1) * BLOCK_N + cols
    dx = (wdy - (x_hat * c1 + c2)) * rstd[:, None]
    tl.store(dx_row + c[None, :], dx.to(DX.dtype.element_ty),
             mask=row_ok[:, None] & (c < N)[None, :])
    for k in range(n_chunks - 1):
        c = k * BLOCK_N + cols
        mask = row_ok[:, None] & (c < N)[None, :]
        x_hat, wdy = _bwd_terms(W, x_row, dy_row, mean, rstd, c, N, mask, IS_RMS, HAS_W, ACC)
        dx = (wdy - (x_hat * c1 + c2)) * rstd[:, None]
        tl.store(dx_row + c[None, :], dx.to(DX.dtype.element_ty), mask=mask)


def _wgrad(DY, X, Mean, Rstd, DW, DB, M, N, stride_dy, stride_x, rows_per,
           IS_RMS: tl.constexpr, HAS_DB: tl.constexpr, ACC: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Partial column sums of dy * x_hat (and dy) over rows [p * rows_per, (p+1) * rows_per):
    # DW / DB are [P, N] fp32 buffers, row p written by the programs of grid axis 1 = p.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    p = tl.program_id(1)
    lo = p * rows_per
    hi = min(lo + rows_per, M)
    dw = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    db = tl.zeros((BLOCK_M, BLOCK_N), ACC)
    for r0 in range(lo, hi, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_ok = rows < hi
        mask = row_ok[:, None] & col_ok[None, :]  # masked lanes load dy = 0: no contribution
        r64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + r64 * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + r64 * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
        rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0).to(ACC)[:, None]
        if IS_RMS:
            dw += dy * x * rstd
        else:
            mean = tl.load(Mean + rows, mask=row_ok, other=0.0).to(ACC)[:, None]
            dw += dy * (x - mean) * rstd
        if HAS_DB:
            db += dy
    out = p.to(tl.int64) * N + cols
    tl.store(DW + out, tl.sum(dw, 0), mask=col_ok)
    if HAS_DB:
        tl.store(DB + out, tl.sum(db, 0), mask=col_ok)


@autotune("norm_column_sum", key=["P", "N"])
@triton.jit
def column_sum_kernel(Part, Out, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # Out[j] = sum over p of Part[p, j] (Part: [P, N] fp32/fp64 partials, contiguous).
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_P, BLOCK_N), Part.dtype.element_ty)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & (cols < N)[None, :]
        acc += tl.load(Part + rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(Out + cols, tl.sum(acc, 0).to(Out.dtype.element_ty), mask=cols < N)


def _one_tile(args: dict[str, Any]) -> bool:
    return bool(args["N"] <= args["BLOCK_N"])


# (forward, backward, weight-grad) kernels by IS_RMS: one body per pass, jitted per norm
# so each norm has its own tuning entries (their costs differ).
KERNELS = {
    rms: (
        autotune(name, key=["N"])(heuristics(name, ONE_TILE=_one_tile)(triton.jit(_fwd))),
        autotune(f"{name}_backward", key=["N"])(triton.jit(_bwd)),
        autotune(f"{name}_weight_grad", key=["N"])(triton.jit(_wgrad)),
    )
    for name, rms in (("layer_norm", False), ("rms_norm", True))
}
