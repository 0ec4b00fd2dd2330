"""Pointwise math functions of two operands: atan2, hypot, copysign, logaddexp(2), xlogy,
fmod and remainder, fmax and fmin, heaviside, nextafter, lerp, logical_xor and the bit
shifts, each with its Tensor and Scalar overloads, ``out=`` and in place.

Promotion is torch's: atan2, copysign and xlogy give floats for integers (INT_TO_FLOAT);
hypot, logaddexp and nextafter take floating tensors only; fmod, remainder, fmax, fmin
and the shifts keep integer dtypes, with C's truncated remainder for fmod and the
divisor's sign for remainder. An integer division by zero that can be seen (a CPU
tensor or a number) is handed back, as for div: torch raises. A Python scalar is cast
to the common dtype first (torch's ``gpu_kernel_with_scalars``), so a bfloat16 tensor's
``fmod(x, 0.3)`` divides by bfloat16(0.3). Shifts follow torch's rules past the bit width:
a left shift by a negative count or by the width or more gives 0; a right shift gives
the sign fill (0 for unsigned types).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, Number
from gemsops.ops.pointwise import elementwise as M
from gemsops.ops.pointwise.arith import _has_zero
from gemsops.ops.pointwise.elementwise import _exp_precise, _fdiv, _fmod, _sqrt_rn
from gemsops.ops.pointwise.iterator import own_dtype_out, run
from gemsops.ops.pointwise.math import atan_body, log1p_body
from gemsops.ops.pointwise.types import NO_BOOL, result_type
from gemsops.ops.pointwise.types import PointwiseOp as Op
from gemsops.ops.pointwise.types import Promotion as P

__all__ = [
    "BINARY_MATH", "atan2", "bitwise_left_shift", "bitwise_right_shift", "copysign", "fmax",
    "fmin", "fmod", "heaviside", "hypot", "lerp", "logaddexp", "logaddexp2", "logical_xor",
    "nextafter", "remainder", "xlogy",
]

Value = Tensor | Number
_NAN = tl.constexpr(float("nan"))
_INF = tl.constexpr(float("inf"))

# --- element functions ----------------------------------------------------------------


@triton.jit
def _negative(b):
    """The sign bit of a float32 or float64 value (set for -0.0 and a negative nan)."""
    if b.dtype == tl.float64:
        r = b.to(tl.int64, bitcast=True) < 0
    else:
        r = b.to(tl.int32, bitcast=True) < 0
    return r


@triton.jit
def _atan2(y, x):
    """atan2 from the arctangent of min/max of |y|, |x| (no overflow, within 2 ulp), the
    quadrant from the signs: atan2(+-0, -0) is +-pi, atan2(+-inf, +-inf) is +-pi/4 or
    +-3pi/4, as C's."""
    ay = tl.abs(y)
    ax = tl.abs(x)
    hi = tl.maximum(ay, ax)
    lo = tl.minimum(ay, ax)
    t = tl.where(hi == 0, 0.0, _fdiv(lo, hi))
    t = tl.where((lo == _INF) & (hi == _INF), 1.0, t)
    t = tl.where((y != y) | (x != x), _NAN, t)
    a = atan_body(t)
    a = tl.where(ay > ax, 1.5707963267948966 - a, a)
    a = tl.where(_negative(x), 3.141592653589793 - a, a)
    return _copysign(a, y)  # a >= 0 (or nan): y's sign bit, -0.0 and -nan included


@triton.jit
def _hypot(a, b):
    """``sqrt(a^2 + b^2)`` scaled by the larger magnitude (no overflow or underflow);
    an infinity wins over nan, as C's hypot."""
    hi = M.maximum(tl.abs(a), tl.abs(b))
    lo = M.minimum(tl.abs(a), tl.abs(b))
    q = _fdiv(lo, hi)
    r = tl.where(hi == 0, 0.0, hi * _sqrt_rn(1.0 + q * q))
    return tl.where((tl.abs(a) == _INF) | (tl.abs(b) == _INF), _INF, r)


