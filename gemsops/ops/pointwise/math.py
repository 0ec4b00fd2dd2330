"""Pointwise math functions of one tensor: trigonometric and hyperbolic functions and their
inverses, erf and its relatives, logarithms and exponentials.

The float-valued functions promote integers to the default float dtype (torch's
INT_TO_FLOAT) and compute half types in float32. Where ``triton.language`` has no
function it is written here from ``exp``/``log``/``sqrt`` and short polynomials (Cephes'
arctangent, Taylor and ``atanh`` series for ``expm1`` and ``log1p``), so the same code
runs on every Triton backend and on the interpreter, with torch's special values (nan,
inf, -0.0 and the domain edges: ``acosh(x < 1)``, ``atanh(+-1)``, ``log1p(-1)``).

``erfc`` and ``erfinv`` are written for float32 accuracy only: a float64 result is
handed to torch. ``sinh`` and ``cosh`` stay finite up to their true overflow (float32
89.4, float64 710.5), as torch's CUDA kernels do; torch's CPU kernels overflow with
``exp`` (88.7, 709.8). The element functions :func:`expm1_body`, :func:`log1p_body`
and :func:`atan_body` are shared with the binary math ops and the activations;
rounding, sign and class tests are in :mod:`gemsops.ops.pointwise.rounding`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.pointwise.elementwise import _exp_precise, _fdiv, _flip_sign, _sqrt_rn
from gemsops.ops.pointwise.iterator import run, unary_function
from gemsops.ops.pointwise.types import PointwiseOp as Op
from gemsops.ops.pointwise.types import Promotion as P

__all__ = [
    "UNARY_MATH", "acos", "acosh", "asin", "asinh", "atan", "atan_body", "atanh", "cosh", "erf",
    "erfc", "erfinv", "exp2", "expm1", "expm1_body", "log1p", "log1p_body", "log2", "log10",
    "sinh", "tan",
]

_NAN = tl.constexpr(float("nan"))
_INF = tl.constexpr(float("inf"))
_PI_2 = tl.constexpr(1.5707963267948966)
_LN2 = tl.constexpr(0.6931471805599453)

# --- shared element functions ------------------------------------------------------


@triton.jit
def _odd(r, x):
    """``r`` (computed from ``|x|``) with the sign of ``x``; ``+-0`` gives ``x`` itself."""
    return tl.where(x < 0, _flip_sign(r), tl.where(x == 0, x, r))


@triton.jit
def expm1_body(x):
    """``exp(x) - 1`` without cancellation: Taylor's series for ``|x| <= ln2 / 2`` (written
    as ``x * p(x)``, so -0.0 stays), ``exp(x) - 1`` beyond, where it loses no digits."""
    if x.dtype == tl.float64:
        p = x * 1.1470745597729725e-11 + 1.6059043836821613e-10
        p = p * x + 2.08767569878681e-09
        p = p * x + 2.505210838544172e-08
        p = p * x + 2.755731922398589e-07
        p = p * x + 2.7557319223985893e-06
        p = p * x + 2.48015873015873e-05
        p = p * x + 0.0001984126984126984
        p = p * x + 0.001388888888888889
        p = p * x + 0.008333333333333333
        p = p * x + 0.041666666666666664
        p = p * x + 0.16666666666666666
        p = p * x + 0.5
    else:
        p = x * 2.48015873015873e-05 + 0.0001984126984126984
        p = p * x + 0.001388888888888889
        p = p * x + 0.008333333333333333
        p = p * x + 0.041666666666666664
        p = p * x + 0.16666666666666666
        p = p * x + 0.5
    small = x * (p * x + 1.0)
    return tl.where(tl.abs(x) <= 0.34657359027997264, small, _exp_precise(x) - 1.0)


@triton.jit
def log1p_body(x):
    """``log(1 + x)`` without cancellation: ``2 atanh(s)``, ``s = x / (2 + x)``, by its
    series on ``sqrt(1/2) - 1 <= x <= sqrt(2) - 1`` (``|s| <= 0.172``), ``log(1 + x)``
    beyond (-1 gives -inf, less gives nan)."""
    s = _fdiv(x, 2.0 + x)
    z = s * s
    if x.dtype == tl.float64:
        p = z * 0.043478260869565216 + 0.047619047619047616
        p = p * z + 0.05263157894736842
        p = p * z + 0.058823529411764705
        p = p * z + 0.06666666666666667
        p = p * z + 0.07692307692307693
        p = p * z + 0.09090909090909091
        p = p * z + 0.1111111111111111
        p = p * z + 0.14285714285714285
        p = p * z + 0.2
        p = p * z + 0.3333333333333333
    else:
        p = z * 0.09090909090909091 + 0.1111111111111111
        p = p * z + 0.14285714285714285
        p = p * z + 0.2
        p = p * z + 0.3333333333333333
    small = 2.0 * s + 2.0 * s * (z * p)
    near = (x >= -0.2928932188134524) & (x <= 0.41421356237309503)
    return tl.where(near, small, tl.log(1.0 + x))


@triton.jit
def atan_body(x):
    """The arctangent as Cephes computes it (``atan.c``, ``atanf.c``): ``|x|`` reduced to
    ``[0, tan(pi/8)]`` (float32) or ``[0, 0.66]`` (float64), a polynomial or rational
    function there; within 2 ulp."""
    ax = tl.abs(x)
    if x.dtype == tl.float64:
        big = ax > 2.414213562373095
        mid = (ax > 0.66) & ~big
        t = tl.where(big, -_fdiv(1.0, ax), tl.where(mid, _fdiv(ax - 1.0, ax + 1.0), ax))
        z = t * t
        p = z * -8.750608600031904122785e-1 - 1.615753718733365076637e1
        p = p * z - 7.500855792314704667340e1
        p = p * z - 1.228866684490136173410e2
        p = p * z - 6.485021904942025371773e1
        q = z + 2.485846490142306297962e1
        q = q * z + 1.650270098316988542046e2
        q = q * z + 4.328810604912902668951e2
        q = q * z + 4.853903996359136964868e2
        q = q * z + 1.945506571482613964425e2
        r = t * (z * p / q) + t
        more = tl.where(big, 2.0, tl.where(mid, 1.0, 0.0)).to(x.dtype)
        r = r + more * 3.061616997868382943065e-17  # MOREBITS / 2
    else:
        big = ax > 2.414213562373095
        mid = (ax > 0.4142135623730950) & ~big
        t = tl.where(big, -_fdiv(1.0, ax), tl.where(mid, _fdiv(ax - 1.0, ax + 1.0), ax))
        z = t * t
        p = z * 8.05374449538e-2 - 1.38776856032e-1
        p = p * z + 1.99777106478e-1
        p = p * z - 3.33329491539e-1
        r = p * z * t + t
    # (A select of two Python floats is a float32 one: cast an exact one, then scale it.)
    y0 = tl.where(big, 2.0, tl.where(mid, 1.0, 0.0)).to(x.dtype) * 0.7853981633974483
    return _odd(y0 + r, x)


# --- trigonometric and hyperbolic ----------------------------------------------------


@triton.jit
def _tan(x):
    return _fdiv(tl.sin(x), tl.cos(x))


@triton.jit
def _asin(x):
    # atan(x / sqrt(1 - x^2)), with 1 - x^2 as (1 - x)(1 + x): exact near |x| = 1.
    return atan_body(_fdiv(x, _sqrt_rn((1.0 - x) * (1.0 + x))))


@triton.jit
def _acos(x):
    # 2 atan(sqrt((1 - x) / (1 + x))): acos(-1) = 2 atan(inf) = pi; |x| > 1 gives nan.
    return 2.0 * atan_body(_sqrt_rn(_fdiv(1.0 - x, 1.0 + x)))


@triton.jit
def _atan(x):
    return atan_body(x)


@triton.jit
def _exp_half_arg(ax):
    # e^|x| as (e^(|x|/2) / 2) * e^(|x|/2): finite up to cosh's and sinh's own overflow.
    h = _exp_precise(0.5 * ax)
    return (0.5 * h) * h


@triton.jit
def _sinh(x):
    ax = tl.abs(x)
    e = expm1_body(ax)
    r = 0.5 * (e + _fdiv(e, e + 1.0))
    return _odd(tl.where(ax > 20.0, _exp_half_arg(ax), r), x)


@triton.jit
def _cosh(x):
    ax = tl.abs(x)
    e = _exp_precise(ax)
    return tl.where(ax > 20.0, _exp_half_arg(ax), 0.5 * (e + _fdiv(1.0, e)))


@triton.jit
def _asinh(x):
    ax = tl.abs(x)
    # log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); past 1e8, log(2|x|) (the rest is below 1e-17).
    r = log1p_body(ax + _fdiv(ax * ax, 1.0 + _sqrt_rn(1.0 + ax * ax)))
    return _odd(tl.where(ax > 1e8, tl.log(ax) + _LN2, r), x)


@triton.jit
def _acosh(x):
    t = x - 1.0
    r = log1p_body(t + _sqrt_rn(t * (t + 2.0)))
    r = tl.where(x > 1e8, tl.log(x) + _LN2, r)
    return tl.where(x < 1.0, _NAN, r)


@triton.jit
def _atanh(x):
    # From |x|, so 1 - |x| is exact near 1; +-1 gives +-inf, |x| > 1 nan.
    ax = tl.abs(x)
    return _odd(0.5 * log1p_body(_fdiv(2.0 * ax, 1.0 - ax)), x)


# --- erf and its relatives --------------------------------------------------------


@triton.jit
def _erf(x):
    return tl.math.erf(x)


@triton.jit
def _erfc(x):
    """erfc for float32: ``1 - erf`` below 0.5; beyond, the Chebyshev fit of Numerical
    Recipes (``erfcc``, relative error 1.2e-7) with ``exp(-z^2)`` split exactly (``z^2``
    would cost ``z^2 * 2^-24`` relative), so the tail keeps its relative accuracy."""
    z = tl.abs(x)
    t = _fdiv(1.0, 1.0 + 0.5 * z)
    p = t * 0.17087277 - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    zh = tl.floor(z * 256.0) * 0.00390625  # 12 bits below z = 16: zh * zh is exact
    tail = t * _exp_precise(-zh * zh) * _exp_precise(p - (z - zh) * (z + zh))
    tail = tl.where(z > 10.5, 0.0, tail)  # below float32's least value (and z = inf)
    r = tl.where(z < 0.5, 1.0 - tl.math.erf(z), tail)
    return tl.where(x < 0, 2.0 - r, r)


@triton.jit
def _erfinv(y):
    """erfinv for float32: Giles' approximation ("Approximating the erfinv function",
    GPU Computing Gems, 2011), within 3 ulp; +-1 gives +-inf, |y| > 1 nan."""
    w = -tl.log((1.0 - y) * (1.0 + y))
    c = w - 2.5
    p = c * 2.81022636e-08 + 3.43273939e-07
    p = p * c - 3.5233877e-06
    p = p * c - 4.39150654e-06
    p = p * c + 0.00021858087
    p = p * c - 0.00125372503
    p = p * c - 0.00417768164
    p = p * c + 0.246640727
    p = p * c + 1.50140941
    s = _sqrt_rn(w) - 3.0
    q = s * -0.000200214257 + 0.000100950558
    q = q * s + 0.00134934322
    q = q * s - 0.00367342844
    q = q * s + 0.00573950773
    q = q * s - 0.0076224613
    q = q * s + 0.00943887047
    q = q * s + 1.00167406
    q = q * s + 2.83297682
    r = tl.where(w < 5.0, p, q) * y
    return tl.where(tl.abs(y) == 1.0, y * _INF, r)


# --- logarithms and exponentials --------------------------------------------------


@triton.jit
def _log2(x):
    return tl.log2(x)


@triton.jit
def _log10(x):
    return tl.log2(x) * 0.30102999566398120


@triton.jit
def _log1p(x):
    return log1p_body(x)


@triton.jit
def _expm1(x):
    return expm1_body(x)


@triton.jit
def _exp2(x):
    return tl.exp2(x)

# --- ops ------------------------------------------------------------------------------

_FLOAT_VALUED = {
    "tan": _tan, "asin": _asin, "acos": _acos, "atan": _atan, "sinh": _sinh, "cosh": _cosh,
    "asinh": _asinh, "acosh": _acosh, "atanh": _atanh, "erf": _erf, "erfc": _erfc,
    "erfinv": _erfinv, "log2": _log2, "log10": _log10, "log1p": _log1p, "expm1": _expm1,
    "exp2": _exp2,
}
UNARY_MATH = {name: Op(name, body, "p", P.INT_TO_FLOAT) for name, body in _FLOAT_VALUED.items()}
"""The float-valued unary functions, by aten name."""


def _declare(name: str, doc: str) -> Callable[..., Tensor]:
    """The public function of ``UNARY_MATH[name]``, declared for ``name.default``,
    ``name.out`` and ``name_.default``."""
    fn = unary_function(UNARY_MATH[name], doc)
    fn.__module__ = __name__  # the declaration's module: this one, not the iterator
    return op(f"{name}.default", out=f"{name}.out", inplace=f"{name}_.default")(fn)


tan = _declare("tan", "Tangent, ``sin / cos``.")
asin = _declare("asin", "Arcsine; nan outside [-1, 1].")
acos = _declare("acos", "Arccosine; nan outside [-1, 1].")
atan = _declare("atan", "Arctangent (Cephes), within 2 ulp.")
sinh = _declare("sinh", "Hyperbolic sine, from expm1 (no cancellation near 0).")
cosh = _declare("cosh", "Hyperbolic cosine, finite up to its own overflow.")
asinh = _declare("asinh", "Inverse hyperbolic sine.")
acosh = _declare("acosh", "Inverse hyperbolic cosine; nan below 1.")
atanh = _declare("atanh", "Inverse hyperbolic tangent; +-inf at +-1, nan beyond.")
erf = _declare("erf", "The error function.")
log2 = _declare("log2", "Base-2 logarithm.")
log10 = _declare("log10", "Base-10 logarithm.")
log1p = _declare("log1p", "``log(1 + self)``, exact near 0.")
expm1 = _declare("expm1", "``exp(self) - 1``, exact near 0.")
exp2 = _declare("exp2", "``2 ** self``.")


def _float32_only(self: Tensor, name: str) -> None:
    result = self.dtype if self.dtype.is_floating_point else torch.get_default_dtype()
    if result == torch.float64:
        raise Unsupported(f"{name} in float64 (written for float32 accuracy)")


@op("erfc.default", out="erfc.out", inplace="erfc_.default")
def erfc(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``1 - erf(self)`` with relative accuracy in the tail; float64 is handed to torch."""
    _float32_only(self, "erfc")
    return run(UNARY_MATH["erfc"], (self,), out=out, inplace=inplace)


@op("erfinv.default", out="erfinv.out", inplace="erfinv_.default")
def erfinv(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """The inverse of erf on (-1, 1); float64 is handed to torch."""
    _float32_only(self, "erfinv")
    return run(UNARY_MATH["erfinv"], (self,), out=out, inplace=inplace)
