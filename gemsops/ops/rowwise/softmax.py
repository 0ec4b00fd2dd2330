"""softmax and log_softmax over any dim, forward and backward.

A line of at most TILE_N elements (the tuned register budget) is read once and kept
in registers (BLOCK_N = next_power_of_2(N)); a longer one is read twice: an online
pass keeps the running max and the sum of exponentials rescaled to it, a second pass
writes the result. The backward reads y and the gradient the same way: once, with
``dx = y * (g - sum(g * y))`` (``g - exp(y) * sum(g)`` for log_softmax) from registers,
where the line fits; else a pass for the sum and one for dx, which keeps the last chunk
of the first in registers. ``dim`` other than the last uses the (M, N, K) view with K
contiguous, so no transpose is copied. Arithmetic is float32 (float64 for float64).
An all ``-inf`` line gives nan, like torch.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, tl_acc
from gemsops.ops.replay import replayable
from gemsops.ops.rowwise.layout import check_input, line_layout, wrap_dim
from gemsops.ops.rowwise.tiles import launch, mid_block, row_block

__all__ = ["log_softmax", "log_softmax_backward", "softmax", "softmax_backward"]


@triton.jit
def _online(m_i, l_i, x, AXIS: tl.constexpr):
    """Fold a tile into the running max ``m_i`` and sum of ``exp(x - m_i)`` along AXIS."""
    new_m = tl.maximum(m_i, tl.max(x, AXIS))
    # While a line has only seen -inf its max is -inf; shift by 0 instead so that
    # exp(-inf - -inf) does not poison the sum with nan.
    safe = tl.where(new_m == float("-inf"), 0.0, new_m)
    p = tl.exp(x - safe[:, None]) if AXIS == 1 else tl.exp(x - safe[None, :])
    return new_m, l_i * tl.exp(m_i - safe) + tl.sum(p, AXIS)


@kernel("softmax_rows", key=["M", "N"])
@triton.jit
def _softmax_rows_kernel(
    X,  # input x[m, n] at X + m * stride_m + n * stride_n
    OUT,  # (M, N) contiguous result
    M,
    N,
    stride_m,
    stride_n,
    LOG: tl.constexpr,  # log_softmax instead of softmax
    ACC: tl.constexpr,  # float32, or float64 for float64
    BLOCK_M: tl.constexpr,  # rows per program
    TILE_N: tl.constexpr,  # longest row kept whole in registers
    BLOCK_N: tl.constexpr,  # set by _block_n
    ONE_TILE: tl.constexpr,  # set by _one_tile
):
    rows, row_ok = row_block(M, BLOCK_M)
    rows64 = rows.to(tl.int64)
    x_row = X + rows64[:, None] * stride_m
    o_row = OUT + rows64[:, None] * N
    cols = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        # Padding lanes read -inf: they add exp(-inf) = 0 to the sum and are not stored.
        mask = row_ok[:, None] & (cols < N)[None, :]
        x = tl.load(x_row + cols[None, :] * stride_n, mask=mask, other=float("-inf")).to(ACC)
        z = x - tl.max(x, 1)[:, None]
        e = tl.exp(z)
        s = tl.sum(e, 1)
        y = z - tl.log(s)[:, None] if LOG else e / s[:, None]
        tl.store(o_row + cols[None, :], y, mask=mask)
    else:
        m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
        l_i = tl.zeros((BLOCK_M,), ACC)
        for start in range(0, N, BLOCK_N):
            mask = row_ok[:, None] & ((start + cols) < N)[None, :]
            ptr = x_row + (start + cols[None, :]) * stride_n
            x = tl.load(ptr, mask=mask, other=float("-inf")).to(ACC)
            m_i, l_i = _online(m_i, l_i, x, 1)
        log_l = tl.log(l_i)
        for start in range(0, N, BLOCK_N):
            mask = row_ok[:, None] & ((start + cols) < N)[None, :]
            ptr = x_row + (start + cols[None, :]) * stride_n
            z = tl.load(ptr, mask=mask, other=float("-inf")).to(ACC) - m_i[:, None]
            y = z - log_l[:, None] if LOG else tl.exp(z) / l_i[:, None]
            tl.store(o_row + start + cols[None, :], y, mask=mask)


@kernel("softmax_mid", key=["M", "N", "K"])
@triton.jit
def _softmax_mid_kernel(
    X,  # input x[m, n, k] at X + m * stride_m + n * stride_n + k
    OUT,  # (M, N, K) contiguous result
    M,
    N,
    K,
    stride_m,
    stride_n,
    LOG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_K: tl.constexpr,  # contiguous columns per program
    TILE_N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    x_base = X + m * stride_m + ks[None, :]
    o_base = OUT + m * N * K + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        mask = (ns < N)[:, None] & k_ok[None, :]
        x = tl.load(x_base + ns[:, None] * stride_n, mask=mask, other=float("-inf")).to(ACC)
        z = x - tl.max(x, 0)[None, :]
        e = tl.exp(z)
        s = tl.sum(e, 0)
        y = z - tl.log(s)[None, :] if LOG else e / s[None, :]
        tl.store(o_base + ns[:, None] * K, y, mask=mask)
    else:
        m_i = tl.full((BLOCK_K,), float("-inf"), ACC)
        l_i = tl.zeros((BLOCK_K,), ACC)
        for start in range(0, N, BLOCK_N):
            mask = ((start + ns) < N)[:, None] & k_ok[None, :]
            ptr = x_base + (start + ns[:, None]).to(tl.int64) * stride_n
            x = tl.load(ptr, mask=mask, other=float("-inf")).to(ACC)
            m_i, l_i = _online(m_i, l_i, x, 0)
        log_l = tl.log(l_i)
        for start in range(0, N, BLOCK_N):
            mask = ((start + ns) < N)[:, None] & k_ok[None, :]
            n64 = (start + ns[:, None]).to(tl.int64)
            z = tl.load(x_base + n64 * stride_n, mask=mask, other=float("-inf")).to(ACC)
            z = z - m_i[None, :]
            y = z - log_l[None, :] if LOG else tl.exp(z) / l_i[None, :]
            tl.store(o_base + n64 * K, y, mask=mask)


@kernel("softmax_backward_rows", key=["M", "N"])
@triton.jit
def _softmax_backward_rows_kernel(
    G,  # grad_output g[m, n] at G + m * stride_gm + n * stride_gn
    Y,  # forward output y[m, n] at Y + m * stride_ym + n * stride_yn
    OUT,  # (M, N) contiguous grad_input
    M,
    N,
    stride_gm,
    stride_gn,
    stride_ym,
    stride_yn,
    LOG: tl.constexpr,  # log_softmax: g - exp(y) * sum(g); softmax: y * (g - sum(g * y))
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    rows64 = rows.to(tl.int64)
    g_row = G + rows64[:, None] * stride_gm
    y_row = Y + rows64[:, None] * stride_ym
    o_row = OUT + rows64[:, None] * N
    cols = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        mask = row_ok[:, None] & (cols < N)[None, :]
        g = tl.load(g_row + cols[None, :] * stride_gn, mask=mask, other=0.0).to(ACC)
        y = tl.load(y_row + cols[None, :] * stride_yn, mask=mask, other=0.0).to(ACC)
        dx = g - tl.exp(y) * tl.sum(g, 1)[:, None] if LOG else y * (g - tl.sum(g * y, 1)[:, None])
        tl.store(o_row + cols[None, :], dx, mask=mask)
    else:
        # Two passes: the row sum, then dx. The chunk loaded last stays in registers, so
        # the second pass reads one chunk less.
        acc = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        g = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        y = tl.zeros((BLOCK_M, BLOCK_N), ACC)
        n_chunks = tl.cdiv(N, BLOCK_N)
        for k in range(n_chunks):
            n = k * BLOCK_N + cols[None, :]
            mask = row_ok[:, None] & (n < N)
            g = tl.load(g_row + n * stride_gn, mask=mask, other=0.0).to(ACC)
            if LOG:
                acc += g
            else:
                y = tl.load(y_row + n * stride_yn, mask=mask, other=0.0).to(ACC)
                acc += g * y
        s = tl.sum(acc, 1)[:, None]
        n = (n_chunks - 1) * BLOCK_N + cols[None, :]
        mask = row_ok[:, None] & (n < N)
        if LOG:  # the sum needed only g: the last chunk's y is read now
            y = tl.load(y_row + n * stride_yn, mask=mask, other=0.0).to(ACC)
        dx = g - tl.exp(y) * s if LOG else y * (g - s)
        tl.store(o_row + n, dx, mask=mask)
        for k in range(n_chunks - 1):
            n = k * BLOCK_N + cols[None, :]
            mask = row_ok[:, None] & (n < N)
            g = tl.load(g_row + n * stride_gn, mask=mask, other=0.0).to(ACC)
            y = tl.load(y_row + n * stride_yn, mask=mask, other=0.0).to(ACC)
            dx = g - tl.exp(y) * s if LOG else y * (g - s)
            tl.store(o_row + n, dx, mask=mask)


@kernel("softmax_backward_mid", key=["M", "N", "K"])
@triton.jit
def _softmax_backward_mid_kernel(
    G,  # grad_output g[m, n, k] at G + m * stride_gm + n * stride_gn + k
    Y,  # forward output y[m, n, k] at Y + m * stride_ym + n * stride_yn + k
    OUT,  # (M, N, K) contiguous grad_input
    M,
    N,
    K,
    stride_gm,
    stride_gn,
    stride_ym,
    stride_yn,
    LOG: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    g_base = G + m * stride_gm + ks[None, :]
    y_base = Y + m * stride_ym + ks[None, :]
    o_base = OUT + m * N * K + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    if ONE_TILE:
        mask = (ns < N)[:, None] & k_ok[None, :]
        g = tl.load(g_base + ns[:, None] * stride_gn, mask=mask, other=0.0).to(ACC)
        y = tl.load(y_base + ns[:, None] * stride_yn, mask=mask, other=0.0).to(ACC)
        dx = g - tl.exp(y) * tl.sum(g, 0)[None, :] if LOG else y * (g - tl.sum(g * y, 0)[None, :])
        tl.store(o_base + ns[:, None] * K, dx, mask=mask)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), ACC)
        for start in range(0, N, BLOCK_N):
            mask = ((start + ns) < N)[:, None] & k_ok[None, :]
            n64 = (start + ns[:, None]).to(tl.int64)
            g = tl.load(g_base + n64 * stride_gn, mask=mask, other=0.0).to(ACC)
            if LOG:
                acc += g
            else:
                acc += g * tl.load(y_base + n64 * stride_yn, mask=mask, other=0.0).to(ACC)
        s = tl.sum(acc, 0)[None, :]
        for start in range(0, N, BLOCK_N):
            mask = ((start + ns) < N)[:, None] & k_ok[None, :]
            n64 = (start + ns[:, None]).to(tl.int64)
            g = tl.load(g_base + n64 * stride_gn, mask=mask, other=0.0).to(ACC)
            y = tl.load(y_base + n64 * stride_yn, mask=mask, other=0.0).to(ACC)
            dx = g - tl.exp(y) * s if LOG else y * (g - s)
            tl.store(o_base + n64 * K, dx, mask=mask)


_CONSTS: dict[tuple[torch.dtype, bool], dict[str, Any]] = {}


def _consts(dtype: torch.dtype, log: bool) -> dict[str, Any]:
    """The kernels' constant keywords for ``dtype`` (one dict per key, never changed)."""
    try:
        return _CONSTS[dtype, log]
    except KeyError:
        consts = _CONSTS[dtype, log] = {"LOG": log, "ACC": tl_acc(dtype)}
        return consts


