"""The persistent tensor-descriptor matmul: mm, addmm and bmm on devices that have
``tensor_descriptors`` (Hopper and later on NVIDIA).

One program per multiprocessor (or two, ``OCCUPANCY``) walks the output tiles in grouped
order (neighbouring tiles share operand rows and columns in L2). Operand tiles are
fetched through tensor descriptors, so the copy engine moves them into shared memory
while the tensor cores work on the previous ones; the result tile is written back
through a descriptor as well. The epilogue fuses ``alpha``, the addmm term (a bias row
for linear layers) and the cast to the output type. Operands may be transposed views
(linear's ``weight.t()``, attention's ``k.transpose(-2, -1)``): the descriptor is built
over the transposed matrix and the tile is transposed in registers, so nothing is
copied.

A descriptor needs a 16-byte aligned base, a unit stride in its last dimension and
16-byte aligned other strides; :func:`eligible` checks this, and the caller falls back to
the portable kernel (:mod:`gemsops.ops.matmul.mm`) otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.kernel import kernel
from gemsops.ops.grid import cdiv

__all__ = ["eligible", "grouped_tile", "launch", "plan"]

_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _descriptor(
    base, batch, rows, cols, stride_b, stride_r,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BATCHED: tl.constexpr,
):
    # A [rows, cols] matrix (per batch entry) with unit column stride.
    if BATCHED:
        return tl.make_tensor_descriptor(base, shape=[batch, rows, cols],
                                         strides=[stride_b, stride_r, 1],
                                         block_shape=[1, BLOCK_R, BLOCK_C])
    else:
        return tl.make_tensor_descriptor(base, shape=[rows, cols], strides=[stride_r, 1],
                                         block_shape=[BLOCK_R, BLOCK_C])


@triton.jit
def _load(desc, b, r, c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BATCHED: tl.constexpr):
    if BATCHED:
        return desc.load([b, r, c]).reshape(BLOCK_R, BLOCK_C)
    else:
        return desc.load([r, c])


@triton.jit
def _store(desc, b, r, c, tile, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
           BATCHED: tl.constexpr):
    if BATCHED:
        desc.store([b, r, c], tile.reshape(1, BLOCK_R, BLOCK_C))
    else:
        desc.store([r, c], tile)


@triton.jit
def _operand_descriptor(
    base, batch, rows, cols, stride_b, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    BATCHED: tl.constexpr, TRANSPOSED: tl.constexpr, DESC: tl.constexpr,
):
    # The descriptor of a [rows, cols] operand, stored [cols, rows] when TRANSPOSED (0
    # when it is read through pointers).
    if not DESC:
        return 0
    elif TRANSPOSED:
        return _descriptor(base, batch, cols, rows, stride_b, stride, BLOCK_C, BLOCK_R,
                           BATCHED)
    else:
        return _descriptor(base, batch, rows, cols, stride_b, stride, BLOCK_R, BLOCK_C,
                           BATCHED)


@triton.jit
def _operand_tile(
    desc, base, b, r, c, rows, cols, stride_b, stride, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr, BATCHED: tl.constexpr, TRANSPOSED: tl.constexpr,
    DESC: tl.constexpr,
):
    # The [BLOCK_R, BLOCK_C] tile at (r, c) of a [rows, cols] operand: through its
    # descriptor (transposed in registers when it is stored [cols, rows]), or through
    # pointers. Rows and columns past the edge arrive as zeros either way.
    if DESC:
        if TRANSPOSED:
            return _load(desc, b, c, r, BLOCK_C, BLOCK_R, BATCHED).T
        else:
            return _load(desc, b, r, c, BLOCK_R, BLOCK_C, BATCHED)
    else:
        rr = r + tl.arange(0, BLOCK_R)
        cc = c + tl.arange(0, BLOCK_C)
        base = base + b.to(tl.int64) * stride_b
        if TRANSPOSED:
            ptrs = base + rr[:, None] + cc[None, :].to(tl.int64) * stride
        else:
            ptrs = base + rr[:, None].to(tl.int64) * stride + cc[None, :]
        return tl.load(ptrs, mask=(rr[:, None] < rows) & (cc[None, :] < cols), other=0.0)


@triton.jit
def grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(batch, tile row, tile column) of linear tile number ``tile`` of a batch of
    ``tiles_m x tiles_n`` tile grids: within one batch entry, tile rows go in groups of
    ``GROUP_M``, so consecutive tiles share B's columns and A's rows in L2."""
    per_batch = tiles_m * tiles_n
    b = tile // per_batch
    t = tile % per_batch
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (t % width) % rows
    pid_n = (t % width) // rows
    return b, pid_m, pid_n


