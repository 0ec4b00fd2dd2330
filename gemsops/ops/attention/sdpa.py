"""Scaled dot-product attention: the SDPA overloads torch dispatches to, on gemsops kernels.

``F.scaled_dot_product_attention`` is composite: torch picks a backend and calls one of
these overloads at the device's dispatch key, and autograd pairs each forward with its
backward overload. gemsops serves

* ``_scaled_dot_product_flash_attention`` (+ ``_backward``): what a GPU's SDPA picks
  for fp16/bf16 without a mask;
* ``_scaled_dot_product_efficient_attention`` (+ ``_backward``): with an additive mask
  (``attn_bias``) or fp32;
* ``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``): the CPU's choice,
  with an optional ``attn_mask``.

Each returns exactly what torch's kernel returns, in torch's layouts (the output and
logsumexp strides, the efficient kernel's logsumexp padded to a multiple of 32), so
torch's backward can take this forward's saved tensors. Head dims other than a power of
two in 16..128, float64, nested/variable-length batches and the debug mask are handed
back to torch (:class:`~gemsops.errors.Unsupported`); the refusals depend only on
arguments both halves see, so a forward and its backward are refused together.

**Dropout** (``0 < dropout_p <= 1``) is served by the flash, efficient and cuDNN pairs
(and the public function) with a counter-based mask: the forward draws a Philox key and
counter offset and returns them in the overload's Philox-state slots (flash's
``rng_state``, the efficient and cuDNN overloads' ``philox_seed`` and ``philox_offset``),
and the backward regenerates the mask from them. The two halves must both be gemsops'
(:mod:`.dropout` holds those states and the pairing rules). The CPU flash overload has
no slot for a Philox state (and torch's CPU kernel refuses dropout): its dropout calls
are handed back (``F.scaled_dot_product_attention`` on the CPU takes its math path for
dropout anyway, whose ``bernoulli_`` gemsops serves).

``gemsops.scaled_dot_product_attention`` is the public, differentiable function.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

import gemshal
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.attention import decode
from gemsops.ops.attention.dropout import (
    Dropout,
    check_paired,
    draw,
    flash_state,
    math_attention,
    regenerate,
)
from gemsops.ops.attention.kernels import (
    attention_bwd_dkdv_kernel,
    attention_bwd_dq_kernel,
    attention_bwd_pre_kernel,
    attention_fwd_kernel,
)
from gemsops.ops.dtypes import check_supported
from gemsops.ops.grid import cdiv
from gemsops.ops.higher_order import gems_backward, higher_order, torch_gradients
from gemsops.ops.replay import replayable
from gemsops.registry import running

__all__ = [
    "efficient_attention",
    "efficient_attention_backward",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_for_cpu",
    "flash_attention_for_cpu_backward",
    "scaled_dot_product_attention",
]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes the kernels take (float64 goes to torch)."""

HEAD_DIMS = (16, 32, 64, 128)
"""The head dims the kernels take: a whole head is one tile."""

LSE_ALIGN = 32
"""The efficient-attention logsumexp's last dim is padded to a multiple of this (torch's)."""


# --- checks -------------------------------------------------------------------------


def _check(query: Tensor, key: Tensor, value: Tensor, dropout_p: float = 0.0) -> float:
    """Raise Unsupported for inputs the kernels do not take (before anything is written);
    the dropout probability, as a float in [0, 1]."""
    p = float(dropout_p)
    if not 0.0 <= p <= 1.0:  # nan included: torch decides
        raise Unsupported(f"dropout p={p} outside [0, 1]")
    for t in (query, key, value):
        if t.layout != torch.strided or t.is_nested:
            raise Unsupported("non-strided (nested or sparse) attention input")
        if t.dim() != 4:
            raise Unsupported(f"attention input of {t.dim()} dims (the kernels take 4)")
        if t.device != query.device:
            raise Unsupported("attention inputs on different devices")
        if t.dtype != query.dtype:
            raise Unsupported("attention inputs of different dtypes")
    if query.dtype not in DTYPES:
        raise Unsupported(f"attention in {query.dtype}")
    check_supported(query.dtype)
    B, Hq, _, D = query.shape
    if key.shape[:3] != value.shape[:3] or value.shape[3] != D:
        raise Unsupported("key and value shapes differ (or value's head dim is not query's)")
    if key.shape[0] != B or key.shape[3] != D:
        raise Unsupported("key does not match query's batch or head dim")
    if D not in HEAD_DIMS:
        raise Unsupported(f"head dim {D} (the kernels take {', '.join(map(str, HEAD_DIMS))})")
    Hkv = key.shape[1]
    if Hkv == 0 or Hq % Hkv:
        raise Unsupported(f"{Hq} query heads over {Hkv} key/value heads")
    return p


