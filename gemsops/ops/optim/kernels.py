"""The multi-tensor Triton kernels: one elementwise ``_foreach_*`` kernel, fused Adam(W) and
fused SGD.

Every kernel takes one launch over a whole group of tensors. Its first argument is the
group's int64 table (built by :mod:`gemsops.ops.optim.tables`)::

    [0, T)            tile starts: program p works on tensor t where starts[t] <= p
    [T, 2T)           element counts
    [(2+k)T, (3+k)T)  data pointers of list k (k = 0, 1, ...)

A program owns one *tile* of ``TILE`` elements of one tensor (tiles never straddle two
tensors) and walks it in ``BLOCK``-wide steps: a loop of at most ``TILE // BLOCK``
whole, unmasked steps, then one masked step for a ragged end, so the per-program work
(finding the tensor, loading its pointers, the scalars, Adam's bias corrections) is paid
once per tile, not once per block.

**Vector loads.** A pointer loaded from a table tells the compiler nothing of its
alignment, so every element would be its own 2- or 4-byte load (the PTX of the first
version held only ``ld.global.b16`` for bfloat16 lists). Where the host found every data
pointer of a group 16-byte aligned (``ALIGNED``: torch's allocator aligns each storage
to far more; a view into one may not be), the kernels declare the pointers so, and the
unmasked steps load and store 16 bytes at a time. A masked step stays scalar: its mask
compares with a count of unknown divisibility.

A program finds its tensor by a binary search of the starts (``STEPS`` halvings, the
bit length of T - 1), then casts the pointer it loads to the list's element type: the
``W*`` arguments are one-element "witness" tensors of each list's dtype, whose pointer
type ``.dtype`` is the target of the cast. Scalars come from ``S``, a small device vector
of the compute dtype (uniform scalars first, then one per tensor), so float64 groups get
float64 scalars and no launch specializes on a scalar's value.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gemshal.kernel import kernel
from gemsops.ops.pointwise.codegen import to_half
from gemsops.ops.pointwise.elementwise import div_true, maximum, minimum, neg, sqrt

__all__ = [
    "ADD", "ADDCDIV", "ADDCMUL", "ADD_S", "COPY", "DIV", "DIV_S", "LERP", "LERP_S", "MAX",
    "MAX_S", "MIN", "MIN_S", "MUL", "MUL_S", "NEG", "RECIP", "SQRT", "ZERO",
    "adam_kernel", "foreach_kernel", "sgd_kernel",
]

# The elementwise formulas of foreach_kernel (a, b, c: the lists read; s: the scalar).
ADD = 0  # a + s * b (s: alpha)
ADD_S = 1  # a + s
MUL = 2  # a * b
MUL_S = 3  # a * s
DIV = 4  # a / b
DIV_S = 5  # a / s
LERP = 6  # lerp(a, b, weight c)
LERP_S = 7  # lerp(a, b, weight s)
ADDCMUL = 8  # a + s * b * c
ADDCDIV = 9  # a + s * (b / c)
SQRT = 10
NEG = 11
RECIP = 12
MAX = 13  # maximum(a, b), nan propagating as torch.maximum
MAX_S = 14
MIN = 15
MIN_S = 16
COPY = 17  # a, cast to the output's dtype
ZERO = 18

# Scalar sources of foreach_kernel.
NO_SCALAR = 0
UNIFORM = 1  # S[0]
PER_TENSOR = 2  # S[1 + t]
TENSOR = 3  # X[0] * S[0] (a 0-dim device tensor times alpha)


_COUNTS = ["T", "STEPS"]
"""The group's tensor count and search depth are never specialized on: they steer only
:func:`_locate`'s search, once per program, and specialized (1, divisible by 16, else)
they would compile a kernel anew for each group size a run meets."""


@triton.jit
def _locate(Table, T, STEPS):
    """(tensor, block within it) of this program: the last start <= the program id."""
    pid = tl.program_id(0).to(tl.int64)
    lo = pid * 0
    hi = lo + T - 1
    for _ in range(STEPS):
        mid = (lo + hi + 1) // 2
        go = tl.load(Table + mid) <= pid
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid - 1)
    return lo, pid - tl.load(Table + lo)


@triton.jit
def _tile(Table, T, STEPS, FoundInf, HAS_INF: tl.constexpr, TILE: tl.constexpr,
          BLOCK: tl.constexpr):
    """This program's tensor, the first element of its tile, the tile's end (clipped to
    the tensor), its count of whole ``BLOCK`` steps and where its ragged rest begins
    (nothing to do where ``HAS_INF`` and found_inf is 1: the update is skipped)."""
    t, tile = _locate(Table, T, STEPS)
    n = tl.load(Table + T + t)
    base = tile * TILE
    end = tl.minimum(n, base + TILE)
    if HAS_INF:
        end = tl.where(tl.load(FoundInf).to(tl.float32) == 1.0, base, end)
    full = ((end - base) // BLOCK).to(tl.int32)
    return t, base, end, full, base + full * BLOCK


@triton.jit
def _ptr(Table, slot, W, ALIGNED: tl.constexpr):
    """The data pointer in table ``slot``, typed as the witness ``W``'s pointer, and
    declared 16-byte aligned where ``ALIGNED`` (the host checked every pointer)."""
    p = tl.load(Table + slot).to(W.dtype)
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def _ld(P, offs, mask, other, ACC: tl.constexpr):
    """``P[offs]`` in ``ACC``; unmasked (so vectorizable) where ``mask`` is None."""
    if mask is None:  # noqa: SIM108 - a static if in Triton, not a select
        v = tl.load(P + offs)
    else:
        v = tl.load(P + offs, mask=mask, other=other)
    return v.to(ACC)


@triton.jit
def _store(P, offs, v, mask):
    if P.dtype.element_ty == tl.float16 or P.dtype.element_ty == tl.bfloat16:
        # Round to nearest even as torch does (the interpreter's own cast truncates).
        v = to_half(v, P.dtype.element_ty)
    else:
        v = v.to(P.dtype.element_ty)
    tl.store(P + offs, v, mask=mask)


@triton.jit
def _lerp(a, b, w):
    # ATen's lerp: from the nearer end, so weight 1 gives b exactly.
    d = b - a
    return tl.where(tl.abs(w) < 0.5, a + w * d, b - d * (1.0 - w))

@triton.jit
def _foreach_math(a, b, c, s, OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """The elementwise formula ``OP`` (the module's constants) of one block."""
    if OP == 0:
        r = a + s * b
    elif OP == 1:
        r = a + s
    elif OP == 2:
        r = a * b
    elif OP == 3:
        r = a * s
    elif OP == 4:
        r = div_true(a, b)
    elif OP == 5:
        r = div_true(a, s)
    elif OP == 6:
        r = _lerp(a, b, c)
    elif OP == 7:
        r = _lerp(a, b, s)
    elif OP == 8:
        r = a + s * b * c
    elif OP == 9:
        r = a + s * div_true(b, c)  # torch's CUDA foreach: value * (b / c)
    elif OP == 10:
        r = sqrt(a)
    elif OP == 11:
        r = neg(a)
    elif OP == 12:
        r = div_true(tl.full((BLOCK,), 1, ACC), a)
    elif OP == 13:
        r = maximum(a, b)
    elif OP == 14:
        r = maximum(a, tl.full((BLOCK,), 0, ACC) + s)
    elif OP == 15:
        r = minimum(a, b)
    elif OP == 16:
        r = minimum(a, tl.full((BLOCK,), 0, ACC) + s)
    elif OP == 17:
        r = a
    else:
        r = tl.zeros((BLOCK,), ACC)
    return r


@triton.jit
def _foreach_step(ap, bp, cp, op, offs, mask, s, OP: tl.constexpr, NIN: tl.constexpr,
                  ACC: tl.constexpr, BLOCK: tl.constexpr):
    """One block of foreach_kernel: read the ``NIN`` lists, apply ``OP``, store."""
    a = s
    b = s
    c = s
    if NIN >= 1:
        a = _ld(ap, offs, mask, 1, ACC)
    if NIN >= 2:
        b = _ld(bp, offs, mask, 1, ACC)
    if NIN >= 3:
        c = _ld(cp, offs, mask, 1, ACC)
    _store(op, offs, _foreach_math(a, b, c, s, OP, ACC, BLOCK), mask)


@kernel("foreach", key=[])
@triton.jit(do_not_specialize=_COUNTS)
def foreach_kernel(
    Table,  # the group's table (module docstring)
    S,  # scalars in ACC: uniform first, then one per tensor
    X,  # a 0-dim device tensor (SCALAR == TENSOR), else any witness
    WA, WB, WC, WO,  # witnesses of the lists read (a, b, c) and of the output
    T,  # tensors in the group
    STEPS,  # binary-search halvings: (T - 1).bit_length()
    OP: tl.constexpr,
    NIN: tl.constexpr,  # lists read (0-3), at table lists 0..NIN-1
    OUT: tl.constexpr,  # the output's table list (0: in place into a)
    SCALAR: tl.constexpr,
    ACC: tl.constexpr,  # compute dtype: float32, or float64 for float64 groups
    ALIGNED: tl.constexpr,  # every data pointer of the group is 16-byte aligned
    BLOCK: tl.constexpr,  # elements per loop step
    TILE: tl.constexpr,  # elements per program (the table's unit), a multiple of BLOCK
):
    t, base, end, full, rest = _tile(Table, T, STEPS, Table, False, TILE, BLOCK)
    # Everything per tensor is loaded once per program, before the loop over its tile.
    ap = WA
    bp = WB
    cp = WC
    if NIN >= 1:
        ap = _ptr(Table, 2 * T + t, WA, ALIGNED)
    if NIN >= 2:
        bp = _ptr(Table, 3 * T + t, WB, ALIGNED)
    if NIN >= 3:
        cp = _ptr(Table, 4 * T + t, WC, ALIGNED)
    op = _ptr(Table, (2 + OUT) * T + t, WO, ALIGNED)
    s = tl.zeros((BLOCK,), ACC)  # unused unless SCALAR
    if SCALAR == 1:
        s = tl.load(S).to(ACC)
    elif SCALAR == 2:
        s = tl.load(S + 1 + t).to(ACC)
    elif SCALAR == 3:
        s = tl.load(X).to(ACC) * tl.load(S).to(ACC)
    for i in range(0, full):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        _foreach_step(ap, bp, cp, op, offs, None, s, OP, NIN, ACC, BLOCK)
    if rest < end:
        offs = rest + tl.arange(0, BLOCK)
        _foreach_step(ap, bp, cp, op, offs, offs < end, s, OP, NIN, ACC, BLOCK)


@triton.jit
def _powi(base, step):
    """``base ** step`` for a whole-valued step, by squaring, in base's dtype (float64
    where the device has it: torch's CPU kernel takes these powers in double); a
    fractional part is applied through exp2 in float32."""
    whole = tl.floor(step)
    e = whole.to(tl.int64)
    r = base * 0 + 1
    sq = base
    while e > 0:
        r = tl.where((e & 1) == 1, r * sq, r)
        sq = sq * sq
        e = e >> 1
    frac = (step - whole).to(tl.float32)
    part = tl.exp2(frac * tl.log2(base.to(tl.float32)))
    return tl.where(frac == 0, r, r * part.to(base.dtype))


@triton.jit
def _adam_step(pp, gp, mp, vp, xp, offs, mask, lr, wd, beta1, beta2, eps, bc2_sqrt,
               step_size, scale, ADAMW: tl.constexpr, AMSGRAD: tl.constexpr,
               MAXIMIZE: tl.constexpr, HAS_SCALE: tl.constexpr, ACC: tl.constexpr):
    """One block of adam_kernel."""
    p = _ld(pp, offs, mask, 0, ACC)
    g = _ld(gp, offs, mask, 0, ACC)
    m = _ld(mp, offs, mask, 0, ACC)
    v = _ld(vp, offs, mask, 0, ACC)
    if HAS_SCALE:
        g = div_true(g, scale)
        _store(gp, offs, g, mask)  # the unscaled gradient is written back, as torch's
    if MAXIMIZE:
        g = neg(g)
    if ADAMW:
        p = tl.where(wd != 0, p - lr * wd * p, p)
    else:
        g = tl.where(wd != 0, g + p * wd, g)
    # torch's CUDA kernel: beta * m + (g - beta * g), each step an fma.
    m = tl.fma(beta1, m, tl.fma(-beta1, g, g))
    gg = g * g
    v = tl.fma(beta2, v, tl.fma(-beta2, gg, gg))
    if AMSGRAD:
        vmax = maximum(_ld(xp, offs, mask, 0, ACC), v)
        _store(xp, offs, vmax, mask)
        denom = div_true(sqrt(vmax), bc2_sqrt) + eps
    else:
        denom = div_true(sqrt(v), bc2_sqrt) + eps
    p = p - div_true(step_size * m, denom)
    _store(pp, offs, p, mask)
    _store(mp, offs, m, mask)
    _store(vp, offs, v, mask)


@kernel("fused_adam", key=[])
@triton.jit(do_not_specialize=_COUNTS)
def adam_kernel(
    Table,  # lists: param, grad, exp_avg, exp_avg_sq, [max_exp_avg_sq,] step
    S,  # WIDE: lr, beta1, beta2, weight_decay, eps
    LR,  # a device lr tensor (LR_TENSOR), else any witness
    GradScale,  # 1-element scale (HAS_SCALE), else any witness
    FoundInf,  # 1-element flag (HAS_INF): 1 skips the whole update
    WP, WG, WM, WV, WX, WS,  # witnesses: param, grad, exp_avg, exp_avg_sq, max, step
    T,
    STEPS,
    STEP: tl.constexpr,  # the steps' table list: 4, or 5 with AMSGRAD
    ADAMW: tl.constexpr,  # decoupled weight decay
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    ACC: tl.constexpr,  # element math: float32 (float64 for float64 params)
    WIDE: tl.constexpr,  # bias corrections: float64 where the device has it
    ALIGNED: tl.constexpr,  # every data pointer of the group is 16-byte aligned
    BLOCK: tl.constexpr,  # elements per loop step
    TILE: tl.constexpr,  # elements per program (the table's unit), a multiple of BLOCK
):
    t, base, end, full, rest = _tile(Table, T, STEPS, FoundInf, HAS_INF, TILE, BLOCK)
    # The scalars and the bias corrections of this tensor, once per program.
    if LR_TENSOR:  # noqa: SIM108 - a static if in Triton, not a select
        lr_w = tl.load(LR).to(WIDE)
    else:
        lr_w = tl.load(S).to(WIDE)
    beta1_w = tl.load(S + 1).to(WIDE)
    beta2_w = tl.load(S + 2).to(WIDE)
    lr = lr_w.to(ACC)
    beta1 = beta1_w.to(ACC)
    beta2 = beta2_w.to(ACC)
    wd = tl.load(S + 3).to(ACC)
    eps = tl.load(S + 4).to(ACC)
    step = tl.load(_ptr(Table, (2 + STEP) * T + t, WS, False)).to(WIDE)
    bc1 = 1 - _powi(beta1_w, step)
    bc2_sqrt = tl.sqrt(1 - _powi(beta2_w, step)).to(ACC)
    step_size = (lr_w / bc1).to(ACC)
    scale = lr
    if HAS_SCALE:
        scale = tl.load(GradScale).to(ACC)

    pp = _ptr(Table, 2 * T + t, WP, ALIGNED)
    gp = _ptr(Table, 3 * T + t, WG, ALIGNED)
    mp = _ptr(Table, 4 * T + t, WM, ALIGNED)
    vp = _ptr(Table, 5 * T + t, WV, ALIGNED)
    xp = WX
    if AMSGRAD:
        xp = _ptr(Table, 6 * T + t, WX, ALIGNED)
    for i in range(0, full):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        _adam_step(pp, gp, mp, vp, xp, offs, None, lr, wd, beta1, beta2, eps, bc2_sqrt,
                   step_size, scale, ADAMW, AMSGRAD, MAXIMIZE, HAS_SCALE, ACC)
    if rest < end:
        offs = rest + tl.arange(0, BLOCK)
        _adam_step(pp, gp, mp, vp, xp, offs, offs < end, lr, wd, beta1, beta2, eps,
                   bc2_sqrt, step_size, scale, ADAMW, AMSGRAD, MAXIMIZE, HAS_SCALE, ACC)


@triton.jit
def _sgd_step(pp, gp, bp, offs, mask, lr, wd, momentum, dampening, scale,
              HAS_BUF: tl.constexpr, FIRST: tl.constexpr, NESTEROV: tl.constexpr,
              MAXIMIZE: tl.constexpr, HAS_SCALE: tl.constexpr, ACC: tl.constexpr):
    """One block of sgd_kernel."""
    p = _ld(pp, offs, mask, 0, ACC)
    g = _ld(gp, offs, mask, 0, ACC)
    if HAS_SCALE:
        g = div_true(g, scale)
        _store(gp, offs, g, mask)
    if MAXIMIZE:
        g = neg(g)
    g = tl.where(wd != 0, g + wd * p, g)
    if HAS_BUF:
        if FIRST:
            buf = g
        else:
            buf = _ld(bp, offs, mask, 0, ACC)
            buf = momentum * buf + (1 - dampening) * g
        _store(bp, offs, buf, mask)
        if NESTEROV:  # noqa: SIM108 - a static if in Triton, not a select
            g = g + momentum * buf
        else:
            g = buf
    p = p - lr * g
    _store(pp, offs, p, mask)


@kernel("fused_sgd", key=[])
@triton.jit(do_not_specialize=_COUNTS)
def sgd_kernel(
    Table,  # lists: param, grad, [momentum_buffer]
    S,  # ACC: lr, weight_decay, momentum, dampening
    LR, GradScale, FoundInf,  # as adam_kernel's
    WP, WG, WB,  # witnesses: param, grad, buffer
    T,
    STEPS,
    HAS_BUF: tl.constexpr,  # momentum != 0
    FIRST: tl.constexpr,  # the buffer starts as the gradient
    NESTEROV: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    LR_TENSOR: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_INF: tl.constexpr,
    ACC: tl.constexpr,
    ALIGNED: tl.constexpr,  # every data pointer of the group is 16-byte aligned
    BLOCK: tl.constexpr,  # elements per loop step
    TILE: tl.constexpr,  # elements per program (the table's unit), a multiple of BLOCK
):
    t, base, end, full, rest = _tile(Table, T, STEPS, FoundInf, HAS_INF, TILE, BLOCK)
    if LR_TENSOR:  # noqa: SIM108 - a static if in Triton, not a select
        lr = tl.load(LR).to(ACC)
    else:
        lr = tl.load(S).to(ACC)
    wd = tl.load(S + 1).to(ACC)
    momentum = tl.load(S + 2).to(ACC)
    dampening = tl.load(S + 3).to(ACC)
    scale = lr
    if HAS_SCALE:
        scale = tl.load(GradScale).to(ACC)
    pp = _ptr(Table, 2 * T + t, WP, ALIGNED)
    gp = _ptr(Table, 3 * T + t, WG, ALIGNED)
    bp = WB
    if HAS_BUF:
        bp = _ptr(Table, 4 * T + t, WB, ALIGNED)
    for i in range(0, full):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        _sgd_step(pp, gp, bp, offs, None, lr, wd, momentum, dampening, scale, HAS_BUF,
                  FIRST, NESTEROV, MAXIMIZE, HAS_SCALE, ACC)
    if rest < end:
        offs = rest + tl.arange(0, BLOCK)
        _sgd_step(pp, gp, bp, offs, offs < end, lr, wd, momentum, dampening, scale, HAS_BUF,
                  FIRST, NESTEROV, MAXIMIZE, HAS_SCALE, ACC)