# Each operand layout and epilogue is its own tuning problem: a config that fits shared
# memory for one (no bias) may not for another (a bias tile too).
@kernel("mm_persistent",
        key=["M", "N", "K", "A_T", "B_T", "BATCHED", "HAS_BIAS", "A_DESC", "B_DESC", "C_DESC"])
@triton.jit
def _mm_persistent_kernel(
    A,  # [batch, M, K]: K contiguous, or M contiguous when A_T
    B,  # [batch, K, N]: N contiguous, or K contiguous when B_T
    C,  # [batch, M, N], N contiguous
    Bias,  # addmm's term broadcast to [batch, M, N] (stride 0 on broadcast dims)
    M, N, K, BATCH,
    stride_ab, stride_a,  # batch stride; stride of A's non-unit dim
    stride_bb, stride_b,
    stride_cb, stride_cm,
    stride_sb, stride_sm, stride_sn,
    alpha, beta,
    A_T: tl.constexpr,  # A is stored [K, M] (a transposed view)
    B_T: tl.constexpr,  # B is stored [N, K] (linear's weight.t())
    BATCHED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALE: tl.constexpr,  # alpha != 1
    UPCAST: tl.constexpr,  # widen tiles to fp32 before tl.dot (the interpreter's bf16)
    # Each matrix through a tensor descriptor, or through pointers where its other
    # stride is not 16-byte aligned (a GPT-2 or BERT head's 50257 or 30522 columns).
    A_DESC: tl.constexpr,
    B_DESC: tl.constexpr,
    C_DESC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr,  # store the result tile as two column halves
    FLATTEN: tl.constexpr,  # let the pipeliner overlap one tile's epilogue with the next
    WARP_SPECIALIZE: tl.constexpr = False,  # separate producer and consumer warps
    OCCUPANCY: tl.constexpr = 1,  # programs per multiprocessor (read by the host's grid)
):
    a_desc = _operand_descriptor(A, BATCH, M, K, stride_ab, stride_a, BLOCK_M, BLOCK_K,
                                 BATCHED, A_T, A_DESC)
    b_desc = _operand_descriptor(B, BATCH, K, N, stride_bb, stride_b, BLOCK_K, BLOCK_N,
                                 BATCHED, B_T, B_DESC)
    c_desc = _operand_descriptor(C, BATCH, M, N, stride_cb, stride_cm, BLOCK_M,
                                 BLOCK_N // 2 if EPILOGUE_SPLIT else BLOCK_N, BATCHED,
                                 False, C_DESC)

    programs = tl.num_programs(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n * BATCH
    k_tiles = tl.cdiv(K, BLOCK_K)
    # The epilogue keeps its own tile counter: with FLATTEN the loop body is software
    # pipelined across tiles, and the epilogue's tile trails the loads' by one.
    done = tl.program_id(0) - programs
    for tile in tl.range(tl.program_id(0), tiles, programs, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        b, pid_m, pid_n = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            # Out-of-range rows, columns and the ragged last K tile arrive as zeros.
            a = _operand_tile(a_desc, A, b, off_m, off_k, M, K, stride_ab, stride_a,
                              BLOCK_M, BLOCK_K, BATCHED, A_T, A_DESC)
            w = _operand_tile(b_desc, B, b, off_k, off_n, K, N, stride_bb, stride_b,
                              BLOCK_K, BLOCK_N, BATCHED, B_T, B_DESC)
            if UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w, acc)

        done += programs
        b, pid_m, pid_n = grouped_tile(done, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SCALE:
            acc = acc * alpha
        if HAS_BIAS:
            rm = off_m + tl.arange(0, BLOCK_M)
            rn = off_n + tl.arange(0, BLOCK_N)
            s_ptrs = (Bias + b.to(tl.int64) * stride_sb + rm[:, None].to(tl.int64) * stride_sm
                      + rn[None, :] * stride_sn)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            acc += beta * tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
        out = acc.to(C.dtype.element_ty)
        if not C_DESC:
            rm = off_m + tl.arange(0, BLOCK_M)
            rn = off_n + tl.arange(0, BLOCK_N)
            c_ptrs = (C + b.to(tl.int64) * stride_cb + rm[:, None].to(tl.int64) * stride_cm
                      + rn[None, :])
            tl.store(c_ptrs, out, mask=(rm[:, None] < M) & (rn[None, :] < N))
        elif EPILOGUE_SPLIT:
            # Two [BLOCK_M, BLOCK_N / 2] halves: half the shared memory for the store.
            left, right = out.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
            _store(c_desc, b, off_m, off_n, left, BLOCK_M, BLOCK_N // 2, BATCHED)
            _store(c_desc, b, off_m, off_n + BLOCK_N // 2, right, BLOCK_M, BLOCK_N // 2,
                   BATCHED)
        else:
            _store(c_desc, b, off_m, off_n, out, BLOCK_M, BLOCK_N, BATCHED)


def _layout(t: Tensor) -> tuple[bool, int, bool] | None:
    """(transposed, stride of the non-unit dim, whether a descriptor can read it) of a 2-D
    matrix view with one unit stride; None when it has none. A descriptor needs the other
    stride to be a multiple of 16 bytes; pointers take any."""
    rows, cols = t.shape[-2], t.shape[-1]
    s_r, s_c = t.stride(-2), t.stride(-1)
    size = t.element_size()
    found: tuple[bool, int, bool] | None = None
    if s_c == 1 or cols == 1:
        other = s_r if rows > 1 else max(cols, 1)
        if other >= cols:
            if other * size % 16 == 0:
                return False, other, True
            found = (False, other, False)
    if s_r == 1 or rows == 1:
        other = s_c if cols > 1 else max(rows, 1)
        if other >= rows:
            if other * size % 16 == 0:
                return True, other, True
            found = found or (True, other, False)
    return found


POINTER_OPERANDS = False
"""Whether :func:`eligible` takes products with a matrix the kernel must read or write
through pointers (its stride not 16-byte aligned). The kernel serves them (tested on the
interpreter, compiled for sm_90 offline: docs/gpu/s23), but until a GPU run times them
against the portable kernel (``.ci/head_probe.py``) they keep the portable route."""


def _described(t: Tensor, layout: tuple[bool, int, bool]) -> bool:
    """Whether a tensor descriptor can take ``t`` (of layout ``layout``): an aligned
    stride, a 16-byte aligned base and, for a batch of several, batch entries that
    start on 16-byte boundaries (ViT's 197x197 scores do not: pointers take them)."""
    if t.dim() == 3 and t.shape[0] > 1 and t.stride(0) * t.element_size() % 16:
        return False
    return layout[2] and t.data_ptr() % 16 == 0


def eligible(a: Tensor, b: Tensor, c: Tensor, device: gemshal.Device | None = None) -> bool:
    """Whether the persistent kernel can serve ``c = a @ b`` here: the device has tensor
    descriptors, the operands are fp16/bf16, each matrix has a unit stride in one
    dimension (``c`` row-major) and a batch of several does not share one matrix.

    A matrix whose other stride is a multiple of 16 bytes (and whose base, and each
    batch entry, start on 16-byte boundaries) is read or written through a tensor
    descriptor, any other through pointers (a language-model head over a vocabulary of
    50257 or 30522 columns, ViT's batches of 197x197 scores) when
    :data:`POINTER_OPERANDS` is on; at least one matrix must take a descriptor, or the
    portable kernel serves the product."""
    if a.dtype not in _DTYPES:
        return False
    if not (device or gemshal.device_of(a)).has("tensor_descriptors"):
        return False
    described = 0
    for t in (a, b, c):
        # A shared matrix (batch stride 0) is left to the portable kernel.
        if t.dim() == 3 and t.shape[0] > 1 and t.stride(0) <= 0:
            return False
        layout = _layout(t)
        if layout is None:
            return False
        if t is c and layout[0]:
            return False
        if _described(t, layout):
            described += 1
        elif not POINTER_OPERANDS:
            return False
    return described > 0


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


Grid = Callable[[dict[str, Any]], tuple[int]]


def plan(a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, alpha: float, beta: float,
         device: gemshal.Device | None = None) -> tuple[Grid, tuple[Any, ...], dict[str, Any]]:
    """The grid, positional arguments and constant keywords of one persistent launch
    (what :func:`launch` passes the kernel; a tuning sweep adds a config to them).
    ``device``: ``a``'s device record, when the caller has it."""
    device = device or gemshal.device_of(a)
    if a.dim() == 3 and a.shape[0] == 1:
        a, b, c = a[0], b[0], c[0]
        bias = None if bias is None else bias[0]
    batched = a.dim() == 3
    batch = a.shape[0] if batched else 1
    M, K = a.shape[-2], a.shape[-1]
    N = b.shape[-1]
    a_layout = _layout(a) or (False, 0, True)
    b_layout = _layout(b) or (False, 0, True)
    c_layout = _layout(c) or (False, 0, True)
    a_t, a_s = a_layout[0], a_layout[1]
    b_t, b_s = b_layout[0], b_layout[1]
    descs = (_described(a, a_layout), _described(b, b_layout), _described(c, c_layout))
    s = bias if bias is not None else c
    ss = s.stride() if s.dim() == 3 else (0, *s.stride())
    upcast = a.dtype == torch.bfloat16 and device.interpreter
    key = (a_t, b_t, batched, bias is not None, alpha != 1.0, upcast, descs)
    consts = _CONSTS.get(key)
    if consts is None:
        consts = _CONSTS[key] = {"A_T": a_t, "B_T": b_t, "BATCHED": batched,
                                 "HAS_BIAS": bias is not None, "SCALE": alpha != 1.0,
                                 "UPCAST": upcast, "A_DESC": descs[0], "B_DESC": descs[1],
                                 "C_DESC": descs[2]}
    sms = device.multiprocessor_count

    def grid(meta: dict[str, Any]) -> tuple[int]:
        tiles = batch * cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
        return (min(sms * meta.get("OCCUPANCY", 1), tiles),)

    args = (a, b, c, s, M, N, K, batch,
            a.stride(0) if batched else 0, a_s,
            b.stride(0) if batched else 0, b_s,
            c.stride(0) if batched else 0, c.stride(-2),
            *ss, alpha, beta)
    return grid, args, consts


def launch(a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, alpha: float, beta: float,
           device: gemshal.Device | None = None) -> None:
    """``c[i] = alpha * a[i] @ b[i] (+ beta * bias[i])`` with the persistent kernel.

    2-D or 3-D operands (a batch stride of 0 shares one matrix); the caller checked
    :func:`eligible` and the shapes, and ``bias`` is already broadcast to ``c``'s shape.
    """
    grid, args, consts = plan(a, b, c, bias, alpha, beta, device)
    gemshal.ensure_scratch_allocator()
    _mm_persistent_kernel.launch(grid, args, consts)
