"""Split-KV ("flash-decoding") attention forward for decode shapes.

At decode a call has few query rows (``Lq`` of 1 to a few) and a long key/value cache,
often with grouped-query heads (``GROUP = Hq // Hkv`` query heads share a key/value
head). :func:`~gemsops.ops.attention.kernels.attention_fwd_kernel` gives such a call
one program per query head: few programs, each walking every key alone with a tile
whose rows are mostly padding, and each of the GROUP heads of a key/value head reading
that head's keys and values again. This path serves those calls in two launches:

* :func:`attention_decode_kernel`, grid ``(splits, B * Hkv)``: a program takes one
  key/value head ``hk`` of one batch row and one contiguous chunk of its keys, and every
  query row that reads that head: the GROUP heads times the Lq rows, packed into the
  tile's rows (tile row ``r`` is query head ``hk * GROUP + r // Lq``, query row
  ``r % Lq``; ``BLOCK_M``, the row count padded to a power of two >= 16, as ``tl.dot``
  needs). Each key block is loaded once for all of them. It keeps the chunk's online
  softmax in base 2 (as the forward kernel: ``exp2``, the scale times ``log2(e)``
  folded in) and writes the chunk's unnormalised fp32 accumulator, row max ``m`` and row
  sum ``l`` to a workspace.
* :func:`attention_decode_combine_kernel`, one program per query row: rescales the
  splits' accumulators and sums to the common max, divides, and writes the output in its
  dtype through its strides and the natural logsumexp (float32; a row that saw no key
  gets a zero output and -inf, as the forward kernel gives it).

When the rule gives a single split, the first kernel normalises and writes the output
and logsumexp itself (``FINAL``): one launch, no workspace.

**The split rule** (:func:`split_plan`): chunks are multiples of :data:`GRANULE` keys
(every ``BLOCK_N`` of the tuning entry divides it) and hold at least
:data:`SPLIT_KEYS` keys; among the split counts that are distinct in chunks, it takes
the fewest whose wave efficiency (``programs / slots`` over its ceiling, ``slots`` being
:data:`PROGRAMS_PER_SM` programs per multiprocessor) is within 85% of the best, and
does not split at all when ``B * Hkv`` programs already fill 80% of the slots (the rule
flash-attention's split-KV heuristic uses).

**When it serves** (:func:`takes`): no dropout (dropout calls keep the forward kernel,
which draws its mask), at most :data:`MAX_ROWS` packed query rows per key/value head,
and at least :data:`MIN_KEYS` keys. Causal masking (top-left aligned, key ``j`` visible
to query ``i`` when ``j <= i``: tile rows have their own ``i``), an additive bias or a
boolean mask with any strides (stride 0 on broadcast dims, -inf entries allowed), fp16,
bf16 and fp32 (fp32 products follow torch's float32 matmul precision; the interpreter
widens bf16 tiles, ``UPCAST``) and any strides of q, k, v and the output are served.

**Replay**: the workspace is allocated for each call (``torch.empty``) and every slot
the combine reads is written by the split kernel first (a split with no visible key
writes ``m = -inf, l = 0`` and a zero accumulator), so the SDPA forward overloads that
reach this path vouch for their workspaces (``replayable(workspaces=True)``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.kernel import kernel
from gemsops.ops.attention.kernels import bias_term
from gemsops.ops.grid import cdiv, next_power_of_2

__all__ = [
    "ENABLED",
    "FORCE_CHUNK",
    "GRANULE",
    "MAX_ROWS",
    "MAX_SPLITS",
    "MIN_KEYS",
    "PROGRAMS_PER_SM",
    "SPLIT_KEYS",
    "attention_decode_combine_kernel",
    "attention_decode_kernel",
    "forward",
    "split_plan",
    "takes",
]

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)

ENABLED = True
"""Whether :func:`takes` may choose this path at all (an A/B switch for benchmarks; a
call already kept by the replay memo replays what it recorded)."""

MIN_KEYS = 256
"""Fewest keys (visible ones, under causal masking) a call needs for this path."""

MAX_ROWS = 64
"""Most query rows per key/value head (``GROUP * Lq``, padded to a power of two) this
path packs into one tile."""

SPLIT_KEYS = 256
"""Fewest keys a split walks (a few hundred: its workspace row is small beside them)."""

GRANULE = 128
"""A split's keys are a multiple of this (every BLOCK_N of the tuning entry divides it)."""