def _bias(attn_bias: Tensor | None, query: Tensor, Lk: int) -> Tensor | None:
    """The bias broadcast to [B, Hq, Lq, Lk] (a view), or None.

    A boolean mask (True: attend) stays boolean: the kernels read it as 0 / -inf
    (:func:`~gemsops.ops.attention.kernels.bias_term`), as torch's SDPA converts it, with
    no conversion launched and nothing but the view made on the host.
    """
    if attn_bias is None:
        return None
    B, Hq, Lq, _ = query.shape
    if attn_bias.device != query.device or attn_bias.layout != torch.strided:
        raise Unsupported("attention mask on another device or layout")
    if attn_bias.dtype != torch.bool and (
            not attn_bias.dtype.is_floating_point or attn_bias.dtype == torch.float64):
        raise Unsupported(f"attention mask of {attn_bias.dtype}")
    try:
        return attn_bias.expand(B, Hq, Lq, Lk)
    except RuntimeError:
        raise Unsupported("attention mask does not broadcast to [B, H, Lq, Lk]") from None


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _strides4(t: Tensor | None) -> tuple[int, ...]:
    return (0, 0, 0, 0) if t is None else tuple(t.stride())


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _consts(kind: str, dtype: torch.dtype, D: int, causal: bool, has_bias: bool,
            bias_grad: bool = False, dropout: bool = False, desc: bool = False
            ) -> dict[str, Any]:
    """The constant keywords of one launch (cached: one dict per key, never changed, so
    the launcher recognises it)."""
    key = (kind, dtype, D, causal, has_bias, bias_grad, dropout, desc,
           gemshal.current_vendor(), torch.get_float32_matmul_precision())
    hit = _CONSTS.get(key)
    if hit is not None:
        return hit
    interpreter = gemshal.current_device().interpreter
    # fp32 operands follow torch's matmul precision ("highest": no tf32).
    precision = ("ieee" if dtype == torch.float32
                 and torch.get_float32_matmul_precision() == "highest" else None)
    consts: dict[str, Any] = {"D": D, "CAUSAL": causal, "HAS_BIAS": has_bias,
                              # The interpreter multiplies bf16 tiles as raw 16-bit
                              # integers; widen them first.
                              "UPCAST": interpreter and dtype == torch.bfloat16,
                              "PRECISION": precision, "DROPOUT": dropout}
    if kind == "dkdv":
        consts["BIAS_GRAD"] = bias_grad
    if kind == "fwd":
        consts["DESC"] = desc
    _CONSTS[key] = consts
    return consts


DESCRIPTORS = [True]
"""Whether the forward may move its Q, K, V and O tiles through tensor descriptors where
the device has them (:func:`_descriptors`); a switch for A/B measurements."""


def _descriptors(*tensors: Tensor) -> bool:
    """Whether the forward's tiles can move through tensor descriptors: the device has
    ``tensor_descriptors``, the tensors are fp16/bf16 with a unit stride in the head
    dim, and every (batch, head) matrix starts, and each of its rows starts, on a
    16-byte boundary."""
    first = tensors[0]
    if not DESCRIPTORS[0] or first.dtype not in (torch.float16, torch.bfloat16):
        return False
    if not gemshal.device_of(first).has("tensor_descriptors"):
        return False
    size = first.element_size()
    for t in tensors:
        if t.stride(3) != 1 or t.data_ptr() % 16:
            return False
        if any(stride * size % 16 for stride in t.stride()[:3]):
            return False
    return True


