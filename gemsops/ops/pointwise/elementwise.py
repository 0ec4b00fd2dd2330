"""Element functions of the pointwise ops: one small ``@triton.jit`` body per op.

A body takes the operands already converted to the op's compute dtype (float32 for
half types, float64 stays float64, integers stay integers) and returns the result in
that dtype (or bool); the kernel casts it to the output dtype. The generator in
:mod:`gemsops.ops.pointwise.codegen` passes a body to its kernel templates as a
constexpr, so each (body, template, dtypes) compiles once. This module holds the
arithmetic, comparison and math bodies and the numerics they share; the activations'
bodies sit with their ops in :mod:`gemsops.ops.pointwise.activation`.

Only ``triton.language`` is used, never a vendor's libdevice: the same code then runs
on every Triton backend and on the CPU interpreter (which has no libdevice), and what
CI tests on the interpreter is what runs on the device. Where ``tl`` has no function
(tanh, pow, trunc) it is written here from ``exp``/``log2``/``floor`` the way the C
library does it, matching torch's special values (nan, inf, -0.0).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gemsops.ops.pointwise.codegen import to_half

# --- helpers ---------------------------------------------------------------------

_NAN = tl.constexpr(float("nan"))
_INF = tl.constexpr(float("inf"))


@triton.jit
def _flip_sign(x):
    """``-x`` by its sign bit, so ``-(+0.0)`` is ``-0.0`` and a nan's sign flips, as
    torch's neg does. Triton 3.6 lowers unary minus on a float to ``0 - x`` (measured on
    the H200: copysign and atan2 gave +0.0 for -0.0); later versions emit a negation."""
    if x.dtype == tl.float64:
        r = (x.to(tl.uint64, bitcast=True) ^ 0x8000000000000000).to(tl.float64, bitcast=True)
    elif x.dtype == tl.float32:
        r = (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)
    else:
        r = -x
    return r


@triton.jit
def _fdiv(a, b):
    # Triton's `/` on float32 may be the fast 2-ulp division; torch divides exactly.
    if b.dtype == tl.float32:  # noqa: SIM108 - a static if in Triton, not a select
        r = tl.math.div_rn(a, b)
    else:
        r = a / b
    return r


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _exp_precise(x):
    """exp(x) to ~1 ulp in float32.

    ``tl.exp`` evaluates exp2(x * log2(e)); rounding that product costs |x| * 2^-24
    relative error (5e-6 at x = 80). Splitting x = k*ln2 + r with a two-part ln2
    (Cody-Waite) leaves |r| <= ln2/2, where exp is accurate, and 2^k is exact.
    """
    if x.dtype == tl.float32:
        k = tl.floor(x * 1.4426950408889634 + 0.5)
        r = x - k * 0.693359375  # ln2's high part: k * it is exact for |k| < 2^15
        r = r + k * 2.12194440e-4  # ln2's low part
        # 2^k as two halves: 2^128 alone overflows where e * 2^128 need not.
        h = tl.floor(k * 0.5)
        y = tl.exp(r) * tl.exp2(h) * tl.exp2(k - h)
        y = tl.where(x > 88.8, _INF, y)
        y = tl.where(x < -104.0, 0.0, y)  # also -inf, where r would be nan
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _fmod(a, b):
    """C's fmod, exactly.

    Triton's float ``%`` becomes ``a - b * trunc(a / b)`` rounded on some backends
    (NVPTX), which can even get the sign wrong. Here the remainder is one fma with the
    truncated quotient, exact once the quotient is right; a quotient that rounded up
    across an integer shows as a remainder of the wrong sign and is stepped back.
    """
    q = _fdiv(a, b)
    t = _trunc(q)
    r = tl.math.fma(-t, b, a)
    t = tl.where((r != 0) & ((r < 0) != (a < 0)), t - tl.where(q > 0, 1.0, -1.0), t)
    r = tl.math.fma(-t, b, a)
    # fmod(x, +-inf) is x (0 * inf would make nan); fmod(inf, y) and fmod(x, 0) stay nan.
    return tl.where((tl.abs(b) == _INF) & (tl.abs(a) < _INF), a, r)


@triton.jit
def _sqrt_rn(x):
    # tl.sqrt may be approximate in float32; sqrt_rn is correctly rounded like torch.
    if x.dtype == tl.float32:  # noqa: SIM108 - a static if in Triton, not a select
        r = tl.math.sqrt_rn(x)
    else:
        r = tl.sqrt(x)
    return r


@triton.jit
def _tanh(x):
    """tanh as the C library computes it (Cephes): a series near 0, exp beyond."""
    ax = tl.abs(x)
    big = 1.0 - 2.0 / (tl.exp(2.0 * ax) + 1.0)  # exp overflow gives 1, as it should
    big = tl.where(x < 0, -big, big)
    z = x * x
    if x.dtype == tl.float64:
        p = (-9.64399179425052238628e-1 * z - 9.92877231001918586564e1) * z
        p = p - 1.61468768441708447952e3
        q = ((z + 1.12811678491632931402e2) * z + 2.23548839060100448583e3) * z
        q = q + 4.84406305325125486048e3
        small = x + x * z * (p / q)
    else:
        p = -5.70498872745e-3 * z + 2.06390887954e-2
        p = (p * z - 5.37397155531e-2) * z + 1.33314422036e-1
        small = x + x * z * (p * z - 3.33332819422e-1)
    # The series keeps -0.0 and tiny values exact; nan falls to `big`, which keeps it.
    return tl.where(ax < 0.625, small, big)


@triton.jit
def _signbit(x):
    # -0.0 < 0 is false, but 1 / -0.0 = -inf.
    return (x < 0) | ((x == 0) & (1.0 / x < 0))


@triton.jit
def _pow_core(a, b):
    """C99 pow(a, b) for floats: exp2(b * log2|a|) and the sign and special cases."""
    mag = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b  # false for nan and inf
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    neg = _signbit(a)
    r = tl.where(neg & b_odd, -mag, mag)
    # A negative finite base to a finite non-integer power has no real value.
    r = tl.where((a < 0) & (a > -_INF) & (b == b) & (tl.abs(b) < _INF) & ~b_int,
                 _NAN, r)
    # |a| == 1 against an infinite exponent, a == 1, and b == 0 all give exactly 1.
    r = tl.where((tl.abs(a) == 1.0) & (tl.abs(b) == _INF), 1.0, r)
    r = tl.where((a == 1.0) | (b == 0.0), 1.0, r)
    return r


# --- arithmetic -------------------------------------------------------------------


@triton.jit
def identity(a):
    return a


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def add_alpha(a, b, alpha):
    return a + alpha * b


@triton.jit
def sub(a, b):
    return a - b


@triton.jit
def sub_alpha(a, b, alpha):
    return a - alpha * b


@triton.jit
def mul(a, b):
    return a * b


@triton.jit
def div_true(a, b):
    return _fdiv(a, b)


@triton.jit
def div_trunc(a, b):
    if a.dtype.is_floating():  # noqa: SIM108 - a static if in Triton, not a select
        r = _trunc(_fdiv(a, b))
    else:
        r = a // b  # Triton's integer // truncates, like C
    return r


@triton.jit
def div_trunc_f16(a, b):
    """trunc of ``a / b`` with the quotient rounded to float16 first (torch's CUDA kernel)."""
    return _trunc(to_half(_fdiv(a, b), tl.float16).to(tl.float32))


@triton.jit
def div_trunc_bf16(a, b):
    """trunc of ``a / b`` with the quotient rounded to bfloat16 first (torch's CUDA kernel)."""
    return _trunc(to_half(_fdiv(a, b), tl.bfloat16).to(tl.float32))


@triton.jit
def div_trunc_reciprocal(a, b):
    """trunc of ``a * (1 / b)``: torch's CUDA kernel for a divisor that is a host scalar."""
    return _trunc(a * _fdiv(1.0, b))


@triton.jit
def div_floor(a, b):
    if a.dtype.is_floating():
        # torch's div_floor_floating: fmod keeps the quotient exact near integers.
        mod = _fmod(a, b)
        q = _fdiv(a - mod, b)
        q = tl.where((mod != 0) & ((b < 0) != (mod < 0)), q - 1.0, q)
        fl = tl.floor(q)
        fl = tl.where(q - fl > 0.5, fl + 1.0, fl)
        # A zero quotient takes the sign of a / b (copysign(0, a / b)).
        r = tl.where(q != 0, fl, 0.0 * _fdiv(a, b))
        r = tl.where(b == 0, _fdiv(a, b), r)
    else:
        q = a // b
        r = tl.where(((a < 0) != (b < 0)) & (q * b != a), q - 1, q)
    return r


@triton.jit
def neg(a):
    return _flip_sign(a)


@triton.jit
def absolute(a):
    return tl.abs(a)


@triton.jit
def reciprocal(a):
    return _fdiv(1.0, a)


@triton.jit
def sign(a):
    # nan gives 0, as in torch.
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def maximum(a, b):
    if a.dtype.is_floating():
        r = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        r = tl.maximum(a, b)
    return r


@triton.jit
def minimum(a, b):
    if a.dtype.is_floating():
        r = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        r = tl.minimum(a, b)
    return r


@triton.jit
def clamp(a, lo, hi):
    return minimum(maximum(a, lo), hi)


@triton.jit
def where(cond, a, b):
    return tl.where(cond, a, b)


@triton.jit
def masked_fill(a, mask, value):
    return tl.where(mask, value, a)


# --- math functions -------------------------------------------------------------


@triton.jit
def exp(a):
    return _exp_precise(a)


@triton.jit
def exp_half(a):
    # For float16 / bfloat16 results: tl.exp's relative error (|x| * 2^-24, 5e-6 at the
    # largest finite bf16 result) is far below half an ulp of those types (2e-3, 5e-4),
    # and one exponential costs a third of the range-reduced three.
    return tl.exp(a)


@triton.jit
def log(a):
    return tl.log(a)


@triton.jit
def sqrt(a):
    return _sqrt_rn(a)


@triton.jit
def rsqrt(a):
    return _fdiv(1.0, _sqrt_rn(a))


@triton.jit
def sin(a):
    return tl.sin(a)


@triton.jit
def cos(a):
    return tl.cos(a)


@triton.jit
def tanh(a):
    return _tanh(a)


# --- pow --------------------------------------------------------------------------


@triton.jit
def pow_float(a, b):
    return _pow_core(a, b)


@triton.jit
def pow_float_wide(a, b):
    # exp2(b * log2(a)) loses |b * log2(a)| ulps; float64 keeps float32 results exact.
    return _pow_core(a.to(tl.float64), b.to(tl.float64)).to(a.dtype)


@triton.jit
def pow_int(a, b):
    """Integer pow by squaring with wrap-around, and torch's rules for b < 0."""
    result = a * 0 + 1
    base = a
    e = b
    if a.dtype.is_int_signed():
        e = tl.where(b < 0, 0, b)
    # One round per bit of the dtype (a while loop on "bits left" would need a block
    # reduction per round, which the interpreter runs element by element).
    for _ in range(a.dtype.primitive_bitwidth):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    result = result.to(a.dtype)
    if a.dtype.is_int_signed():
        # b < 0: 1 ** b = 1, (-1) ** b = +-1, anything else truncates to 0.
        minus_one = tl.where((b & 1) != 0, -1, 1)
        small = tl.where(a == 1, 1, tl.where(a == -1, minus_one, 0))
        result = tl.where(b < 0, small.to(a.dtype), result)
    return result


@triton.jit
def square(a):
    return a * a


@triton.jit
def cube(a):
    return a * a * a


@triton.jit
def inv_square(a):
    return _fdiv(1.0, a * a)


# --- comparisons and logic --------------------------------------------------------


@triton.jit
def eq(a, b):
    return a == b


@triton.jit
def ne(a, b):
    return a != b


@triton.jit
def lt(a, b):
    return a < b


@triton.jit
def le(a, b):
    return a <= b


@triton.jit
def gt(a, b):
    return a > b


@triton.jit
def ge(a, b):
    return a >= b


@triton.jit
def logical_and(a, b):
    return (a != 0) & (b != 0)


@triton.jit
def bitwise_and(a, b):
    return a & b


@triton.jit
def bitwise_or(a, b):
    return a | b


@triton.jit
def bitwise_xor(a, b):
    return a ^ b


@triton.jit
def bitwise_not(a):
    return ~a


@triton.jit
def logical_or(a, b):
    return (a != 0) | (b != 0)


@triton.jit
def logical_not(a):
    return a == 0
