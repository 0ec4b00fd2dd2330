"""Flash-attention kernels: forward with online softmax, backward without atomics.

Layout: every tensor is read through its (batch, head, row, col) strides, so the
transposed views SDPA hands over ([B, L, H, D] memory seen as [B, H, L, D]) are never
copied, and a broadcast attention bias has stride 0 on its broadcast dims; a boolean
mask is read as it is stored (:func:`bias_term`: 0 where True, -inf where False). Query head
``h`` reads key/value head ``h // GROUP`` (grouped-query attention).

Scores are kept in base 2: ``s2 = (q . k) * scale * log2(e) + bias * log2(e)``, so the
softmax uses ``exp2``; the saved logsumexp is in natural units (what torch's kernels
save, so torch's backward can be paired with this forward). Causal masking is
top-left aligned (key ``j`` is visible to query ``i`` when ``j <= i``), as torch's
``is_causal``. A row that sees no key gives a zero output and a logsumexp of -inf.

Dropout (``DROPOUT``, a constexpr: the kernels without it compile to what they were
before it existed) drops a probability after the softmax, as torch's SDPA does: the
normaliser and the saved logsumexp are the full softmax's, the kept probabilities are
scaled by ``1 / (1 - p)`` and the dropped ones are 0. Its mask is counter-based
(:func:`dropout_keep`): the element (batch ``b``, query head ``h``, query ``i``, key
``j``) takes 16 bits of the Philox output for counter
``offset + ((b * H + h) * Lq + i) * ceil(Lk / 8) + j // 8`` under the call's key (word
``j % 4``, its low half when ``j % 8 < 4``), so any tile shape (the forward's, the
backward's transposed ones) regenerates the same mask and nothing is stored. Sixteen
bits an element, not 32, halve the Philox work, which dominates the dropout kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gemshal.kernel import kernel

__all__ = ["attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel", "attention_bwd_pre_kernel",
           "attention_dropout_mask_kernel", "attention_fwd_kernel", "bias_term", "dropout_keep"]

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def bias_term(bias):
    """A loaded bias tile as its term of the base-2 scores: a boolean mask (True:
    attend) is read as it is stored, 0 where it attends and -inf where not (what torch's
    SDPA makes of it, without converting it to an additive tensor first); an additive
    bias is scaled by log2(e)."""
    if bias.dtype == tl.int1:
        return tl.where(bias, 0.0, float("-inf"))
    else:
        return bias.to(tl.float32) * LOG2E


@triton.jit
def _kept_halves(r, t):
    """Whether the low and the high 16 bits of the 32-bit numbers ``r`` are ``>= t``."""
    return (r & 0xFFFF) >= t, (r >> 16) >= t


@triton.jit
def dropout_keep(seed, offset, bh, rows, start_n, Lq, Lk, p, BLOCK_N: tl.constexpr):
    """The kept elements of rows ``rows`` and keys ``start_n .. start_n + BLOCK_N`` of
    head row ``bh = b * H + h``: a [len(rows), BLOCK_N] boolean tile (``start_n`` and
    ``BLOCK_N`` multiples of 8). Each Philox call gives eight 16-bit numbers, one per key
    of a group of eight; an element is kept when its number ``u`` (in 0 .. 65535) is at
    least ``ceil(p * 65536)``: probability ``1 - ceil(p * 65536) / 65536``, within
    2**-16 of ``1 - p`` (0 and 1 exact)."""
    groups = start_n // 8 + tl.arange(0, BLOCK_N // 8)
    width = (Lk + 7) // 8
    n = (bh.to(tl.int64) * Lq + rows.to(tl.int64))[:, None] * width + groups[None, :]
    counter = n.to(tl.uint64) + offset.to(tl.uint64)
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    t = tl.ceil(p * 65536.0).to(tl.uint32)
    lo0, hi0 = _kept_halves(r0, t)
    lo1, hi1 = _kept_halves(r1, t)
    lo2, hi2 = _kept_halves(r2, t)
    lo3, hi3 = _kept_halves(r3, t)
    # Key j = 8 * group + lane reads word lane % 4, its low half for lanes 0-3 and its
    # high half for lanes 4-7 (interleave puts its first operand at even positions).
    return tl.interleave(
        tl.interleave(tl.interleave(lo0, hi0), tl.interleave(lo2, hi2)),
        tl.interleave(tl.interleave(lo1, hi1), tl.interleave(lo3, hi3)))


@triton.jit
def _fwd_blocks(
    acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, bias_base, rows, mask_m, lo, hi,
    skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh, dropout_p,
    D: tl.constexpr,
    DESC: tl.constexpr,  # K and V tiles through tensor descriptors (zero past Lk)
    MASKED: tl.constexpr,  # mask keys past Lk and, with CAUSAL, keys after each query
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    DROPOUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # The online softmax over key blocks lo, lo + BLOCK_N, ... < hi. Unmasked blocks
    # (MASKED False) lie inside Lk and before every query of the tile: no key mask, no
    # causal test, unmasked loads.
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            mask_n = cols < Lk
        if DESC:
            kt = tl.trans(k_desc.load([start_n, 0]))
            v = v_desc.load([start_n, 0])
        else:
            k_ptrs = k_base + cols[None, :] * skn + offs_d[:, None] * skd
            v_ptrs = v_base + cols[:, None] * svn + offs_d[None, :] * svd
            if MASKED:
                kt = tl.load(k_ptrs, mask=mask_n[None, :], other=0.0)
                v = tl.load(v_ptrs, mask=mask_n[:, None], other=0.0)
            else:
                kt = tl.load(k_ptrs)
                v = tl.load(v_ptrs)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, kt, input_precision=PRECISION)
        if HAS_BIAS or MASKED:
            s = qk * qk_scale
            if HAS_BIAS:
                bias_mask = mask_m[:, None] & mask_n[None, :] if MASKED else mask_m[:, None]
                bias = tl.load(bias_base + rows[:, None] * sbm + cols[None, :] * sbn,
                               mask=bias_mask, other=0.0)
                s += bias_term(bias)
            if MASKED:
                keep = mask_n[None, :]
                if CAUSAL:
                    keep = keep & (cols[None, :] <= rows[:, None])
                s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with no visible key so far keeps m = -inf; subtract 0 there (no nan).
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_use[:, None])
        else:
            # Every score is finite here: fold the scale into the exponent's argument.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_use = m_new
            p = tl.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DROPOUT:
            # The normaliser l_i sums every probability; only the kept ones reach v.
            kept = dropout_keep(seed, offset, bh, rows, start_n, Lq, Lk, dropout_p, BLOCK_N)
            p = tl.where(kept, p, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        # The row statistics last: fewer values live across the products.
        l_i = l_i * alpha + l_ij
        m_i = m_new
    return acc, l_i, m_i


@kernel("attention_fwd", key=["Lq", "Lk", "D", "DROPOUT"])
@triton.jit
def attention_fwd_kernel(
    Q, K, V,  # [B, H, Lq, D], [B, H // GROUP, Lk, D] (any strides)
    Bias,  # additive bias broadcast to [B, H, Lq, Lk] (read when HAS_BIAS)
    O,  # [B, H, Lq, D] output
    LSE,  # [B, H, Lq] float32 logsumexp (natural log)
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sbb, sbh, sbm, sbn,
    sob, soh, som, sod,
    slb, slh, slm,
    H, GROUP, Lq, Lk,
    qk_scale,  # softmax scale * log2(e)
    # Dropout's arguments come last, so the others keep their parameter offsets (the
    # kernel without DROPOUT compiles to the code it had before they existed).
    Seed, Offset,  # 0-dim int64 Philox key and counter offset (read when DROPOUT)
    dropout_p,  # probability of dropping an element (when DROPOUT)
    dropout_scale,  # 1 / (1 - dropout_p), 0 when dropout_p is 1
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,  # widen bf16 tiles to fp32 before tl.dot (the interpreter)
    PRECISION: tl.constexpr,  # tl.dot input_precision for fp32 operands
    DROPOUT: tl.constexpr,
    DESC: tl.constexpr,  # Q, K, V and O tiles through tensor descriptors (unit last stride)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Causal: the last query blocks see the most keys; they start first, so the short
    # programs fill the tail of the launch.
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mask_m = rows < Lq

    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    if DESC:
        # One [L, D] matrix per (batch, head); rows past L load as zeros, and the
        # output's are not written.
        k_desc = tl.make_tensor_descriptor(k_base, shape=[Lk, D], strides=[skn, 1],
                                           block_shape=[BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(v_base, shape=[Lk, D], strides=[svn, 1],
                                           block_shape=[BLOCK_N, D])
        q_desc = tl.make_tensor_descriptor(Q + b * sqb + h * sqh, shape=[Lq, D],
                                           strides=[sqm, 1], block_shape=[BLOCK_M, D])
        q = q_desc.load([pid_m * BLOCK_M, 0])
    else:
        k_desc = 0
        v_desc = 0
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd,
                    mask=mask_m[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    bias_base = Bias + b * sbb + h * sbh
    seed = 0
    offset = 0
    if DROPOUT:
        seed = tl.load(Seed)
        offset = tl.load(Offset)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    # Keys [0, full) are inside Lk and visible to every query of the tile (causal: they
    # come before its first query); keys [full, hi) need the masks.
    hi = Lk
    full = (Lk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(Lk, (pid_m + 1) * BLOCK_M)  # later key blocks are all masked
        full = (tl.minimum(Lk, pid_m * BLOCK_M) // BLOCK_N) * BLOCK_N
    bh = b * H + h
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, bias_base, rows, mask_m, 0, full,
        skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh, dropout_p,
        D, DESC, False, CAUSAL, HAS_BIAS, UPCAST, PRECISION, DROPOUT, BLOCK_N)
    acc, l_i, m_i = _fwd_blocks(
        acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, bias_base, rows, mask_m, full, hi,
        skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh, dropout_p,
        D, DESC, True, CAUSAL, HAS_BIAS, UPCAST, PRECISION, DROPOUT, BLOCK_N)

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    if DROPOUT:
        out = out * dropout_scale
    if DESC:
        o_desc = tl.make_tensor_descriptor(O + b * sob + h * soh, shape=[Lq, D],
                                           strides=[som, 1], block_shape=[BLOCK_M, D])
        o_desc.store([pid_m * BLOCK_M, 0], out.to(O.dtype.element_ty))
    else:
        tl.store(O + b * sob + h * soh + rows[:, None] * som + offs_d[None, :] * sod,
                 out.to(O.dtype.element_ty), mask=mask_m[:, None])
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    tl.store(LSE + b * slb + h * slh + rows * slm, lse, mask=mask_m)


@kernel("attention_bwd_pre", key=["Lq", "D"])
@triton.jit
def attention_bwd_pre_kernel(
    O, DO,  # [B, H, Lq, D]
    Delta,  # [B * H, Lq] float32, contiguous: rowsum(dO * O)
    sob, soh, som, sod,
    sdb, sdh, sdm, sdd,
    H, Lq,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mask = rows < Lq
    o = tl.load(O + b * sob + h * soh + rows[:, None] * som + offs_d[None, :] * sod,
                mask=mask[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdm + offs_d[None, :] * sdd,
                 mask=mask[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + pid_bh.to(tl.int64) * Lq + rows, tl.sum(o * do, 1), mask=mask)


@triton.jit
def _dkdv_blocks(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base, dbias_base, cols, mask_n,
    lo, hi, n0, sqm, sqd, sdom, sdod, slm, sbm, sbn, sgm, sgn, Lq, Lk, qk_scale, seed, offset,
    bh, dropout_p, dropout_scale,
    D: tl.constexpr,
    MASKED: tl.constexpr,  # mask queries past Lq and, with CAUSAL, queries before a key
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # dK and dV of BLOCK_N keys over the query blocks lo, lo + BLOCK_M, ... < hi of one
    # query head. Unmasked blocks (MASKED False) lie inside Lq and after every key of the
    # tile: no query mask, no causal test, unmasked loads. Keys past Lk (a partial last
    # key block) only reach rows of dK and dV that are never stored.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        qt_ptrs = q_base + rows[None, :] * sqm + offs_d[:, None] * sqd
        do_ptrs = do_base + rows[:, None] * sdom + offs_d[None, :] * sdod
        if MASKED:
            mask_m = rows < Lq
            qt = tl.load(qt_ptrs, mask=mask_m[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=mask_m[:, None], other=0.0)
            lse = tl.load(lse_base + rows * slm, mask=mask_m, other=0.0)
            delta = tl.load(delta_base + rows, mask=mask_m, other=0.0)
        else:
            qt = tl.load(qt_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_base + rows * slm)
            delta = tl.load(delta_base + rows)
        if UPCAST:
            qt = qt.to(tl.float32)
            do = do.to(tl.float32)
        # A row that saw no key (lse = -inf) has p = 0 everywhere.
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
        st = tl.dot(k, qt, input_precision=PRECISION)
        if HAS_BIAS:
            st = st * qk_scale
            tile = mask_m[None, :] & mask_n[:, None] if MASKED else mask_n[:, None]
            bias = tl.load(bias_base + rows[None, :] * sbm + cols[:, None] * sbn,
                           mask=tile, other=0.0)
            pt = tl.exp2(st + bias_term(bias) - lse2[None, :])
        else:
            pt = tl.exp2(st * qk_scale - lse2[None, :])
        if MASKED:
            keep = mask_m[None, :] & mask_n[:, None]
            if CAUSAL:
                keep = keep & (cols[:, None] <= rows[None, :])
            pt = tl.where(keep, pt, 0.0)
        if DROPOUT:
            # Z = P * kept / (1 - p): dV = Z^T dO, dP = dZ * kept / (1 - p), and
            # rowsum(dP * P) is still rowsum(dO * O) (delta).
            kept = tl.trans(dropout_keep(seed, offset, bh, rows, n0, Lq, Lk, dropout_p,
                                         BLOCK_N))
            zt = tl.where(kept, pt * dropout_scale, 0.0)
            dv = tl.dot(zt.to(do.dtype), do, dv, input_precision=PRECISION)
        else:
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if DROPOUT:
            dpt = tl.where(kept, dpt * dropout_scale, 0.0)
        dst = pt * (dpt - delta[None, :])
        if BIAS_GRAD:
            written = keep if MASKED else mask_n[:, None] & (rows[None, :] >= 0)
            tl.store(dbias_base + rows[None, :] * sgm + cols[:, None] * sgn,
                     dst.to(dbias_base.dtype.element_ty), mask=written)
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=PRECISION)
    return dk, dv


@kernel("attention_bwd_dkdv", key=["Lq", "Lk", "D", "DROPOUT"])
@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, Bias, DO,
    LSE,  # [B, H, Lq] float32 (natural log), any strides
    Delta,  # [B * H, Lq] float32
    DK, DV,  # [B, H // GROUP, Lk, D]
    DBias,  # [B, H, Lq, Lk] gradient of the bias (written when BIAS_GRAD), zero-filled
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sbb, sbh, sbm, sbn,
    sdob, sdoh, sdom, sdod,
    slb, slh, slm,
    sdkb, sdkh, sdkn, sdkd,
    sdvb, sdvh, sdvn, sdvd,
    sgb, sgh, sgm, sgn,
    H, GROUP, Lq, Lk,
    scale,
    Seed, Offset,  # the forward's Philox key and counter offset (read when DROPOUT)
    dropout_p,
    dropout_scale,
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program owns BLOCK_N keys of one key/value head and walks every query block of
    # the GROUP query heads reading it, so dK and dV are summed here, without atomics.
    # Scores are computed transposed ([BLOCK_N, BLOCK_M]) so the sums over queries are
    # plain tl.dot products. Causal: the first key blocks see the most queries, and
    # they already start first.
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    HKV = H // GROUP
    b = (pid_bh // HKV).to(tl.int64)
    hk = (pid_bh % HKV).to(tl.int64)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    mask_n = cols < Lk
    k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :] * skd,
                mask=mask_n[:, None], other=0.0)
    v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :] * svd,
                mask=mask_n[:, None], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    qk_scale = scale * LOG2E
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    seed = 0
    offset = 0
    if DROPOUT:
        seed = tl.load(Seed)
        offset = tl.load(Offset)
    # Query blocks [lo, diag) may hold a query before one of the tile's keys (causal),
    # [diag, full) are inside Lq and after all of them, [full, Lq) is the partial last.
    lo = 0
    diag = 0
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M  # earlier query blocks see none of these keys
        diag = tl.minimum(lo + tl.cdiv(n0 + BLOCK_N - lo, BLOCK_M) * BLOCK_M,
                          (Lq // BLOCK_M) * BLOCK_M)
        diag = tl.maximum(diag, lo)
    full = tl.maximum((Lq // BLOCK_M) * BLOCK_M, diag)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        lse_base = LSE + b * slb + h * slh
        delta_base = Delta + bh * Lq
        bias_base = Bias + b * sbb + h * sbh
        dbias_base = DBias + b * sgb + h * sgh
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base, dbias_base,
            cols, mask_n, lo, diag, n0, sqm, sqd, sdom, sdod, slm, sbm, sbn, sgm, sgn, Lq,
            Lk, qk_scale, seed, offset, bh, dropout_p, dropout_scale,
            D, True, CAUSAL, HAS_BIAS, BIAS_GRAD, UPCAST, PRECISION, DROPOUT, BLOCK_M,
            BLOCK_N)
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base, dbias_base,
            cols, mask_n, diag, full, n0, sqm, sqd, sdom, sdod, slm, sbm, sbn, sgm, sgn, Lq,
            Lk, qk_scale, seed, offset, bh, dropout_p, dropout_scale,
            D, False, CAUSAL, HAS_BIAS, BIAS_GRAD, UPCAST, PRECISION, DROPOUT, BLOCK_M,
            BLOCK_N)
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, bias_base, dbias_base,
            cols, mask_n, full, Lq, n0, sqm, sqd, sdom, sdod, slm, sbm, sbn, sgm, sgn, Lq,
            Lk, qk_scale, seed, offset, bh, dropout_p, dropout_scale,
            D, True, CAUSAL, HAS_BIAS, BIAS_GRAD, UPCAST, PRECISION, DROPOUT, BLOCK_M,
            BLOCK_N)
    dk = dk * scale
    tl.store(DK + b * sdkb + hk * sdkh + cols[:, None] * sdkn + offs_d[None, :] * sdkd,
             dk.to(DK.dtype.element_ty), mask=mask_n[:, None])
    tl.store(DV + b * sdvb + hk * sdvh + cols[:, None] * sdvn + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=mask_n[:, None])


@triton.jit
def _dq_blocks(
    dq, q, do, lse2, delta, k_base, v_base, bias_base, rows, mask_m, lo, hi,
    skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh, dropout_p, dropout_scale,
    D: tl.constexpr,
    MASKED: tl.constexpr,  # mask keys past Lk and, with CAUSAL, keys after each query
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    DROPOUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kt_ptrs = k_base + cols[None, :] * skn + offs_d[:, None] * skd
        vt_ptrs = v_base + cols[None, :] * svn + offs_d[:, None] * svd
        if MASKED:
            mask_n = cols < Lk
            kt = tl.load(kt_ptrs, mask=mask_n[None, :], other=0.0)
            vt = tl.load(vt_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        qk = tl.dot(q, kt, input_precision=PRECISION)
        if HAS_BIAS:
            tile = mask_m[:, None] & mask_n[None, :] if MASKED else mask_m[:, None]
            bias = tl.load(bias_base + rows[:, None] * sbm + cols[None, :] * sbn,
                           mask=tile, other=0.0)
            p = tl.exp2(qk * qk_scale + bias_term(bias) - lse2[:, None])
        else:
            p = tl.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            keep = mask_m[:, None] & mask_n[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, vt, input_precision=PRECISION)
        if DROPOUT:
            kept = dropout_keep(seed, offset, bh, rows, start_n, Lq, Lk, dropout_p, BLOCK_N)
            dp = tl.where(kept, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=PRECISION)
    return dq


@kernel("attention_bwd_dq", key=["Lq", "Lk", "D", "DROPOUT"])
@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, Bias, DO, LSE, Delta,
    DQ,  # [B, H, Lq, D]
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sbb, sbh, sbm, sbn,
    sdob, sdoh, sdom, sdod,
    slb, slh, slm,
    sdqb, sdqh, sdqm, sdqd,
    H, GROUP, Lq, Lk,
    scale,
    Seed, Offset,  # the forward's Philox key and counter offset (read when DROPOUT)
    dropout_p,
    dropout_scale,
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program owns BLOCK_M queries of one head and walks the key blocks they see
    # (causal: the last query blocks, which see the most keys, start first).
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    mask_m = rows < Lq
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd,
                mask=mask_m[:, None], other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_d[None, :] * sdod,
                 mask=mask_m[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + b * slb + h * slh + rows * slm, mask=mask_m, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    delta = tl.load(Delta + pid_bh.to(tl.int64) * Lq + rows, mask=mask_m, other=0.0)
    qk_scale = scale * LOG2E
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    bias_base = Bias + b * sbb + h * sbh
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    seed = 0
    offset = 0
    if DROPOUT:
        seed = tl.load(Seed)
        offset = tl.load(Offset)
    # As the forward: keys [0, full) need no mask, [full, hi) do.
    hi = Lk
    full = (Lk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(Lk, (pid_m + 1) * BLOCK_M)
        full = (tl.minimum(Lk, pid_m * BLOCK_M) // BLOCK_N) * BLOCK_N
    bh = b * H + h
    dq = _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, bias_base, rows, mask_m, 0, full,
                    skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh,
                    dropout_p, dropout_scale,
                    D, False, CAUSAL, HAS_BIAS, UPCAST, PRECISION, DROPOUT, BLOCK_N)
    dq = _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, bias_base, rows, mask_m, full, hi,
                    skn, skd, svn, svd, sbm, sbn, Lq, Lk, qk_scale, seed, offset, bh,
                    dropout_p, dropout_scale,
                    D, True, CAUSAL, HAS_BIAS, UPCAST, PRECISION, DROPOUT, BLOCK_N)
    dq = dq * scale
    tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqm + offs_d[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty), mask=mask_m[:, None])


@triton.jit
def attention_dropout_mask_kernel(
    Seed, Offset,  # 0-dim int64 Philox key and counter offset
    Out,  # [B * H, Lq, Lk] bool, contiguous: the kept elements
    Lq, Lk,
    p,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The mask the attention kernels draw for a key, materialised (tests only)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(2) * BLOCK_N
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    kept = dropout_keep(tl.load(Seed), tl.load(Offset), bh, rows, start_n, Lq, Lk, p, BLOCK_N)
    tl.store(Out + (bh * Lq + rows[:, None]) * Lk + cols[None, :], kept,
             mask=(rows[:, None] < Lq) & (cols[None, :] < Lk))