# --- launches -----------------------------------------------------------------------


def _forward(query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, causal: bool,
             scale: float, out: Tensor, lse: Tensor, drop: Dropout | None = None) -> None:
    """out = dropout(softmax(scale * q k^T + bias, causal)) v; lse = the softmax's row
    logsumexp (natural)."""
    B, Hq, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    if B * Hq * Lq == 0:
        return
    if decode.takes(query, key, bias, drop):
        # Decode shapes: split keys, grouped-query heads packed into the tile's rows.
        decode.forward(query, key, value, bias, causal, scale, out, lse)
        return
    desc = _descriptors(query, key, value, out)
    if desc:
        gemshal.ensure_scratch_allocator()
    consts = _consts("fwd", query.dtype, D, causal, bias is not None,
                     dropout=drop is not None, desc=desc)
    seed, offset = (query, query) if drop is None else (drop.seed, drop.offset)
    p, keep_scale = (0.0, 1.0) if drop is None else (drop.p, drop.scale)
    attention_fwd_kernel.launch(
        lambda meta: (cdiv(Lq, meta["BLOCK_M"]), B * Hq),
        (query, key, value, bias if bias is not None else query, out, lse,
         *query.stride(), *key.stride(), *value.stride(), *_strides4(bias),
         *out.stride(), *lse.stride(),
         Hq, Hq // Hkv, Lq, Lk, scale * 1.4426950408889634, seed, offset, p, keep_scale),
        consts,
    )


def _backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
              bias: Tensor | None, out: Tensor, lse: Tensor, causal: bool, scale: float,
              bias_grad: bool = False, drop: Dropout | None = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, dbias) of :func:`_forward` (with ``drop``, the forward's dropout);
    dbias is [B, Hq, Lq, Lk] when asked for."""
    B, Hq, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    if grad_out.shape != out.shape or grad_out.device != query.device:
        raise Unsupported("grad_out does not match the attention output")
    if tuple(lse.shape) != (B, Hq, Lq) or lse.dtype != torch.float32:
        raise Unsupported("logsumexp is not [B, H, Lq] float32")
    dtype = query.dtype
    dq = torch.empty_permuted((B, Hq, Lq, D), (0, 2, 1, 3), dtype=dtype, device=query.device)
    dk = torch.empty_permuted((B, Hkv, Lk, D), (0, 2, 1, 3), dtype=dtype, device=query.device)
    dv = torch.empty_permuted((B, Hkv, Lk, D), (0, 2, 1, 3), dtype=dtype, device=query.device)
    dbias = None
    if bias_grad and bias is not None:
        # Blocks a causal walk skips (and padding) are never written: start from zeros.
        dbias = torch.zeros((B, Hq, Lq, Lk), dtype=bias.dtype, device=query.device)
    if B * Hkv * Lk == 0 or Lq == 0:
        dq.zero_()
        dk.zero_()
        dv.zero_()
        return dq, dk, dv, dbias
    delta = torch.empty((B * Hq, Lq), dtype=torch.float32, device=query.device)
    group = Hq // Hkv
    bias_arg = bias if bias is not None else query
    bias_strides = _strides4(bias)
    dbias_arg = dbias if dbias is not None else query
    dbias_strides = _strides4(dbias)
    seed, offset = (query, query) if drop is None else (drop.seed, drop.offset)
    p, keep_scale = (0.0, 1.0) if drop is None else (drop.p, drop.scale)
    dropout = drop is not None
    attention_bwd_pre_kernel.launch(
        lambda meta: (cdiv(Lq, meta["BLOCK_M"]), B * Hq),
        (out, grad_out, delta, *out.stride(), *grad_out.stride(), Hq, Lq),
        {"D": D},
    )
    attention_bwd_dkdv_kernel.launch(
        lambda meta: (cdiv(Lk, meta["BLOCK_N"]), B * Hkv),
        (query, key, value, bias_arg, grad_out, lse, delta, dk, dv, dbias_arg,
         *query.stride(), *key.stride(), *value.stride(), *bias_strides,
         *grad_out.stride(), *lse.stride(), *dk.stride(), *dv.stride(), *dbias_strides,
         Hq, group, Lq, Lk, scale, seed, offset, p, keep_scale),
        _consts("dkdv", dtype, D, causal, bias is not None, dbias is not None, dropout),
    )
    attention_bwd_dq_kernel.launch(
        lambda meta: (cdiv(Lq, meta["BLOCK_M"]), B * Hq),
        (query, key, value, bias_arg, grad_out, lse, delta, dq,
         *query.stride(), *key.stride(), *value.stride(), *bias_strides,
         *grad_out.stride(), *lse.stride(), *dq.stride(),
         Hq, group, Lq, Lk, scale, seed, offset, p, keep_scale),
        _consts("dq", dtype, D, causal, bias is not None, dropout=dropout),
    )
    return dq, dk, dv, dbias


def _no_varlen(*tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.numel():
            raise Unsupported("variable-length (nested) batch")


# --- the aten overloads -------------------------------------------------------------


def _no_bias(*args: Any, **kwargs: Any) -> bool:
    # Efficient attention's backward with an additive bias zeroes and reduces its
    # gradient with torch calls: only the calls without one (or with a boolean mask,
    # which has no gradient) are replayed.
    bias = kwargs.get("attn_bias", args[4] if len(args) > 4 else None)
    no_grad = bias is None or (isinstance(bias, Tensor) and bias.dtype == torch.bool)
    return no_grad and _no_dropout(9, args, kwargs)


def _efficient_replay(*args: Any, **kwargs: Any) -> bool:
    # The forward fills the logsumexp's padding columns (past Lq, up to a multiple of 32)
    # with a torch call: replayed only where there are none, without dropout.
    query = kwargs.get("query", args[0] if args else None)
    lse = kwargs.get("compute_log_sumexp", args[4] if len(args) > 4 else False)
    if not isinstance(query, Tensor) or query.dim() != 4:
        return False
    padded = bool(lse) and query.shape[2] % LSE_ALIGN != 0
    return not padded and _no_dropout(5, args, kwargs)


def _no_dropout(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # A dropout forward draws its Philox state with a torch call and a dropout backward
    # checks the state's origin on the host: neither is replayed.
    p = kwargs.get("dropout_p", args[index] if len(args) > index else 0.0)
    return not p


def _flash_replay(*args: Any, **kwargs: Any) -> bool:
    return _no_dropout(3, args, kwargs)


def _flash_backward_replay(*args: Any, **kwargs: Any) -> bool:
    return _no_dropout(10, args, kwargs)


def _cudnn_replay(*args: Any, **kwargs: Any) -> bool:
    return _no_dropout(5, args, kwargs)


def _cudnn_backward_replay(*args: Any, **kwargs: Any) -> bool:
    return _no_dropout(13, args, kwargs)


@op("_scaled_dot_product_flash_attention.default", public=False)
@replayable(when=_flash_replay, workspaces=True)  # decode.forward's split workspace
def flash_attention(query: Tensor, key: Tensor, value: Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, return_debug_mask: bool = False, *,
                    scale: float | None = None) -> tuple[Any, ...]:
    """aten's flash attention forward: ``(output, logsumexp, cum_seq_q, cum_seq_k, max_q,
    max_k, rng_state, unused, debug_attn_mask)`` as torch's kernel returns them.

    The output takes the query's layout, the logsumexp is [B, H, Lq] float32 contiguous;
    cum_seq_q/k are undefined (not a variable-length batch), ``rng_state`` is the
    dropout's Philox state ([2] uint64 on the device: key, counter offset; a placeholder
    without dropout), ``unused`` a placeholder, and the debug mask is empty.

    Raises:
        Unsupported: the debug mask, dropout whose backward is not served, or inputs the
            kernels do not take.
    """
    p = _check(query, key, value, dropout_p)
    if return_debug_mask:
        raise Unsupported("return_debug_mask")
    check_paired(p, "_scaled_dot_product_flash_attention_backward.default")
    B, Hq, Lq, D = query.shape
    Lk = key.shape[2]
    out = torch.empty_like(query)
    lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=query.device)
    drop = None
    if p > 0.0:
        state, drop = draw(p, query.device)
        seed = state.view(torch.uint64)
    else:
        seed = torch.empty((2,), dtype=torch.uint64, device=query.device)
    _forward(query, key, value, None, is_causal, _scale(scale, D), out, lse, drop)
    offset = torch.empty((), dtype=torch.uint64, device=query.device)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, Lq, Lk, seed, offset, debug


@op("_scaled_dot_product_flash_attention_backward.default", public=False)
@replayable(when=_flash_backward_replay, workspaces=True)
def flash_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                             out: Tensor, logsumexp: Tensor, cum_seq_q: Tensor | None,
                             cum_seq_k: Tensor | None, max_q: int, max_k: int,
                             dropout_p: float, is_causal: bool, philox_seed: Tensor,
                             philox_offset: Tensor, *, scale: float | None = None
                             ) -> tuple[Tensor, Tensor, Tensor]:
    """aten's flash attention backward: ``(grad_query, grad_key, grad_value)``; with
    dropout, the mask regenerated from ``philox_seed`` (the forward's ``rng_state``).

    Raises:
        Unsupported: dropout with a Philox state no gemsops forward drew, a
            variable-length batch, or inputs the kernels do not take.
    """
    p = _check(query, key, value, dropout_p)
    _no_varlen(cum_seq_q, cum_seq_k)
    drop = regenerate(p, query, *flash_state(philox_seed)) if p > 0.0 else None
    dq, dk, dv, _ = _backward(grad_out, query, key, value, None, out, logsumexp, is_causal,
                              _scale(scale, query.shape[3]), drop=drop)
    return dq, dk, dv


@op("_scaled_dot_product_efficient_attention.default", public=False)
@replayable(when=_efficient_replay, workspaces=True)  # decode.forward's split workspace
def efficient_attention(query: Tensor, key: Tensor, value: Tensor, attn_bias: Tensor | None,
                        compute_log_sumexp: bool, dropout_p: float = 0.0,
                        is_causal: bool = False, *, scale: float | None = None
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """aten's memory-efficient attention forward: ``(output, log_sumexp, philox_seed,
    philox_offset)`` as torch's kernel returns them.

    The output is [B, H, Lq, D] over [B, Lq, H, D] memory; log_sumexp is
    [B, H, ceil(Lq / 32) * 32] float32 when ``compute_log_sumexp`` (the first Lq columns
    hold the values), else [B, H, 0]. With dropout, philox_seed and philox_offset are the
    0-dim int64 Philox key and counter offset on the device.

    Raises:
        Unsupported: dropout whose backward is not served, or inputs the kernels do not
            take.
    """
    p = _check(query, key, value, dropout_p)
    check_paired(p, "_scaled_dot_product_efficient_attention_backward.default")
    B, Hq, Lq, D = query.shape
    Lk = key.shape[2]
    bias = _bias(attn_bias, query, Lk)
    out = torch.empty_permuted((B, Hq, Lq, D), (0, 2, 1, 3), dtype=query.dtype,
                               device=query.device)
    width = cdiv(Lq, LSE_ALIGN) * LSE_ALIGN if compute_log_sumexp else 0
    lse_all = torch.empty((B, Hq, width), dtype=torch.float32, device=query.device)
    if compute_log_sumexp:
        lse = lse_all[..., :Lq]
        if width > Lq:
            lse_all[..., Lq:].fill_(float("inf"))  # torch's padding: never read back
    else:
        lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=query.device)
    if p > 0.0:
        _, drop = draw(p, query.device)
        seed, offset = drop.seed, drop.offset
    else:
        # No dropout: torch's kernel returns empty int64 scalars here.
        drop = None
        seed = torch.empty((), dtype=torch.int64)
        offset = torch.empty((), dtype=torch.int64)
    _forward(query, key, value, bias, is_causal, _scale(scale, D), out, lse, drop)
    return out, lse_all, seed, offset


@op("_scaled_dot_product_efficient_attention_backward.default", public=False,
    args={"grad_out_": "grad_out"})
@replayable(when=_no_bias, workspaces=True)
def efficient_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                 attn_bias: Tensor | None, out: Tensor, logsumexp: Tensor,
                                 philox_seed: Tensor, philox_offset: Tensor, dropout_p: float,
                                 grad_input_mask: Sequence[bool], is_causal: bool = False, *,
                                 scale: float | None = None
                                 ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """aten's memory-efficient attention backward: ``(grad_query, grad_key, grad_value,
    grad_bias)``; grad_bias is computed when the bias is given and ``grad_input_mask[3]``
    (in the bias's shape), else undefined. With dropout, the mask is regenerated from
    ``philox_seed`` and ``philox_offset``.

    Raises:
        Unsupported: dropout with a Philox state no gemsops forward drew, or inputs the
            kernels do not take.
    """
    p = _check(query, key, value, dropout_p)
    Lq, D = query.shape[2], query.shape[3]
    Lk = key.shape[2]
    if logsumexp.dim() != 3 or logsumexp.shape[-1] < Lq:
        raise Unsupported("log_sumexp holds fewer than Lq columns")
    drop = regenerate(p, query, philox_seed, philox_offset) if p > 0.0 else None
    bias = _bias(attn_bias, query, Lk)
    # A boolean mask has no gradient (torch gives none for it either).
    want_bias = bias is not None and bias.dtype != torch.bool and bool(grad_input_mask[3])
    dq, dk, dv, dbias = _backward(grad_out, query, key, value, bias, out,
                                  logsumexp[..., :Lq], is_causal, _scale(scale, D), want_bias,
                                  drop)
    if dbias is not None and attn_bias is not None and dbias.shape != attn_bias.shape:
        dbias = dbias.sum_to_size(attn_bias.shape)
    return dq, dk, dv, dbias


@op("_scaled_dot_product_cudnn_attention.default", public=False)
@replayable(when=_cudnn_replay, workspaces=True)  # decode.forward's split workspace
def cudnn_attention(query: Tensor, key: Tensor, value: Tensor, attn_bias: Tensor | None,
                    compute_log_sumexp: bool, dropout_p: float = 0.0, is_causal: bool = False,
                    return_debug_mask: bool = False, *,
                    scale: float | None = None) -> tuple[Any, ...]:
    """The forward of aten's cuDNN attention overload (the one torch's SDPA picks first on
    recent accelerators): ``(output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
    philox_seed, philox_offset, debug_attn_mask)`` in that overload's layouts.

    The output takes the query's layout and the logsumexp is [B, H, Lq, 1] float32
    (natural log, as the overload's own kernel saves it), so either half pairs with the
    other's; cum_seq_q/k and the debug mask are undefined; philox_seed and philox_offset
    are the dropout's 0-dim int64 Philox key and counter offset (placeholders without
    dropout).

    Raises:
        Unsupported: the debug mask, dropout whose backward is not served, or inputs the
            kernels do not take.
    """
    p = _check(query, key, value, dropout_p)
    if return_debug_mask:
        raise Unsupported("return_debug_mask")
    check_paired(p, "_scaled_dot_product_cudnn_attention_backward.default")
    B, Hq, Lq, D = query.shape
    Lk = key.shape[2]
    bias = _bias(attn_bias, query, Lk)
    out = torch.empty_like(query)
    lse = torch.empty((B, Hq, Lq, 1), dtype=torch.float32, device=query.device)
    if p > 0.0:
        _, drop = draw(p, query.device)
        seed, offset = drop.seed, drop.offset
    else:
        drop = None
        seed = torch.empty((), dtype=torch.int64, device=query.device)
        offset = torch.empty((), dtype=torch.int64, device=query.device)
    _forward(query, key, value, bias, is_causal, _scale(scale, D), out, lse[..., 0], drop)
    return out, lse, None, None, Lq, Lk, seed, offset, None


@op("_scaled_dot_product_cudnn_attention_backward.default", public=False)
@replayable(when=_cudnn_backward_replay, workspaces=True)
def cudnn_attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                             out: Tensor, logsumexp: Tensor, philox_seed: Tensor,
                             philox_offset: Tensor, attn_bias: Tensor | None,
                             cum_seq_q: Tensor | None, cum_seq_k: Tensor | None, max_q: int,
                             max_k: int, dropout_p: float, is_causal: bool, *,
                             scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of aten's cuDNN attention overload: ``(grad_query, grad_key,
    grad_value)`` from the [B, H, Lq, 1] logsumexp its forward saves (with dropout, the
    mask regenerated from ``philox_seed`` and ``philox_offset``).

    Raises:
        Unsupported: dropout with a Philox state no gemsops forward drew, a
            variable-length batch, or inputs the kernels do not take.
    """
    p = _check(query, key, value, dropout_p)
    _no_varlen(cum_seq_q, cum_seq_k)
    Lq = query.shape[2]
    if logsumexp.dim() != 4 or tuple(logsumexp.shape[2:]) != (Lq, 1):
        raise Unsupported("a logsumexp not shaped [B, H, Lq, 1]")
    drop = regenerate(p, query, philox_seed, philox_offset) if p > 0.0 else None
    bias = _bias(attn_bias, query, key.shape[2])
    dq, dk, dv, _ = _backward(grad_out, query, key, value, bias, out, logsumexp[..., 0],
                              is_causal, _scale(scale, query.shape[3]), drop=drop)
    return dq, dk, dv