def _forward(x: Tensor, dim: int, half_to_float: bool, log: bool) -> Tensor:
    check_input(x, floating_only=True)
    if half_to_float and x.dtype != torch.float16:
        raise Unsupported("half_to_float needs a float16 input")
    d = wrap_dim(dim, x.dim())
    # empty_like with a contiguous format: torch.empty(x.shape, ...)'s result, cheaper.
    if half_to_float:
        out = torch.empty_like(x, dtype=torch.float32, memory_format=torch.contiguous_format)
    else:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    lay = line_layout(x, d)
    launch(_softmax_rows_kernel, _softmax_mid_kernel, lay, (out,), (), _consts(x.dtype, log))
    return out


def _backward(grad: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype, log: bool) -> Tensor:
    check_input(grad, floating_only=True)
    check_input(y, floating_only=True)
    if grad.dtype != y.dtype or grad.shape != y.shape or grad.device != y.device:
        raise Unsupported("grad_output and output differ in dtype, shape or device")
    # input_dtype differs from the gradient's only after a half_to_float forward.
    if input_dtype != grad.dtype and not (
        grad.dtype == torch.float32 and input_dtype == torch.float16
    ):
        raise Unsupported(f"input_dtype {input_dtype} with {grad.dtype} gradients")
    d = wrap_dim(dim, grad.dim())
    out = torch.empty_like(grad, dtype=input_dtype, memory_format=torch.contiguous_format)
    if grad.numel() == 0:
        return out
    gl, yl = line_layout(grad, d), line_layout(y, d)
    launch(
        _softmax_backward_rows_kernel,
        _softmax_backward_mid_kernel,
        gl,
        (yl.src, out),
        (yl.stride_m, yl.stride_n),
        _consts(grad.dtype, log),
    )
    return out