PROGRAMS_PER_SM = 2
"""Split programs resident per multiprocessor the rule fills (a program's K/V pipeline
at BLOCK_N 64, two or three stages, takes under half a multiprocessor's shared memory)."""

MAX_SPLITS = 64
"""Most splits of one call (the combine holds a row's splits in one tile)."""

FORCE_CHUNK: int | None = None
"""Tests: a fixed chunk length (keys per split, any positive number) instead of the
rule's, so the interpreter runs several splits over a few hundred keys."""


@kernel("attention_decode", key=["Lk", "D", "BLOCK_M"])
@triton.jit
def attention_decode_kernel(
    Q, K, V,  # [B, H, Lq, D], [B, H // GROUP, Lk, D] (any strides)
    Bias,  # additive bias broadcast to [B, H, Lq, Lk] (read when HAS_BIAS)
    WS,  # float32 workspace: acc [R, SPLITS, D], then m and l [R, SPLITS] (not FINAL)
    O,  # [B, H, Lq, D] output (written when FINAL)
    LSE,  # [B, H, Lq] float32 logsumexp, natural log (written when FINAL)
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sbb, sbh, sbm, sbn,
    sob, soh, som, sod,
    slb, slh, slm,
    H, GROUP, Lq, Lk,
    CHUNK,  # keys per split
    SPLITS,
    M_OFF, L_OFF,  # where m and l start in WS (elements)
    qk_scale,  # softmax scale * log2(e)
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,  # widen bf16 tiles to fp32 before tl.dot (the interpreter)
    PRECISION: tl.constexpr,  # tl.dot input_precision for fp32 operands
    FINAL: tl.constexpr,  # one split: normalise and write O and LSE here
    BLOCK_M: tl.constexpr,  # GROUP * Lq padded to a power of two >= 16
    BLOCK_N: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    HKV = H // GROUP
    b = (pid_bh // HKV).to(tl.int64)
    hk = (pid_bh % HKV).to(tl.int64)
    # Tile row r: query head hk * GROUP + r // Lq, query row r % Lq.
    r = tl.arange(0, BLOCK_M)
    g = r // Lq
    i = r - g * Lq
    valid = r < GROUP * Lq
    h = hk * GROUP + g
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)

    q = tl.load(Q + b * sqb + h[:, None] * sqh + i[:, None] * sqm + offs_d[None, :] * sqd,
                mask=valid[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    bias_rows = Bias + b * sbb + h * sbh + i * sbm

    lo = pid_s * CHUNK
    hi = tl.minimum(lo + CHUNK, Lk)
    if CAUSAL:
        hi = tl.minimum(hi, Lq)  # no row sees a key at or past Lq
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < hi
        kt = tl.load(k_base + cols[None, :] * skn + offs_d[:, None] * skd,
                     mask=mask_n[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :] * svd,
                    mask=mask_n[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        if HAS_BIAS:
            bias = tl.load(bias_rows[:, None] + cols[None, :] * sbn,
                           mask=valid[:, None] & mask_n[None, :], other=0.0)
            s += bias_term(bias)
        keep = mask_n[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= i[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no visible key so far keeps m = -inf; subtract 0 there (no nan).
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    if FINAL:
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        out = acc / l_safe[:, None]
        tl.store(O + b * sob + h[:, None] * soh + i[:, None] * som + offs_d[None, :] * sod,
                 out.to(O.dtype.element_ty), mask=valid[:, None])
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
        tl.store(LSE + b * slb + h * slh + i * slm, lse, mask=valid)
    else:
        # Every valid row's slot is written, a split that saw no key included
        # (m = -inf, l = 0, acc = 0): the combine reads nothing unwritten.
        slot = ((b * H + h) * Lq + i) * SPLITS + pid_s
        tl.store(WS + slot[:, None] * D + offs_d[None, :], acc, mask=valid[:, None])
        tl.store(WS + M_OFF + slot, m_i, mask=valid)
        tl.store(WS + L_OFF + slot, l_i, mask=valid)


@kernel("attention_decode_combine", key=["SPLITS", "D"])
@triton.jit
def attention_decode_combine_kernel(
    WS,  # the split kernel's workspace
    O,  # [B, H, Lq, D] output
    LSE,  # [B, H, Lq] float32 logsumexp (natural log)
    sob, soh, som, sod,
    slb, slh, slm,
    H, Lq,
    SPLITS,
    M_OFF, L_OFF,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # SPLITS padded to a power of two
):
    row = tl.program_id(0).to(tl.int64)  # (b * H + h) * Lq + i
    bh = row // Lq
    i = row - bh * Lq
    b = bh // H
    h = bh - b * H
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    mask_s = offs_s < SPLITS
    slot = row * SPLITS + offs_s
    m = tl.load(WS + M_OFF + slot, mask=mask_s, other=float("-inf"))
    l = tl.load(WS + L_OFF + slot, mask=mask_s, other=0.0)
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_use)  # 0 for a split that saw no key
    l_sum = tl.sum(l * w, 0)
    acc = tl.load(WS + slot[:, None] * D + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0)
    empty = l_sum == 0.0
    l_safe = tl.where(empty, 1.0, l_sum)
    tl.store(O + b * sob + h * soh + i * som + offs_d * sod,
             (o / l_safe).to(O.dtype.element_ty))
    lse = tl.where(empty, float("-inf"), (m_use + tl.log2(l_safe)) * LN2)
    tl.store(LSE + b * slb + h * slh + i * slm, lse)


# --- host -------------------------------------------------------------------------


def takes(query: Tensor, key: Tensor, bias: Tensor | None, dropout: Any) -> bool:
    """Whether this path serves a forward (checked inputs: 4-dim, ``Hq % Hkv == 0``):
    no dropout, at most :data:`MAX_ROWS` packed rows, at least :data:`MIN_KEYS` keys.
    (``bias`` takes no part today: any additive bias or boolean mask is served.)"""
    if not ENABLED or dropout is not None:
        return False
    _, Hq, Lq, _ = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    return Lk >= MIN_KEYS and next_power_of_2((Hq // Hkv) * Lq) <= MAX_ROWS


def split_plan(programs: int, keys: int, multiprocessors: int) -> tuple[int, int]:
    """(splits, keys per split) for ``programs`` key/value heads (``B * Hkv``) over
    ``keys`` visible keys on a device of ``multiprocessors`` (see the module docstring):
    ``splits * chunk >= keys > (splits - 1) * chunk``, the chunk a multiple of
    :data:`GRANULE` and, beyond one split, at least :data:`SPLIT_KEYS`."""
    blocks = max(1, cdiv(keys, GRANULE))
    slots = PROGRAMS_PER_SM * max(1, multiprocessors)
    # From the blocks alone, so every key count of one block count plans alike.
    most = min(MAX_SPLITS, blocks, max(1, blocks * GRANULE // SPLIT_KEYS))
    if most == 1 or programs >= 0.8 * slots:
        return 1, blocks * GRANULE
    chosen = 1
    best = 0.0
    efficiency: list[float] = []
    for splits in range(1, most + 1):
        if splits > 1 and cdiv(blocks, splits) == cdiv(blocks, splits - 1):
            efficiency.append(0.0)  # the same chunks as one split fewer
            continue
        waves = programs * splits / slots
        eff = waves / math.ceil(waves)
        efficiency.append(eff)
        best = max(best, eff)
    for splits, eff in enumerate(efficiency, 1):
        if eff >= 0.85 * best:
            chosen = splits
            break
    chunk = cdiv(blocks, chosen) * GRANULE
    return cdiv(keys, chunk), chunk


class _Plan(NamedTuple):
    splits: int
    chunk: int
    grid: tuple[int, int]
    combine_grid: tuple[int]
    work: int  # workspace elements (0: FINAL)
    m_off: int
    l_off: int
    consts: dict[str, Any]
    combine_consts: dict[str, Any]


_PLANS: dict[tuple[Any, ...], _Plan] = {}
_SPLITS: dict[tuple[Any, ...], tuple[int, int]] = {}
_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}
_SLOTS = 4096


def _consts(key: tuple[Any, ...], make: Any) -> dict[str, Any]:
    """One dict per constant set, never changed (the launcher knows it by identity)."""
    hit = _CONSTS.get(key)
    if hit is None:
        hit = _CONSTS[key] = make()
    return hit


def _plan(query: Tensor, B: int, Hq: int, Hkv: int, Lq: int, Lk: int, causal: bool,
          has_bias: bool, precision: str) -> _Plan:
    dtype = query.dtype
    D = query.shape[3]
    vendor = gemshal.current_vendor()
    keys = min(Lk, Lq) if causal else Lk
    if FORCE_CHUNK is not None:
        chunk = max(1, FORCE_CHUNK)
        splits = max(1, cdiv(keys, chunk))
    else:
        skey = (vendor, query.get_device(), B * Hkv, cdiv(keys, GRANULE))
        hit = _SPLITS.get(skey)
        if hit is None:
            if len(_SPLITS) >= _SLOTS:
                _SPLITS.clear()
            sms = gemshal.device_of(query).multiprocessor_count
            hit = _SPLITS[skey] = split_plan(B * Hkv, keys, sms)
        splits, chunk = hit
        splits = max(1, cdiv(keys, chunk))
    rows = max(16, next_power_of_2((Hq // Hkv) * Lq))
    final = splits == 1
    interpreter = gemshal.current_device().interpreter

    def split_consts() -> dict[str, Any]:
        return {"D": D, "CAUSAL": causal, "HAS_BIAS": has_bias,
                # The interpreter multiplies bf16 tiles as raw 16-bit integers: widen them.
                "UPCAST": interpreter and dtype == torch.bfloat16,
                # fp32 operands follow torch's matmul precision ("highest": no tf32).
                "PRECISION": ("ieee" if dtype == torch.float32 and precision == "highest"
                              else None),
                "FINAL": final, "BLOCK_M": rows}

    block_s = max(2, next_power_of_2(splits))
    consts = _consts(("split", vendor, interpreter, dtype, D, causal, has_bias, precision,
                      final, rows), split_consts)
    combine = _consts(("combine", D, block_s), lambda: {"D": D, "BLOCK_S": block_s})
    R = B * Hq * Lq
    m_off = R * splits * D
    work = 0 if final else m_off + 2 * R * splits
    return _Plan(splits, chunk, (splits, B * Hkv), (R,), work, m_off, m_off + R * splits,
                 consts, combine)


def forward(query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, causal: bool,
            scale: float, out: Tensor, lse: Tensor) -> None:
    """out = softmax(scale * q k^T + bias, causal) v; lse = its row logsumexp (natural),
    by split keys (see the module docstring). Shapes as the forward kernel's: q and out
    [B, Hq, Lq, D], k and v [B, Hkv, Lk, D], bias None or broadcast to
    [B, Hq, Lq, Lk], lse [B, Hq, Lq] float32; a non-empty call (``B * Hq * Lq > 0``)."""
    B, Hq, Lq, _ = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    precision = torch.get_float32_matmul_precision()
    pkey = (gemshal.current_vendor(), query.get_device(), query.dtype, query.shape,
            Hkv, Lk, causal, bias is not None, precision, FORCE_CHUNK)
    plan = _PLANS.get(pkey)
    if plan is None:
        if len(_PLANS) >= _SLOTS:
            _PLANS.clear()
        plan = _PLANS[pkey] = _plan(query, B, Hq, Hkv, Lq, Lk, causal, bias is not None,
                                    precision)
    ws = lse if not plan.work else torch.empty(plan.work, dtype=torch.float32,
                                               device=query.device)
    if bias is None:
        bias_arg: Tensor = query
        sb: tuple[int, ...] = (0, 0, 0, 0)
    else:
        bias_arg = bias
        sb = bias.stride()
    attention_decode_kernel.launch(
        plan.grid,
        (query, key, value, bias_arg, ws, out, lse,
         *query.stride(), *key.stride(), *value.stride(), *sb, *out.stride(), *lse.stride(),
         Hq, Hq // Hkv, Lq, Lk, plan.chunk, plan.splits, plan.m_off, plan.l_off,
         scale * 1.4426950408889634),
        plan.consts,
    )
    if plan.work:
        attention_decode_combine_kernel.launch(
            plan.combine_grid,
            (ws, out, lse, *out.stride(), *lse.stride(), Hq, Lq, plan.splits, plan.m_off,
             plan.l_off),
            plan.combine_consts,
        )