def _no_cpu_dropout(p: float) -> None:
    if p > 0.0:
        raise Unsupported(f"dropout p={p} on the CPU flash overload (it returns no Philox "
                          "state for its backward; torch's kernel refuses dropout too)")


@op("_scaled_dot_product_flash_attention_for_cpu.default", public=False)
@replayable(workspaces=True)  # decode.forward's split workspace
def flash_attention_for_cpu(query: Tensor, key: Tensor, value: Tensor, dropout_p: float = 0.0,
                            is_causal: bool = False, *, attn_mask: Tensor | None = None,
                            scale: float | None = None) -> tuple[Tensor, Tensor]:
    """aten's CPU flash attention forward: ``(output, logsumexp)`` as torch's kernel
    returns them (output [B, H, Lq, D] in the query's layout, logsumexp [B, H, Lq] over
    [B, Lq, H] memory).

    Raises:
        Unsupported: dropout, or inputs the kernels do not take.
    """
    _no_cpu_dropout(_check(query, key, value, dropout_p))
    B, Hq, Lq, D = query.shape
    bias = _bias(attn_mask, query, key.shape[2])
    out = torch.empty_like(query)  # torch's kernel keeps the query's layout
    lse = torch.empty_permuted((B, Hq, Lq), (0, 2, 1), dtype=torch.float32,
                               device=query.device)
    _forward(query, key, value, bias, is_causal, _scale(scale, D), out, lse)
    return out, lse


