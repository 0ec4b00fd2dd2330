"""Pointwise rounding (ceil, trunc, round, frac), sign and class tests (signbit, isnan,
isinf, isposinf, isneginf) and nan_to_num.

Rounding takes floating tensors only (on integers it is a copy, which torch does) and,
like nan_to_num, writes an ``out=`` of the input's own dtype only; the tests give bools
and write only a bool ``out=``, as torch's kernels insist. ``round`` rounds half to
even and keeps the sign of a zero result (``round(-0.4)`` is -0.0).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES
from gemsops.ops.pointwise.elementwise import _fdiv, _trunc
from gemsops.ops.pointwise.iterator import own_dtype_out, run
from gemsops.ops.pointwise.types import PointwiseOp as Op
from gemsops.ops.pointwise.types import Promotion as P

__all__ = [
    "ROUNDING", "ceil", "frac", "isinf", "isnan", "isneginf", "isposinf", "nan_to_num", "round",
    "signbit", "trunc",
]

_INF = tl.constexpr(float("inf"))

# --- rounding ---------------------------------------------------------------------


@triton.jit
def _ceil(x):
    return tl.ceil(x)


@triton.jit
def _trunc_body(x):
    return _trunc(x)


@triton.jit
def _rint(x):
    """Round half to even (C's nearbyint), keeping the sign of a zero result."""
    r = tl.floor(x)
    d = x - r  # exact: |x| < 2^52 here, and r is x's integer part
    half_odd = (d == 0.5) & (tl.floor(r * 0.5) * 2.0 != r)
    r = tl.where((d > 0.5) | half_odd, r + 1.0, r)
    r = tl.where(r == 0, x * 0.0, r)  # -0.3 and -0.5 round to -0.0
    return tl.where(tl.abs(x) < 4503599627370496.0, r, x)  # 2^52 and up: integers, inf, nan


@triton.jit
def _round_scaled(x, ten):
    return _fdiv(_rint(x * ten), ten)


@triton.jit
def _round_scaled_down(x, ten):
    return _rint(_fdiv(x, ten)) * ten


@triton.jit
def _frac(x):
    return x - _trunc(x)


# --- tests of sign and class ------------------------------------------------------


@triton.jit
def _signbit(x):
    """The sign bit: set for -0.0 and for a negative nan; ``x < 0`` for integers."""
    if x.dtype == tl.float64:
        r = x.to(tl.int64, bitcast=True) < 0
    elif x.dtype == tl.float32:
        r = x.to(tl.int32, bitcast=True) < 0
    else:
        r = x < 0
    return r


@triton.jit
def _isnan(x):
    return x != x


@triton.jit
def _isinf(x):
    if x.dtype.is_floating():  # noqa: SIM108 - a static if in Triton, not a select
        r = tl.abs(x) == _INF
    else:
        r = x != x
    return r


@triton.jit
def _isposinf(x):
    if x.dtype.is_floating():  # noqa: SIM108 - a static if in Triton, not a select
        r = x == _INF
    else:
        r = x != x
    return r


@triton.jit
def _isneginf(x):
    if x.dtype.is_floating():  # noqa: SIM108 - a static if in Triton, not a select
        r = x == -_INF
    else:
        r = x != x
    return r


@triton.jit
def _nan_to_num(x, nan, big):
    # posinf -> big, -inf -> -big (the host takes only symmetric replacements).
    r = tl.where(x == _INF, big, tl.where(x == -_INF, -big, x))
    return tl.where(x != x, nan, r)


# --- ops ------------------------------------------------------------------------------

ROUNDING = {
    "ceil": Op("ceil", _ceil, "p", dtypes=FLOAT_DTYPES),
    "trunc": Op("trunc", _trunc_body, "p", dtypes=FLOAT_DTYPES),
    "round": Op("round", _rint, "p", dtypes=FLOAT_DTYPES),
    "frac": Op("frac", _frac, "p", dtypes=FLOAT_DTYPES),
    "signbit": Op("signbit", _signbit, "p", P.ALWAYS_BOOL),
    "isnan": Op("isnan", _isnan, "p", P.ALWAYS_BOOL),
    "isinf": Op("isinf", _isinf, "p", P.ALWAYS_BOOL),
    "isposinf": Op("isposinf", _isposinf, "p", P.ALWAYS_BOOL),
    "isneginf": Op("isneginf", _isneginf, "p", P.ALWAYS_BOOL),
}
"""The one-operand records, by aten name."""
ROUND_DECIMALS = (Op("round", _round_scaled, "pa", dtypes=FLOAT_DTYPES),
                  Op("round", _round_scaled_down, "pa", dtypes=FLOAT_DTYPES))
NAN_TO_NUM = Op("nan_to_num", _nan_to_num, "pvv", P.FIRST, FLOAT_DTYPES)


def _check_out(name: str, self: Tensor, out: Tensor | None, inplace: bool) -> None:
    """torch writes these ops' ``out=`` only in the result's own dtype, and raises else."""
    want = torch.bool if ROUNDING.get(name, NAN_TO_NUM).promotion is P.ALWAYS_BOOL \
        else self.dtype
    own_dtype_out(name, want, out, inplace)


def _declare(name: str, doc: str, inplace: bool = True) -> Callable[..., Tensor]:
    """The public function of ``ROUNDING[name]``, declared for ``name.default``,
    ``name.out`` and (where aten has it) ``name_.default``."""
    record = ROUNDING[name]

    def fn(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
        _check_out(name, self, out, inplace)
        return run(record, (self,), out=out, inplace=inplace)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return op(f"{name}.default", out=f"{name}.out",
              inplace=f"{name}_.default" if inplace else ())(fn)


ceil = _declare("ceil", "The least integer not below ``self``, in its dtype (floating only).")
trunc = _declare("trunc", "``self`` rounded towards zero (floating only).")
frac = _declare("frac", "``self - trunc(self)`` (floating only).")
signbit = _declare("signbit", "Whether the sign bit is set (-0.0 and negative nan too).",
                   inplace=False)
isnan = _declare("isnan", "Whether ``self`` is nan (never for integers).", inplace=False)
isinf = _declare("isinf", "Whether ``self`` is +-inf.", inplace=False)
isposinf = _declare("isposinf", "Whether ``self`` is +inf.", inplace=False)
isneginf = _declare("isneginf", "Whether ``self`` is -inf.", inplace=False)


@op("round.default", "round.decimals", out=("round.out", "round.decimals_out"),
    inplace=("round_.default", "round_.decimals"))
def round(self: Tensor, *, decimals: int = 0, out: Tensor | None = None,
          inplace: bool = False) -> Tensor:
    """Round half to even; with ``decimals``, as torch: ``rint(x * 10^d) / 10^d`` (``d > 0``)
    or ``rint(x / 10^-d) * 10^-d``, in the compute dtype (floating only)."""
    _check_out("round", self, out, inplace)
    if decimals == 0:
        return run(ROUNDING["round"], (self,), out=out, inplace=inplace)
    ten = float(10.0 ** abs(decimals))
    return run(ROUND_DECIMALS[decimals < 0], (self, ten), out=out, inplace=inplace)


@op("nan_to_num.default", out="nan_to_num.out", inplace="nan_to_num_.default")
def nan_to_num(self: Tensor, nan: float | None = None, posinf: float | None = None,
               neginf: float | None = None, *, out: Tensor | None = None,
               inplace: bool = False) -> Tensor:
    """nan, +inf and -inf replaced (by 0 and the dtype's largest and least values by
    default). Integers (a copy) and replacements with ``neginf != -posinf`` go to torch."""
    if not self.dtype.is_floating_point:
        raise Unsupported("nan_to_num of an integer tensor is a copy")
    big = torch.finfo(self.dtype).max
    high = big if posinf is None else posinf
    low = -big if neginf is None else neginf
    if low != -high:
        raise Unsupported("nan_to_num with posinf and neginf of different magnitudes")
    _check_out("nan_to_num", self, out, inplace)
    return run(NAN_TO_NUM, (self, 0.0 if nan is None else nan, high), out=out,
               inplace=inplace)