def _with_dtype(x: Tensor, dtype: torch.dtype | None) -> Tensor:
    check_input(x, floating_only=True)
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise Unsupported(f"dtype {dtype}")
    return x if dtype is None or dtype == x.dtype else x.to(dtype)


@op()
def softmax(x: Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``, like ``torch.softmax``.

    Args:
        x: Floating-point input.
        dim: The dim to normalise.
        dtype: Convert ``x`` to this dtype first (as torch does).
    """
    return _forward(_with_dtype(x, dtype), dim, False, False)


@op()
def log_softmax(x: Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> Tensor:
    """``x - log(sum(exp(x)))`` along ``dim``, like ``torch.log_softmax``."""
    return _forward(_with_dtype(x, dtype), dim, False, True)


@op("_softmax_backward_data.default", out="_softmax_backward_data.out")
@replayable()
def softmax_backward(
    grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype
) -> Tensor:
    """Gradient of softmax from its output: ``y * (g - sum(g * y))`` along ``dim``."""
    return _backward(grad_output, output, dim, input_dtype, False)


@op("_log_softmax_backward_data.default", out="_log_softmax_backward_data.out")
@replayable()
def log_softmax_backward(
    grad_output: Tensor, output: Tensor, dim: int, input_dtype: torch.dtype
) -> Tensor:
    """Gradient of log_softmax from its output: ``g - exp(y) * sum(g)`` along ``dim``."""
    return _backward(grad_output, output, dim, input_dtype, True)


# aten's forward overloads take half_to_float instead of a dtype; not public names.
@op("_softmax.default", out="_softmax.out", public=False)
@replayable()
def _softmax(x: Tensor, dim: int, half_to_float: bool) -> Tensor:
    """aten's ``_softmax``: softmax along ``dim``; ``half_to_float`` gives a float32
    result of a float16 input."""
    return _forward(x, dim, half_to_float, False)


@op("_log_softmax.default", out="_log_softmax.out", public=False)
@replayable()
def _log_softmax(x: Tensor, dim: int, half_to_float: bool) -> Tensor:
    """aten's ``_log_softmax``, as :func:`_softmax`."""
    return _forward(x, dim, half_to_float, True)