@op("_scaled_dot_product_flash_attention_for_cpu_backward.default", public=False)
@replayable(workspaces=True)
def flash_attention_for_cpu_backward(grad_out: Tensor, query: Tensor, key: Tensor,
                                     value: Tensor, out: Tensor, logsumexp: Tensor,
                                     dropout_p: float, is_causal: bool, *,
                                     attn_mask: Tensor | None = None,
                                     scale: float | None = None
                                     ) -> tuple[Tensor, Tensor, Tensor]:
    """aten's CPU flash attention backward: ``(grad_query, grad_key, grad_value)``.

    Raises:
        Unsupported: dropout, or inputs the kernels do not take.
    """
    _no_cpu_dropout(_check(query, key, value, dropout_p))
    bias = _bias(attn_mask, query, key.shape[2])
    dq, dk, dv, _ = _backward(grad_out, query, key, value, bias, out, logsumexp, is_causal,
                              _scale(scale, query.shape[3]))
    return dq, dk, dv


# --- the public function ------------------------------------------------------------


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None,
                causal: bool, scale: float, p: float = 0.0) -> Tensor:
        B, Hq, Lq, D = q.shape
        out = torch.empty_permuted((B, Hq, Lq, D), (0, 2, 1, 3), dtype=q.dtype,
                                   device=q.device)
        lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device)
        state, drop = draw(p, q.device) if p > 0.0 else (None, None)
        _forward(q, k, v, bias, causal, scale, out, lse, drop)
        ctx.save_for_backward(q, k, v, bias, out, lse, state)
        ctx.causal, ctx.scale, ctx.p = causal, scale, p
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, bias, out, lse, state = ctx.saved_tensors
        twice = higher_order()
        if state is not None:
            # Dropout: only gemsops' kernels regenerate this mask, so they compile here
            # (no background compile); twice differentiable through composite ops.
            drop = Dropout.of(ctx.p, state[0], state[1])
            if not twice:
                with running():
                    return (*_backward(grad_out, q, k, v, bias, out, lse, ctx.causal,
                                       ctx.scale, ctx.needs_input_grad[3], drop),
                            None, None, None)
            grads = torch_gradients(
                lambda: math_attention(q, k, v, bias, ctx.causal, ctx.scale, drop),
                (q, k, v, bias), grad_out)
            return (*grads, None, None, None)
        if not twice:
            got = gems_backward("scaled_dot_product_attention backward", lambda: _backward(
                grad_out, q, k, v, bias, out, lse, ctx.causal, ctx.scale,
                ctx.needs_input_grad[3]))
            if got is not None:
                return (*got, None, None, None)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def recompute() -> Tensor:
            # Twice differentiable: torch's math attention (composite ops; its fused
            # kernels' backward has no derivative of its own). Once: torch's own choice.
            with sdpa_kernel([SDPBackend.MATH]) if twice else contextlib.nullcontext():
                out: Tensor = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, is_causal=ctx.causal, scale=ctx.scale,
                    enable_gqa=q.shape[-3] != k.shape[-3])
            return out

        dq, dk, dv, dbias = torch_gradients(recompute, (q, k, v, bias), grad_out,
                                            create_graph=twice)
        return dq, dk, dv, dbias, None, None, None