@triton.jit
def _copysign(a, b):
    # by the bits: a's magnitude (a nan's payload too) under b's sign bit, as C's
    if a.dtype == tl.float64:
        r = ((a.to(tl.uint64, bitcast=True) & 0x7FFFFFFFFFFFFFFF)
             | (b.to(tl.uint64, bitcast=True) & 0x8000000000000000)).to(tl.float64, bitcast=True)
    else:
        r = ((a.to(tl.uint32, bitcast=True) & 0x7FFFFFFF)
             | (b.to(tl.uint32, bitcast=True) & 0x80000000)).to(tl.float32, bitcast=True)
    return r


@triton.jit
def _logaddexp(a, b):
    # torch's: an infinity added to itself stays; else max + log1p(exp(-|a - b|)).
    r = tl.maximum(a, b) + log1p_body(_exp_precise(-tl.abs(a - b)))
    return tl.where((tl.abs(a) == _INF) & (a == b), a, r)


@triton.jit
def _logaddexp2(a, b):
    r = tl.maximum(a, b) + log1p_body(tl.exp2(-tl.abs(a - b))) * 1.4426950408889634
    return tl.where((tl.abs(a) == _INF) & (a == b), a, r)


@triton.jit
def _xlogy(x, y):
    # torch's: nan where y is nan, 0 where x is 0 (even for y = 0 or inf), else x log y.
    return tl.where(y != y, _NAN, tl.where(x == 0, 0.0, x * tl.log(y)))


