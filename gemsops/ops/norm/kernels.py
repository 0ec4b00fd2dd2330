"""Triton kernels of the norms (see :mod:`gemsops.ops.norm.norm` for the host side).

Each kernel body serves layer norm and RMS norm (``IS_RMS``) and is jitted once per norm,
so the two are tuned separately (``layer_norm``, ``rms_norm``, ``*_backward`` entries,
and ``norm_column_sum``). Rows are walked in ``BLOCK_N`` chunks; statistics are fp32
(fp64 for fp64 inputs). A row that fits one chunk (``ONE_TILE``, set per launch from
the tuned ``BLOCK_N``) is loaded once and its statistics taken in two passes over
registers; longer rows keep a Welford pair per lane.

The backward is one pass over the rows: each program takes a contiguous slice of rows,
writes their input gradient, and sums its slice's terms of the weight and bias gradients
into one row of a ``[P, N]`` partial buffer (in registers while a row fits one chunk);
:func:`column_sum_kernel` then adds the ``P`` partial rows. x and dy are read once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import triton
import triton.language as tl

from gemshal.kernel import kernel
from gemsops.ops.grid import next_power_of_2

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
def _bwd_terms(x_ptr, dy_ptr, w, mean, rstd, mask, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
               ACC: tl.constexpr):
    # x_hat, dy and w * dy of one [BLOCK_M, BLOCK_N] tile (w: the tile's [BLOCK_N] weight).
    # Masked lanes load dy = 0, so they add nothing to any sum; masked rows have rstd = 0.
    x = tl.load(x_ptr, mask=mask, other=0.0).to(ACC)
    dy = tl.load(dy_ptr, mask=mask, other=0.0).to(ACC)
    x_hat = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
    wdy = dy * w[None, :] if HAS_W else dy
    return x_hat, dy, wdy


@triton.jit
def _dx(x_hat, wdy, c1, c2, rstd, IS_RMS: tl.constexpr):
    # dx = rstd * (w*dy - x_hat * mean(x_hat * w*dy) - mean(w*dy)); rms drops the last term.
    d = wdy - x_hat * c1[:, None]
    if not IS_RMS:
        d = d - c2[:, None]
    return d * rstd[:, None]


@triton.jit
def _add_partial(Part, c, c_ok, more, t):
    # Part[c] += column sums of tile t. Part is this program's own row of the partials,
    # so nothing races; before the program's first row block (more false) it holds nothing.
    prev = tl.where(more, tl.load(Part + c, mask=c_ok, other=0.0), 0.0)
    tl.store(Part + c, prev + tl.sum(t, 0), mask=c_ok)


@triton.jit
def _bwd_chunk(X, DY, W, x_row, dy_row, c, N, row_ok, mean, rstd, IS_RMS: tl.constexpr,
               HAS_W: tl.constexpr, ACC: tl.constexpr):
    # _bwd_terms of the chunk at columns c of a long row, its weight loaded here.
    c_ok = c < N
    w = tl.load(W + c, mask=c_ok, other=0.0).to(ACC) if HAS_W else rstd  # rstd: unused
    return _bwd_terms(x_row + c[None, :], dy_row + c[None, :], w, mean, rstd,
                      row_ok[:, None] & c_ok[None, :], IS_RMS, HAS_W, ACC)


@triton.jit
def _bwd_write(x_hat, dy, wdy, c1, c2, rstd, dx_row, DWp, DBp, c, N, row_ok, more,
               IS_RMS: tl.constexpr, HAS_DX: tl.constexpr, HAS_DW: tl.constexpr,
               HAS_DB: tl.constexpr):
    # The outputs of one chunk of a long row: its dx (from the row sums c1, c2) and its
    # terms of the partial column sums in the program's rows DWp / DBp.
    c_ok = c < N
    if HAS_DX:
        dx = _dx(x_hat, wdy, c1, c2, rstd, IS_RMS)
        tl.store(dx_row + c[None, :], dx.to(dx_row.dtype.element_ty),
                 mask=row_ok[:, None] & c_ok[None, :])
    if HAS_DW:
        _add_partial(DWp, c, c_ok, more, dy * x_hat)
    if HAS_DB:
        _add_partial(DBp, c, c_ok, more, dy)


def _bwd(DY, X, W, Mean, Rstd, DX, DW, DB, M, N, stride_dy, stride_x, stride_dx, rows_per,
         IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
         HAS_DX: tl.constexpr, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,  # outputs wanted
         ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         ONE_TILE: tl.constexpr):  # N <= BLOCK_N: a row block stays in registers
    # Program p takes rows [p * rows_per, (p + 1) * rows_per), BLOCK_M at a time: it writes
    # their dx and row p of the [P, N] partial column sums DW (of dy * x_hat) and DB (of dy).
    p = tl.program_id(0)
    lo = p * rows_per
    hi = tl.minimum(lo + rows_per, M)
    cols = tl.arange(0, BLOCK_N)
    part = p.to(tl.int64) * N
    if ONE_TILE:
        # One read of dy and x per row; the weight is read once per program and the
        # partial sums stay in registers until the program's last row.
        col_ok = cols < N
        if HAS_W:
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
        else:
            w = tl.zeros((BLOCK_N,), ACC)
        dw = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        db = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        for r0 in range(lo, hi, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)
            row_ok = rows < hi
            r64 = rows.to(tl.int64)[:, None]
            mask = row_ok[:, None] & col_ok[None, :]
            rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0).to(ACC)
            mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0).to(ACC)
            x_hat, dy, wdy = _bwd_terms(X + r64 * stride_x + cols[None, :],
                                        DY + r64 * stride_dy + cols[None, :],
                                        w, mean, rstd, mask, IS_RMS, HAS_W, ACC)
            if HAS_DX:
                c1 = tl.sum(x_hat * wdy, 1) / N
                c2 = c1 if IS_RMS else tl.sum(wdy, 1) / N
                dx = _dx(x_hat, wdy, c1, c2, rstd, IS_RMS)
                tl.store(DX + r64 * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                         mask=mask)
            if HAS_DW:
                dw += dy * x_hat
            if HAS_DB:
                db += dy
        if HAS_DW:
            tl.store(DW + part + cols, tl.sum(dw, 0), mask=col_ok)
        if HAS_DB:
            tl.store(DB + part + cols, tl.sum(db, 0), mask=col_ok)
    else:
        # Rows walked in chunks: one pass for the row sums (when dx is wanted), a second
        # that writes dx; the chunk loaded last stays in registers. The partial sums are
        # added into the program's rows of DW / DB, chunk by chunk.
        n_chunks = tl.cdiv(N, BLOCK_N)
        for r0 in range(lo, hi, BLOCK_M):
            rows = r0 + tl.arange(0, BLOCK_M)
            row_ok = rows < hi
            r64 = rows.to(tl.int64)[:, None]
            x_row = X + r64 * stride_x
            dy_row = DY + r64 * stride_dy
            dx_row = DX + r64 * stride_dx
            more = r0 > lo  # DW / DB already hold the sums of earlier row blocks
            rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0).to(ACC)
            mean = rstd if IS_RMS else tl.load(Mean + rows, mask=row_ok, other=0.0).to(ACC)
            if HAS_DX:
                s1 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
                s2 = tl.zeros((BLOCK_M, BLOCK_N), ACC)
                x_hat = tl.zeros((BLOCK_M, BLOCK_N), ACC)
                dy = tl.zeros((BLOCK_M, BLOCK_N), ACC)
                wdy = tl.zeros((BLOCK_M, BLOCK_N), ACC)
                for k in range(n_chunks):
                    c = k * BLOCK_N + cols
                    x_hat, dy, wdy = _bwd_chunk(X, DY, W, x_row, dy_row, c, N, row_ok, mean,
                                                rstd, IS_RMS, HAS_W, ACC)
                    s1 += x_hat * wdy
                    s2 += wdy
                c1 = tl.sum(s1, 1) / N
                c2 = tl.sum(s2, 1) / N
                c = (n_chunks - 1) * BLOCK_N + cols
                _bwd_write(x_hat, dy, wdy, c1, c2, rstd, dx_row, DW + part, DB + part, c, N,
                           row_ok, more, IS_RMS, HAS_DX, HAS_DW, HAS_DB)
                for k in range(n_chunks - 1):
                    c = k * BLOCK_N + cols
                    x_hat, dy, wdy = _bwd_chunk(X, DY, W, x_row, dy_row, c, N, row_ok, mean,
                                                rstd, IS_RMS, HAS_W, ACC)
                    _bwd_write(x_hat, dy, wdy, c1, c2, rstd, dx_row, DW + part, DB + part, c,
                               N, row_ok, more, IS_RMS, HAS_DX, HAS_DW, HAS_DB)
            else:
                for k in range(n_chunks):
                    c = k * BLOCK_N + cols
                    x_hat, dy, wdy = _bwd_chunk(X, DY, W, x_row, dy_row, c, N, row_ok, mean,
                                                rstd, IS_RMS, HAS_W, ACC)
                    _bwd_write(x_hat, dy, wdy, rstd, rstd, rstd, dx_row, DW + part, DB + part,
                               c, N, row_ok, more, IS_RMS, HAS_DX, HAS_DW, HAS_DB)
            if HAS_DW or HAS_DB:
                # The next row block reads back what this one's threads stored.
                tl.debug_barrier()


@kernel("norm_column_sum", key=["P", "N"])
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


def _one_tile(args: Mapping[str, Any]) -> bool:
    return bool(args["N"] <= args["BLOCK_N"])


def _narrowest(configs: Sequence[Any], name: str, need: int) -> int:
    """The widest ``name`` worth trying for ``need`` lanes: ``need`` as a power of two, or
    the smallest value any config has when none is that small."""
    return max(next_power_of_2(need), min(c.kwargs[name] for c in configs))


def _prune_forward(configs: Sequence[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """Drop configs whose chunk is wider than the row: they only mask lanes off."""
    limit = _narrowest(configs, "BLOCK_N", named_args["N"])
    return [c for c in configs if c.kwargs["BLOCK_N"] <= limit] or list(configs)


def _prune_backward(configs: Sequence[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """As :func:`_prune_forward`; then drop chunks under half the row where some config
    holds the row whole (a walked row is read twice and its partial sums go through
    memory), or under a quarter of the widest chunk where none does; then drop configs
    stepping over more rows at a time than a program has (``rows_per``, part of the
    backward's tuning key)."""
    kept = _prune_forward(configs, named_args)
    need = next_power_of_2(named_args["N"])
    widest = max(c.kwargs["BLOCK_N"] for c in kept)
    lower = need // 2 if widest >= need else widest // 4
    kept = [c for c in kept if c.kwargs["BLOCK_N"] >= lower]
    limit = _narrowest(kept, "BLOCK_M", named_args["rows_per"])
    return [c for c in kept if c.kwargs["BLOCK_M"] <= limit]


# (forward, backward) kernels by IS_RMS: one body per pass, jitted per norm so each norm
# has its own tuning entries (their costs differ).
KERNELS = {
    rms: (
        kernel(name, key=["N"], rules={"ONE_TILE": _one_tile}, prune=_prune_forward)(
            triton.jit(_fwd)),
        kernel(f"{name}_backward", key=["N", "rows_per"], rules={"ONE_TILE": _one_tile},
               prune=_prune_backward)(triton.jit(_bwd)),
    )
    for name, rms in (("layer_norm", False), ("rms_norm", True))
}