@op()
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on gemsops kernels,
    differentiable (in query, key, value and a floating ``attn_mask``).

    Args:
        query: [B, Hq, Lq, D] (or [Hq, Lq, D]); D a power of two in 16..128.
        key: [B, Hkv, Lk, D].
        value: [B, Hkv, Lk, D].
        attn_mask: Optional mask broadcastable to [B, Hq, Lq, Lk]: boolean (True attends)
            or additive (added to the scaled scores).
        dropout_p: The probability of dropping an attention probability (the kept ones
            are scaled by ``1 / (1 - dropout_p)``), drawn from the device's default
            generator; 1 gives zeros.
        is_causal: Mask key ``j`` from query ``i`` when ``j > i`` (top-left aligned).
        scale: The softmax scale; ``1 / sqrt(D)`` when None.
        enable_gqa: Let Hq be a multiple of Hkv (query head ``h`` reads key/value head
            ``h // (Hq // Hkv)``).

    Returns:
        The [B, Hq, Lq, D] attention output, in the query's dtype.

    Raises:
        Unsupported: an unsupported dtype or head dim, or heads that differ without
            ``enable_gqa``.
    """
    unbatched = query.dim() == 3
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    p = _check(query, key, value, dropout_p)
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise Unsupported("query and key/value heads differ without enable_gqa")
    if is_causal and attn_mask is not None:
        raise Unsupported("both attn_mask and is_causal")  # torch raises here
    bias = _bias(attn_mask, query, key.shape[2])
    scale_f = _scale(scale, query.shape[3])
    if torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (query, key, value, bias)):
        out = _Attention.apply(query, key, value, bias, is_causal, scale_f, p)
    else:
        out = _Attention.forward(_NoCtx(), query, key, value, bias, is_causal, scale_f, p)
    return out.squeeze(0) if unbatched else out


class _NoCtx:
    """Stands for autograd's ctx when nothing needs a gradient (nothing is kept)."""

    def save_for_backward(self, *tensors: Any) -> None:
        pass
