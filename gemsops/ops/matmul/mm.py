"""Matrix products: mm, bmm and addmm (what ``nn.Linear`` reaches, forward and backward).

One tiled Triton kernel serves all three: fp32 accumulation through ``tl.dot``, grouped
("swizzled") program order so neighbouring programs share operand tiles in L2, operands
read through their strides (the transposed views of a linear layer's backward are never
copied), and the ``addmm`` epilogue (``beta * self + alpha * product``) fused. Decode
shapes (a few rows against a wide weight, one row included) are bound by reading the
weight: narrow tiles (16 rows, 32..128 columns, long K slices) give every multiprocessor
its share. When even those leave most multiprocessors idle (a narrow N with a long K),
K is split over several programs that write fp32 partial tiles, summed by a second
kernel that applies the epilogue. On devices with tensor descriptors, fp16/bf16
products that are neither split nor decode-shaped go to the persistent kernel of
:mod:`gemsops.ops.matmul.persistent` instead.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, check_supported, tl_acc
from gemsops.ops.grid import cdiv
from gemsops.ops.matmul import persistent
from gemsops.ops.matmul.persistent import grouped_tile
from gemsops.ops.outputs import prepare_out
from gemsops.ops.replay import replayable

__all__ = ["addmm", "bmm", "launch_product", "mm"]



# The operands' layouts are part of the key (a stride of 1 and a long stride fall in
# different size buckets): a linear layer's weight.t() and a row-major weight of the same
# shape want different tiles, and the split and the epilogue change the work per tile.
@kernel("mm", key=["M", "N", "K", "stride_ak", "stride_bk", "SPLIT_K", "HAS_BIAS"])
@triton.jit
def _mm_kernel(
    A,  # [batch, M, K] operand, any strides
    B,  # [batch, K, N] operand, any strides
    C,  # [batch, M, N] result, or [SPLIT_K, M, N] fp32 partials when SPLIT_K > 1
    Bias,  # addmm's ``self`` broadcast to [batch, M, N] (stride 0 on broadcast dims)
    M,
    N,
    K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_sb, stride_sm, stride_sn,
    alpha,  # scale of the product
    beta,  # scale of Bias
    SPLIT_K: tl.constexpr,  # programs sharing one output tile along K (grid axis 1)
    HAS_BIAS: tl.constexpr,  # addmm with beta != 0
    ACC: tl.constexpr,  # accumulator type: fp32, or fp64 for fp64 operands
    UPCAST: tl.constexpr,  # widen operands to ACC before tl.dot (interpreter bf16)
    PRECISION: tl.constexpr,  # tl.dot input_precision for fp32 operands (None: default)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Axis 0 enumerates batch x output tiles; within one batch entry tiles go in groups of
    # GROUP_M tile-rows so consecutive programs reuse the same B columns and A rows.
    pid_k = tl.program_id(1)
    pid_b, pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M),
                                       tl.cdiv(N, BLOCK_N), GROUP_M)

    # int64 offsets: an [M, N] result of a vocabulary projection can pass 2**31 elements.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_n = rn < N

    # This program's share of the K tiles (all of them when SPLIT_K == 1).
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_lo = pid_k * per_split
    k_hi = min(k_lo + per_split, k_tiles)
    bb = pid_b.to(tl.int64)
    rk0 = k_lo * BLOCK_K + rk
    a_ptrs = A + bb * stride_ab + rm[:, None] * stride_am + rk0[None, :] * stride_ak
    b_ptrs = B + bb * stride_bb + rk0[:, None] * stride_bk + rn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for kt in range(k_lo, k_hi):
        # Masks: rows past M / columns past N and the ragged last K tile read zeros,
        # which add nothing to the dot product.
        k_left = K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & mask_n[None, :], other=0.0)
        if UPCAST:
            a = a.to(ACC)
            b = b.to(ACC)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        acc = acc * alpha
        if HAS_BIAS:
            s_ptrs = Bias + bb * stride_sb + rm[:, None] * stride_sm + rn[None, :] * stride_sn
            acc += beta * tl.load(s_ptrs, mask=mask, other=0.0).to(ACC)
        c_ptrs = C + bb * stride_cb + rm[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)
    else:
        # Partial tile of split pid_k: the reduce kernel applies the epilogue.
        c_ptrs = C + pid_k.to(tl.int64) * stride_cb + rm[:, None] * stride_cm
        tl.store(c_ptrs + rn[None, :] * stride_cn, acc, mask=mask)


@kernel("mm_splitk_reduce", key=["M", "N"])
@triton.jit
def _splitk_reduce_kernel(
    W,  # [SPLIT_K, M, N] fp32 partial products, contiguous
    C,  # [M, N] result, any strides
    Bias,  # addmm's ``self`` broadcast to [M, N]
    M,
    N,
    stride_cm, stride_cn,
    stride_sm, stride_sn,
    alpha,
    beta,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rm = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask = (rm[:, None] < M) & (rn[None, :] < N)  # the ragged edge tiles
    w_ptrs = W + rm[:, None] * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for s in range(SPLIT_K):
        acc += tl.load(w_ptrs + s * M * N, mask=mask, other=0.0).to(ACC)
    acc = acc * alpha
    if HAS_BIAS:
        acc += beta * tl.load(Bias + rm[:, None] * stride_sm + rn[None, :] * stride_sn,
                              mask=mask, other=0.0).to(ACC)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(C.dtype.element_ty),
             mask=mask)


def _check(*tensors: Tensor) -> torch.dtype:
    """The common dtype of the operands, or Unsupported for inputs the kernel does not take."""
    dtype = tensors[0].dtype
    device = tensors[0].device
    for t in tensors:
        if t.layout != torch.strided:
            raise Unsupported("non-strided layout")
        if t.device != device:
            raise Unsupported("operands on different devices")
        if t.dtype != dtype:
            raise Unsupported("operands of different dtypes")
    if dtype not in FLOAT_DTYPES:
        raise Unsupported(f"matmul of {dtype}")
    check_supported(dtype)
    return dtype


def _scalar(value: Any, name: str) -> float:
    if isinstance(value, complex) or (isinstance(value, Tensor) and value.is_complex()):
        raise Unsupported(f"complex {name}")
    return float(value)


SPLIT_MIN_WEIGHT = 1 << 22
"""Fewest weight elements (N x K) a decode product splits K for (4M: 8 MB in bf16)."""


def _split_k(batch: int, M: int, N: int, K: int, sms: int) -> int:
    """How many programs share each output tile along K (1: no split).

    A decode-like product (few rows, long K) is tiled 16 rows by 32..128 columns; when
    even 32-column tiles would leave more than half the multiprocessors idle, splitting
    K multiplies the programs. The split stays a power of two and leaves >= 512 of K
    per split. (On the H200, 4096- and 14336-wide weights ran fastest unsplit.)

    Products with fewer than :data:`SPLIT_MIN_WEIGHT` weight elements are never split:
    their kernel takes a few microseconds either way, and the split's second launch (the
    partial sums' reduction) costs more host time than that (on the H200 a 16x1024 by
    1024x1024 linear took 80-94 us to issue split in two, against 36 us for one launch
    of a 64^3 product).
    """
    if batch == 1 and M > 64:
        return _split_few_tiles(M, N, K, sms)
    if batch != 1 or K < 1024 or N * K < SPLIT_MIN_WEIGHT:
        return 1
    tiles = cdiv(M, 16) * cdiv(N, 32)
    if 2 * tiles > sms:
        return 1
    split = min(16, sms // max(tiles, 1), K // 512)
    return 1 if split < 2 else 1 << (split.bit_length() - 1)


SPLIT_MIN_WORK = 1 << 31
"""Fewest multiply-adds (M x N x K) a product of few output tiles splits K for (a 4 GFLOP
product, about 8 us on an H100: below that the reduction's launch is not paid back)."""


def _split_few_tiles(M: int, N: int, K: int, sms: int) -> int:
    """The split for a product of many rows whose output is small beside its K: a linear
    layer's weight gradient at GPT-2/BERT/ViT width (768x768 over 8192 tokens: 36 tiles of
    128x128 for 132 multiprocessors). When its 128x128 tiles fill at most half the
    multiprocessors and K is at least 4096, K is split until the tiles times the split
    reach the multiprocessor count (a power of two, at most 8, >= 1024 of K per split).

    On an H100 (.ci/splitk_probe.py, docs/gpu/s20) the 768x768 weight gradient over 8192
    tokens took 40.3 us in the persistent kernel's best config and 34.0 us split in 4
    (over 6304 tokens 32.7 and 29.3); 3072x768 (144 tiles) ran slower split in 2 (85.1 ->
    88.6 us), so products that fill the device stay whole.
    """
    tiles = cdiv(M, 128) * cdiv(N, 128)
    if K < 4096 or 2 * tiles > sms or M * N * K < SPLIT_MIN_WORK:
        return 1
    split = 1
    while tiles * split < sms and split < 8 and K // (2 * split) >= 1024:
        split *= 2
    return split


def _precision(dtype: torch.dtype) -> str | None:
    # fp32 operands follow torch's matmul precision: "highest" means full fp32 (no tf32);
    # fp64 is always exact; half types take the backend's default.
    if dtype == torch.float32:
        return "ieee" if torch.get_float32_matmul_precision() == "highest" else None
    return "ieee" if dtype == torch.float64 else None


_CONSTS: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = {}


def _consts(
    dtype: torch.dtype, has_bias: bool, precision: str | None, split: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The constant keywords of the mm and split-K reduce launches (cached: one dict per
    key, never changed, so the launcher recognises it)."""
    key = (dtype, has_bias, precision, split, gemshal.current_vendor())
    try:
        return _CONSTS[key]
    except KeyError:
        pass
    interpreter = gemshal.current_device().interpreter
    acc = tl_acc(dtype)
    # The interpreter multiplies bf16 tiles as raw 16-bit integers; widen them first.
    upcast = interpreter and dtype == torch.bfloat16
    # A split-K first pass writes float partials without the epilogue.
    mm = {"SPLIT_K": split, "HAS_BIAS": has_bias and split == 1, "ACC": acc,
          "UPCAST": upcast, "PRECISION": precision}
    reduce = {"SPLIT_K": split, "HAS_BIAS": has_bias, "ACC": acc}
    consts = _CONSTS[key] = (mm, reduce)
    return consts


def launch_product(a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, alpha: float,
                   beta: float, split_k: int | None = None) -> None:
    """``c[i] = alpha * a[i] @ b[i] (+ beta * bias[i])`` for 2-D or 3-D a, b, c (and bias).

    The operands are read through their strides (a batch stride of 0 shares one matrix
    across the batch); ``c`` is written in place. Checks are the caller's (:func:`mm`,
    :func:`bmm`, :func:`addmm` do them).
    """
    shape = a.shape
    batch = shape[0] if len(shape) == 3 else 1
    M, K = shape[-2], shape[-1]
    N = b.shape[-1]
    if batch == 0 or M == 0 or N == 0:
        return
    if alpha == 0.0:
        # BLAS's rule, torch's on every device: with alpha 0 the product is not formed,
        # so an inf or nan in a or b does not reach c (0 * inf would be nan).
        if bias is None:
            c.zero_()
        else:
            torch.mul(bias, beta, out=c)
        return
    dtype = a.dtype
    device = gemshal.device_of(a)
    if split_k is not None:
        split = split_k
    else:
        split = _split_k(batch, M, N, K, device.multiprocessor_count)
    s = bias if bias is not None else c
    # (batch, row, col) strides: a matrix is a batch of one.
    sa, sb, sc, ss = a.stride(), b.stride(), c.stride(), s.stride()
    if len(sa) == 2:
        sa = (0, *sa)
    if len(sb) == 2:
        sb = (0, *sb)
    if len(sc) == 2:
        sc = (0, *sc)
    if len(ss) == 2:
        ss = (0, *ss)
    decode = batch == 1 and M <= 16
    if split == 1 and not decode and persistent.eligible(a, b, c, device):
        # Hopper and later: the persistent tensor-descriptor kernel.
        persistent.launch(a, b, c, bias, alpha, beta, device)
        return
    mm, reduce = _consts(dtype, bias is not None, _precision(dtype), split)
    if split == 1:
        _mm_kernel.launch(
            lambda meta: (batch * cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), 1),
            (a, b, c, s, M, N, K, *sa, *sb, *sc, *ss, alpha, beta),
            mm,
        )
        return
    work = torch.empty((split, M, N), device=a.device,
                       dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    _mm_kernel.launch(
        lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), split),
        (a, b, work, s, M, N, K, *sa, *sb, *work.stride(), *ss, 1.0, 0.0),
        mm,
    )
    _splitk_reduce_kernel.launch(
        lambda meta: (cdiv(M, meta["BLOCK_M"]), cdiv(N, meta["BLOCK_N"])),
        (work, c, s, M, N, *sc[1:], *ss[1:], alpha, beta),
        reduce,
    )


def _mm_shapes(a: Tensor, b: Tensor) -> tuple[int, int, int]:
    if a.dim() != 2 or b.dim() != 2:
        raise Unsupported("mm takes 2-D operands")
    if a.shape[1] != b.shape[0]:
        raise Unsupported("mm operand shapes do not match")
    return a.shape[0], a.shape[1], b.shape[1]


@op("mm.default", out="mm.out")
@replayable(extra=torch.get_float32_matmul_precision)
def mm(input: Tensor, mat2: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Matrix product of a [M, K] and a [K, N] matrix.

    Args:
        input: The left matrix (any strides: transposed views are read in place).
        mat2: The right matrix, same dtype and device.
        out: Optional result tensor (resized to [M, N]; its dtype must be the inputs').

    Returns:
        The [M, N] product; zeros when K is 0.
    """
    dtype = _check(input, mat2)
    M, _, N = _mm_shapes(input, mat2)
    if out is None:
        out = torch.empty((M, N), dtype=dtype, device=input.device)
    else:
        prepare_out(out, (M, N), dtype, input, mat2)
    launch_product(input, mat2, out, None, 1.0, 0.0)
    return out


@op("bmm.default", out="bmm.out")
@replayable(extra=torch.get_float32_matmul_precision)
def bmm(input: Tensor, mat2: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Batched matrix product of [B, M, K] and [B, K, N] tensors.

    Args:
        input: The left batch of matrices (any strides).
        mat2: The right batch, same batch size, dtype and device.
        out: Optional result tensor (resized to [B, M, N]).

    Returns:
        The [B, M, N] products.
    """
    dtype = _check(input, mat2)
    if input.dim() != 3 or mat2.dim() != 3:
        raise Unsupported("bmm takes 3-D operands")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise Unsupported("bmm operand shapes do not match")
    shape = (input.shape[0], input.shape[1], mat2.shape[2])
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=input.device)
    else:
        prepare_out(out, shape, dtype, input, mat2)
    launch_product(input, mat2, out, None, 1.0, 0.0)
    return out


def _alpha_not_zero(*args: Any, **kwargs: Any) -> bool:
    # alpha 0 zeroes (or scales the bias into) the output with a torch call, not a launch
    alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
    return not (isinstance(alpha, int | float) and alpha == 0)


@op("addmm.default", out="addmm.out")
@replayable(when=_alpha_not_zero, extra=torch.get_float32_matmul_precision)
def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: float = 1, alpha: float = 1,
          out: Tensor | None = None) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` in one kernel (the epilogue is fused).

    Args:
        input: Added term, broadcastable to [M, N]; not read when ``beta`` is 0 (its nan
            and inf then do not propagate, as in torch).
        mat1: The [M, K] left matrix.
        mat2: The [K, N] right matrix.
        beta: Scale of ``input``.
        alpha: Scale of the product.
        out: Optional result tensor (resized to [M, N]).

    Returns:
        The [M, N] result.
    """
    dtype = _check(input, mat1, mat2)
    M, _, N = _mm_shapes(mat1, mat2)
    beta_f, alpha_f = _scalar(beta, "beta"), _scalar(alpha, "alpha")
    if input.dim() > 2:
        raise Unsupported("addmm's self has more than 2 dims")
    try:
        bias = input.expand(M, N)
    except RuntimeError:
        raise Unsupported("addmm's self does not broadcast to the product") from None
    if out is None:
        out = torch.empty((M, N), dtype=dtype, device=mat1.device)
    else:
        prepare_out(out, (M, N), dtype, input, mat1, mat2)
    launch_product(mat1, mat2, out, bias if beta_f != 0 else None, alpha_f, beta_f)
    return out