@triton.jit
def _pow2(j, like):
    """2^j from its exponent bits, for 0 <= j <= 1000 (float64) or j <= 120 (float32)."""
    if like.dtype == tl.float64:
        r = ((j.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)
    else:
        r = ((j + 127) << 23).to(tl.float32, bitcast=True)
    return r


@triton.jit
def _exponent(x):
    """floor(log2(x)) of a finite x > 0 as int32, subnormals scaled up by 2^64 first."""
    if x.dtype == tl.float64:
        tiny = x < 2.2250738585072014e-308
        s = tl.where(tiny, x * 18446744073709551616.0, x)
        e = ((s.to(tl.int64, bitcast=True) >> 52) & 0x7FF).to(tl.int32) - 1023
    else:
        tiny = x < 1.1754943508222875e-38
        s = tl.where(tiny, x * 18446744073709551616.0, x)
        e = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return e - tl.where(tiny, 64, 0)


@triton.jit
def _fmod_long(a, b, r):
    """``r`` (the one-fma remainder, exact while ``|a / b|`` is below 2^52 in float64 or
    2^24 in float32), or, where the quotient is larger, the remainder by long division:
    ``|a|`` less the largest ``|b| * 2^k`` not above it, once per binade, until it is
    below ``|b|``. Each subtraction is exact (the two are within a factor of 2), so the
    result is C's fmod for every finite pair; a block whose quotients are all small
    skips the loop after one check."""
    x = tl.abs(a)
    y = tl.abs(b)
    if a.dtype == tl.float64:
        limit = 4503599627370496.0  # 2^52
        step = 1000
    else:
        limit = 16777216.0  # 2^24
        step = 120
    big = (x < _INF) & (y > 0) & (x >= y * limit)
    todo = big
    while tl.max(todo.to(tl.int32), axis=None) > 0:
        k = tl.maximum(_exponent(tl.where(todo, x, 1.0)) - _exponent(tl.where(todo, y, 1.0)), 0)
        k1 = tl.minimum(k, step)
        k2 = tl.minimum(k - k1, step)
        yk = y * _pow2(k1, x) * _pow2(k2, x) * _pow2(k - k1 - k2, x)  # exact: powers of 2
        yk = tl.where(yk > x, yk * 0.5, yk)
        x = tl.where(todo, x - yk, x)
        todo = todo & (x >= y)
    return tl.where(big, _copysign(x, a), r)


@triton.jit
def _fmod_signed(a, b):
    # C's fmod; a zero remainder takes the dividend's sign (fmod(-1, 1) is -0.0).
    r = _fmod_long(a, b, _fmod(a, b))
    return tl.where(r == 0, a * 0.0, r)


@triton.jit
def _fmod_body(a, b):
    if a.dtype.is_floating():  # noqa: SIM108 - a static if in Triton, not a select
        r = _fmod_signed(a, b)
    else:
        r = a % b  # Triton's integer % truncates, like C
    return r


@triton.jit
def _fmod_wide(a, b):
    # float32 computed in float64: the one-fma remainder is exact to quotients of 2^52, not
    # 2^24, so fewer blocks take the long division.
    return _fmod_signed(a.to(tl.float64), b.to(tl.float64)).to(a.dtype)


@triton.jit
def _remainder(a, b):
    # torch's: fmod, moved by one divisor where its sign differs from the divisor's.
    r = _fmod_body(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _remainder_wide(a, b):
    r = _fmod_wide(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _fmax(a, b):
    if a.dtype.is_floating():
        r = tl.where(a != a, b, tl.where(b != b, a, tl.maximum(a, b)))
    else:
        r = tl.maximum(a, b)
    return r


@triton.jit
def _fmin(a, b):
    if a.dtype.is_floating():
        r = tl.where(a != a, b, tl.where(b != b, a, tl.minimum(a, b)))
    else:
        r = tl.minimum(a, b)
    return r


@triton.jit
def _heaviside(a, b):
    return tl.where(a == 0, b, (a > 0).to(a.dtype))


@triton.jit
def _nextafter(a, b):
    """The next representable value after ``a`` towards ``b`` (float32 and float64)."""
    if a.dtype == tl.float64:
        bits = a.to(tl.int64, bitcast=True)
        tiny = tl.full(a.shape, 1, tl.int64).to(tl.float64, bitcast=True)
    else:
        bits = a.to(tl.int32, bitcast=True)
        tiny = tl.full(a.shape, 1, tl.int32).to(tl.float32, bitcast=True)
    step = tl.where((a < b) == (a > 0), bits + 1, bits - 1).to(a.dtype, bitcast=True)
    r = tl.where(a == 0, tl.where(b > 0, tiny, -tiny), step)
    r = tl.where(a == b, b, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _lerp(a, b, w):
    # torch's: from the nearer end, so lerp(a, b, 1) is b exactly.
    return tl.where(tl.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1.0 - w))


@triton.jit
def _logical_xor(a, b):
    return (a != 0) ^ (b != 0)


@triton.jit
def _lshift(a, b):
    width: tl.constexpr = a.dtype.primitive_bitwidth
    if a.dtype.is_int_signed():  # noqa: SIM108 - a static if in Triton, not a select
        ok = (b >= 0) & (b < width)
    else:
        ok = b < width
    return tl.where(ok, a << tl.where(ok, b, 0), 0)


@triton.jit
def _rshift(a, b):
    width: tl.constexpr = a.dtype.primitive_bitwidth
    if a.dtype.is_int_signed():
        # torch's: a count out of [0, width - 1) shifts by width - 1 (the sign fill).
        r = a >> tl.where((b >= 0) & (b < width - 1), b, width - 1)
    else:
        r = tl.where(b < width, a >> tl.where(b < width, b, 0), 0)
    return r


# --- records ------------------------------------------------------------------------

_INTEGERS = frozenset(INT_DTYPES)
BINARY_MATH = {
    "atan2": Op("atan2", _atan2, "pp", P.INT_TO_FLOAT, scalars="common"),
    "hypot": Op("hypot", _hypot, "pp", dtypes=FLOAT_DTYPES, scalars="common"),
    "copysign": Op("copysign", _copysign, "pp", P.INT_TO_FLOAT, scalars="common"),
    "logaddexp": Op("logaddexp", _logaddexp, "pp", dtypes=FLOAT_DTYPES, scalars="common"),
    "logaddexp2": Op("logaddexp2", _logaddexp2, "pp", dtypes=FLOAT_DTYPES,
                       scalars="common"),
    "xlogy": Op("xlogy", _xlogy, "pp", P.INT_TO_FLOAT, scalars="common"),
    "fmod": Op("fmod", _fmod_body, "pp", dtypes=NO_BOOL, scalars="common"),
    "remainder": Op("remainder", _remainder, "pp", dtypes=NO_BOOL, scalars="common"),
    "fmod_wide": Op("fmod", _fmod_wide, "pp", dtypes=FLOAT_DTYPES, scalars="common"),
    "remainder_wide": Op("remainder", _remainder_wide, "pp", dtypes=FLOAT_DTYPES,
                         scalars="common"),
    "fmax": Op("fmax", _fmax, "pp", scalars="common"),
    "fmin": Op("fmin", _fmin, "pp", scalars="common"),
    "heaviside": Op("heaviside", _heaviside, "pp", scalars="common"),
    "nextafter": Op("nextafter", _nextafter, "pp", dtypes=(torch.float32, torch.float64),
                    scalars="common"),
    "lerp": Op("lerp", _lerp, "ppa", P.FIRST, FLOAT_DTYPES),
    "lerp_tensor": Op("lerp", _lerp, "ppp", P.FIRST, FLOAT_DTYPES),
    "logical_xor": Op("logical_xor", _logical_xor, "pp", P.ALWAYS_BOOL, scalars="common"),
    "bitwise_left_shift": Op("bitwise_left_shift", _lshift, "pp", dtypes=_INTEGERS,
                             scalars="common"),
    "bitwise_right_shift": Op("bitwise_right_shift", _rshift, "pp", dtypes=_INTEGERS,
                              scalars="common"),
}
"""The two-operand records (and lerp's three), by aten name."""


Check = Callable[[Value, Value], Op | None]
"""A host check: raises Unsupported for inputs torch refuses, or picks another record."""


def _function(name: str, doc: str, check: Check | None = None,
              own_dtype: bool = False) -> Callable[..., Tensor]:
    record = BINARY_MATH[name]

    def fn(self: Value, other: Value, *, out: Tensor | None = None,
           inplace: bool = False) -> Tensor:
        chosen = None if check is None else check(self, other)
        if own_dtype and isinstance(self, Tensor):
            own_dtype_out(name, self.dtype, out, inplace)
        return run(chosen or record, (self, other), out=out, inplace=inplace)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn.__module__ = __name__
    return fn


def _declare(name: str, doc: str, *, scalar: Iterable[str] = (), inplace: bool = True,
             check: Check | None = None, args: dict[str, str | None] | None = None,
             own_dtype: bool = False) -> Callable[..., Tensor]:
    """``name`` declared for its ``default`` overload (or ``Tensor`` and the overloads in
    ``scalar``), their out= ones and, with ``inplace``, ``name_``. With
    ``own_dtype`` an ``out=`` of another dtype than ``self``'s is handed back (torch
    raises)."""
    scalar = tuple(scalar)
    overloads: tuple[str, ...] = ("default",)
    outs: tuple[str, ...] = ("out",)
    inplaces: tuple[str, ...] = ("default",)
    if scalar:
        overloads = ("Tensor", *scalar)
        outs = tuple(f"{o}_out" for o in overloads)
        inplaces = tuple(o for o in overloads if o != "Scalar_Tensor")  # self a number
    if name in ("copysign",):
        outs = ("out", "Scalar_out")
    return op(*(f"{name}.{o}" for o in overloads), out=tuple(f"{name}.{o}" for o in outs),
              inplace=tuple(f"{name}_.{o}" for o in inplaces) if inplace else (), args=args)(
        _function(name, doc, check, own_dtype))


def _fmod_check(name: str) -> Check:
    def check(self: Value, other: Value) -> Op | None:
        common = result_type([self, other])
        if not common.is_floating_point:
            if _has_zero(other):
                raise Unsupported("integer division by zero")  # torch's CPU kernel raises
            return None
        if common != torch.float64 and gemshal.current_vendor().capabilities.supports(
                torch.float64):
            return BINARY_MATH[f"{name}_wide"]
        return None
    return check


def _same_dtype(name: str) -> Check:
    def check(self: Value, other: Value) -> None:
        if isinstance(self, Tensor) and isinstance(other, Tensor) and self.dtype != other.dtype:
            raise Unsupported(f"{name} of tensors of different dtypes")  # torch raises
    return check


atan2 = _declare("atan2", "The angle of ``(other, self)``, quadrant by the signs (-0.0 too).")
hypot = _declare("hypot", "``sqrt(self^2 + other^2)`` without overflow; inf wins over nan.")
copysign = _declare("copysign", "``|self|`` with the sign bit of ``other`` (-0.0, -nan too).",
                    scalar=("Scalar",))
logaddexp = _declare("logaddexp", "``log(exp(self) + exp(other))`` without overflow.",
                     inplace=False)
logaddexp2 = _declare("logaddexp2", "``log2(2^self + 2^other)`` without overflow.",
                      inplace=False)
fmod = _declare("fmod", "C's remainder: the dividend's sign (exact for floats).",
                scalar=("Scalar",), check=_fmod_check("fmod"))
remainder = _declare("remainder", "Python's remainder: the divisor's sign.",
                     scalar=("Scalar", "Scalar_Tensor"), check=_fmod_check("remainder"))
fmax = op("fmax.default", out="fmax.out")(
    _function("fmax", "Elementwise max; nan loses (unless both are nan)."))
fmin = op("fmin.default", out="fmin.out")(
    _function("fmin", "Elementwise min; nan loses (unless both are nan)."))
heaviside = _declare("heaviside", "0 below zero, 1 above, ``other`` at zero (one dtype only).",
                     check=_same_dtype("heaviside"), args={"values": "other"},
                     own_dtype=True)
nextafter = _declare("nextafter", "The next float after ``self`` towards ``other`` (float32 "
                     "and float64; half types go to torch).")
logical_xor = _declare("logical_xor", "Exactly one nonzero, as a bool tensor.")


def _shift(name: str, doc: str) -> Callable[..., Tensor]:
    fn = op(f"{name}.Tensor", f"{name}.Tensor_Scalar", f"{name}.Scalar_Tensor",
            out=(f"{name}.Tensor_out", f"{name}.Tensor_Scalar_out", f"{name}.Scalar_Tensor_out"),
            inplace=(f"{name}_.Tensor", f"{name}_.Tensor_Scalar"))(_function(name, doc))
    dunder = "__lshift__" if "left" in name else "__rshift__"
    idunder = dunder.replace("__", "__i", 1)
    return op(f"{dunder}.Tensor", f"{dunder}.Scalar",
              out=(f"{dunder}.Tensor_out", f"{dunder}.Scalar_out"),
              inplace=(f"{idunder}.Tensor", f"{idunder}.Scalar"), public=False)(fn)


bitwise_left_shift = _shift("bitwise_left_shift", "``self << other`` on integers; 0 for a "
                            "count below 0 or at the bit width and above.")
bitwise_right_shift = _shift("bitwise_right_shift", "``self >> other`` on integers (arithmetic "
                             "for signed types); the sign fill past the bit width.")


@op("xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other",
    out=("xlogy.OutTensor", "xlogy.OutScalar_Self", "xlogy.OutScalar_Other"),
    inplace=("xlogy_.Tensor", "xlogy_.Scalar_Other"))
def xlogy(self: Value, other: Value, *, out: Tensor | None = None,
          inplace: bool = False) -> Tensor:
    """``self * log(other)``, 0 where ``self`` is 0 and nan where ``other`` is nan."""
    return run(BINARY_MATH["xlogy"], (self, other), out=out, inplace=inplace)


@op("lerp.Scalar", "lerp.Tensor", out=("lerp.Scalar_out", "lerp.Tensor_out"),
    inplace=("lerp_.Scalar", "lerp_.Tensor"))
def lerp(self: Tensor, end: Tensor, weight: Value, *, out: Tensor | None = None,
         inplace: bool = False) -> Tensor:
    """``self + weight * (end - self)``, from ``end`` for ``|weight| >= 0.5`` (torch's
    formula); ``self``, ``end`` and a tensor ``weight`` of one floating dtype."""
    tensors = [x for x in (self, end, weight) if isinstance(x, Tensor)]
    if any(t.dtype != self.dtype for t in tensors):
        raise Unsupported("lerp of tensors of different dtypes")  # torch raises
    record = BINARY_MATH["lerp_tensor" if isinstance(weight, Tensor) else "lerp"]
    return run(record, (self, end, weight), out=out, inplace=inplace)
