"""Pointwise arithmetic, comparison, logic and selection: add ... pow, eq ... ge, where, clamp.

Each op is a :class:`~gemsops.ops.pointwise.types.PointwiseOp` (an element function
from :mod:`gemsops.ops.pointwise.elementwise` with operand roles and a promotion kind)
run by the shared generator. The host functions pick the op and check what torch checks
before its kernel runs (bool subtraction, float alpha with integers, integer division by
zero where it can be seen, pow's exponent range...).

Each host function is declared (:func:`gemsops.declare.op`) with the aten overloads it
serves. It takes ``out=`` and ``inplace`` (``out`` is ``self``, written in place), both
written by :func:`~gemsops.ops.pointwise.iterator.run` as torch writes them, so the
derived ``out=`` and in-place overloads (``add.out``, ``add_.Tensor``) call it directly.

:data:`FILL` and :data:`COPY` are the records other families run (fills, clone, cat).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import gemshal
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, Number
from gemsops.ops.pointwise import elementwise as M
from gemsops.ops.pointwise.iterator import (
    binary_function,
    broadcast_shape,
    resize_output,
    run,
    unary_function,
)
from gemsops.ops.pointwise.types import (
    ALL_DTYPES,
    NO_BOOL,
    device_type,
    overflows,
    result_type,
)
from gemsops.ops.pointwise.types import PointwiseOp as Op
from gemsops.ops.pointwise.types import Promotion as P

__all__ = [
    "COPY", "FILL", "abs", "add", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor",
    "clamp", "clamp_max", "clamp_min", "div", "eq", "ge", "gt", "le", "logical_and",
    "logical_not", "logical_or", "lt", "masked_fill", "maximum", "minimum", "mul", "ne", "neg",
    "pow", "rsub", "sign", "sub", "where",
]

Value = Tensor | Number

ADD = Op("add", M.add, "pp")
ADD_ALPHA = Op("add", M.add_alpha, "ppa")
SUB = Op("sub", M.sub, "pp", dtypes=NO_BOOL)
SUB_ALPHA = Op("sub", M.sub_alpha, "ppa", dtypes=NO_BOOL)
MUL = Op("mul", M.mul, "pp")
DIV = {
    None: Op("div", M.div_true, "pp", P.INT_TO_FLOAT),
    "trunc": Op("div", M.div_trunc, "pp", dtypes=NO_BOOL),
    "floor": Op("div", M.div_floor, "pp", dtypes=NO_BOOL),
}
# torch truncates a float16 or bfloat16 quotient of two tensors after rounding it to that
# type (its vectorised CPU loop and its CUDA kernel both divide in the half type); a host
# scalar divisor it divides by in float32 on the CPU, while its device kernels (CUDA,
# XPU) multiply by the scalar's reciprocal instead.
DIV_TRUNC_HALF = {
    torch.float16: Op("div", M.div_trunc_f16, "pp", dtypes=NO_BOOL),
    torch.bfloat16: Op("div", M.div_trunc_bf16, "pp", dtypes=NO_BOOL),
}
DIV_TRUNC_RECIPROCAL = Op("div", M.div_trunc_reciprocal, "pp", dtypes=NO_BOOL)
NEG = Op("neg", M.neg, "p", dtypes=NO_BOOL)
ABS = Op("abs", M.absolute, "p", dtypes=NO_BOOL)
SIGN = Op("sign", M.sign, "p")
MAXIMUM = Op("maximum", M.maximum, "pp")
MINIMUM = Op("minimum", M.minimum, "pp")
# torch converts clamp's scalar bounds with a range check (float16 and 1e30 raise).
CLAMP = Op("clamp", M.clamp, "ppp", dtypes=NO_BOOL, scalars="checked")
CLAMP_MIN = Op("clamp_min", M.maximum, "pp", dtypes=NO_BOOL, scalars="checked")
CLAMP_MAX = Op("clamp_max", M.minimum, "pp", dtypes=NO_BOOL, scalars="checked")
WHERE = Op("where", M.where, "bpp")
MASKED_FILL = Op("masked_fill", M.masked_fill, "pbv", P.FIRST, scalars="checked")
COPY = Op("copy", M.identity, "p", keeps_strides=True)
FILL = Op("fill", M.identity, "v", P.OUTPUT, scalars="checked")
# Comparisons cast a scalar to the common dtype (float16 x == 1e30 compares with inf).
COMPARE = {name: Op(name, getattr(M, name), "pp", P.ALWAYS_BOOL, scalars="common")
           for name in ("eq", "ne", "lt", "le", "gt", "ge")}
# Bitwise ops take integers and bool only; a scalar is cast to the common dtype first.
_BITS = frozenset((*INT_DTYPES, torch.bool))
BITWISE = {name: Op(name, getattr(M, name), "pp", dtypes=_BITS, scalars="common")
           for name in ("bitwise_and", "bitwise_or", "bitwise_xor")}
BITWISE_NOT = Op("bitwise_not", M.bitwise_not, "p", dtypes=_BITS)
LOGICAL = {
    "logical_and": Op("logical_and", M.logical_and, "pp", P.ALWAYS_BOOL),
    "logical_or": Op("logical_or", M.logical_or, "pp", P.ALWAYS_BOOL),
    "logical_not": Op("logical_not", M.logical_not, "p", P.ALWAYS_BOOL),
}
# pow casts a scalar base or exponent to the common dtype, as torch does (so a bfloat16
# tensor ** 2.3 uses 2.296875).
POW_INT = Op("pow", M.pow_int, "pp", dtypes=ALL_DTYPES.difference(FLOAT_DTYPES, {torch.bool}),
             scalars="common")
POW_FLOAT = Op("pow", M.pow_float, "pp", dtypes=FLOAT_DTYPES, scalars="common")
POW_FLOAT_WIDE = Op("pow", M.pow_float_wide, "pp", dtypes=FLOAT_DTYPES, scalars="common")
# torch's pow(x, scalar) runs these for the exponents named (so (-inf) ** 0.5 is nan).
_POW_SPECIAL = {
    2: Op("pow", M.square, "p"),
    3: Op("pow", M.cube, "p"),
    0.5: Op("pow", M.sqrt, "p", dtypes=FLOAT_DTYPES),
    -0.5: Op("pow", M.rsqrt, "p", dtypes=FLOAT_DTYPES),
    -1: Op("pow", M.reciprocal, "p", dtypes=FLOAT_DTYPES),
    -2: Op("pow", M.inv_square, "p", dtypes=FLOAT_DTYPES),
}


# --- add, sub, mul, div -----------------------------------------------------------


def _add(sub: bool, self: Value, other: Value, alpha: Number, out: Tensor | None,
         inplace: bool = False) -> Tensor:
    if sub and any(isinstance(x, bool) or (isinstance(x, Tensor) and x.dtype == torch.bool)
                   for x in (self, other)):
        raise Unsupported("subtraction with a bool tensor")  # torch raises
    if type(alpha) is int and alpha == 1:
        return run(SUB if sub else ADD, (self, other), out=out, inplace=inplace)
    common = result_type([self, other])
    if isinstance(alpha, float) and not common.is_floating_point:
        raise Unsupported("a float alpha with integer inputs")  # torch raises
    if isinstance(alpha, bool) and common != torch.bool:
        raise Unsupported("a bool alpha with non-bool inputs")  # torch raises
    if not (type(alpha) is int and -128 <= alpha <= 127) and overflows(alpha, _alpha_type(common)):
        # torch converts alpha with a range check and raises (an int8 tensor with alpha
        # 1000); within range the integer result wraps, as the kernel's does.
        raise Unsupported(f"alpha {alpha} overflows {common}")
    return run(SUB_ALPHA if sub else ADD_ALPHA, (self, other, alpha), out=out, inplace=inplace)


def _alpha_type(common: torch.dtype) -> torch.dtype:
    """The type torch converts alpha to: the common dtype in its CPU kernel, the compute
    type (float32 for half types) in its accelerator kernels."""
    if common in (torch.float16, torch.bfloat16) and device_type() != "cpu":
        return torch.float32
    return common


@op("add.Tensor", "add.Scalar", out="add.out", inplace=("add_.Tensor", "add_.Scalar"))
def add(self: Tensor, other: Value, *, alpha: Number = 1, out: Tensor | None = None,
        inplace: bool = False) -> Tensor:
    """``self + alpha * other``, broadcast, with torch's type promotion."""
    return _add(False, self, other, alpha, out, inplace)


@op("sub.Tensor", "sub.Scalar", out="sub.out", inplace=("sub_.Tensor", "sub_.Scalar"))
def sub(self: Tensor, other: Value, *, alpha: Number = 1, out: Tensor | None = None,
        inplace: bool = False) -> Tensor:
    """``self - alpha * other`` (bool operands are refused, as in torch)."""
    return _add(True, self, other, alpha, out, inplace)


@op("rsub.Tensor", "rsub.Scalar")
def rsub(self: Tensor, other: Value, *, alpha: Number = 1) -> Tensor:
    """``other - alpha * self``."""
    return _add(True, other, self, alpha, None)


@op("mul.Tensor", "mul.Scalar", out="mul.out", inplace=("mul_.Tensor", "mul_.Scalar"))
def mul(self: Tensor, other: Value, *, out: Tensor | None = None,
        inplace: bool = False) -> Tensor:
    """``self * other``."""
    return run(MUL, (self, other), out=out, inplace=inplace)


def _has_zero(x: Value) -> bool:
    """Whether a divisor has a zero, where that can be seen without a device sync.

    A CPU tensor is read through numpy (no torch op, so no re-entry into gemsops). On a
    device an integer division by zero gives an unspecified value, as torch's does.
    """
    if not isinstance(x, Tensor):
        return x == 0
    if x.device.type != "cpu" or x.dtype.is_floating_point:
        return False
    return bool((x.detach().numpy() == 0).any())


@op("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode",
    out=("div.out", "div.out_mode"),
    inplace=("div_.Tensor", "div_.Scalar", "div_.Tensor_mode", "div_.Scalar_mode"))
def div(self: Tensor, other: Value, *, rounding_mode: str | None = None,
        out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``self / other``: true division (integers give floats), or ``"trunc"``/``"floor"``."""
    op_ = DIV.get(rounding_mode)
    if op_ is None:
        raise Unsupported(f"rounding_mode {rounding_mode!r}")  # torch raises
    if rounding_mode is not None and not result_type([self, other]).is_floating_point \
            and _has_zero(other):
        raise Unsupported("integer division by zero")  # torch's CPU kernel raises
    if rounding_mode == "trunc":
        op_ = _div_trunc(self, other)
    return run(op_, (self, other), out=out, inplace=inplace)


def _div_trunc(self: Tensor, other: Value) -> Op:
    """The trunc division body that gives torch's answer for these operands (see DIV_TRUNC_HALF).

    (torch's CPU kernel has one more case, not followed: a single-element float16 pair
    takes its scalar loop, which truncates the float32 quotient.)
    """
    common = result_type([self, other])
    if not common.is_floating_point:
        return DIV["trunc"]
    if not isinstance(other, Tensor) or (other.dim() == 0 and other.device.type == "cpu"):
        # off the CPU: torch's CUDA (and XPU) kernels take the reciprocal
        return DIV["trunc"] if device_type() == "cpu" else DIV_TRUNC_RECIPROCAL
    return DIV_TRUNC_HALF.get(common, DIV["trunc"])


# --- pow --------------------------------------------------------------------------


def _full(value: Number, a: Value, b: Value, dtype: torch.dtype, out: Tensor | None,
          inplace: bool) -> Tensor:
    shape = broadcast_shape([x.shape for x in (a, b) if isinstance(x, Tensor)])
    if out is None:
        device = next(x.device for x in (a, b) if isinstance(x, Tensor))
        out = torch.empty(shape, dtype=dtype, device=device)
    elif inplace and out.shape != shape:
        raise Unsupported(f"in-place output of shape {tuple(out.shape)}, broadcast {shape}")
    elif not torch.can_cast(dtype, out.dtype):
        raise Unsupported(f"a {dtype} result cannot be cast to a {out.dtype} output")
    elif out.shape != shape:
        resize_output(out, shape, [x for x in (a, b) if isinstance(x, Tensor)])
    return run(FILL, (value,), out=out, inplace=True)


@op("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar",
    out=("pow.Tensor_Tensor_out", "pow.Tensor_Scalar_out", "pow.Scalar_out"),
    inplace=("pow_.Tensor", "pow_.Scalar"))
def pow(self: Value, exponent: Value, *, out: Tensor | None = None,
        inplace: bool = False) -> Tensor:
    """``self ** exponent`` for tensor or Python-number base and exponent (not both numbers)."""
    common = result_type([self, exponent])
    if common.is_complex:
        raise Unsupported(f"pow in {common}")  # the kernels take no complex dtype
    if isinstance(self, Tensor) and not isinstance(exponent, Tensor):
        if overflows(exponent, common):
            raise Unsupported(f"exponent {exponent} overflows {common}")  # checked cast
        # torch's pow(tensor, scalar) fills for 0, copies for 1, and runs sqrt, x * x...
        # for the exponents in _POW_SPECIAL.
        if exponent == 0:
            return _full(1, self, exponent, common, out, inplace)
        if exponent == 1:
            return run(COPY, (self,), out=out, inplace=inplace, common=common)
        if not common.is_floating_point and exponent < 0:
            raise Unsupported("integers to negative integer powers")  # torch raises
        special = _POW_SPECIAL.get(exponent)
        if special is not None and common in special.dtypes:
            return run(special, (self,), out=out, inplace=inplace, common=common)
    elif not isinstance(self, Tensor | bool) and self == 1:
        return _full(1, self, exponent, common, out, inplace)  # torch fills: 1 ** nan is 1
    if common == torch.bool:
        raise Unsupported("pow of bools")  # torch raises
    if not common.is_floating_point:
        op_ = POW_INT
    elif common != torch.float64 and gemshal.current_vendor().capabilities.supports(
            torch.float64):
        op_ = POW_FLOAT_WIDE  # computed in float64 where the device has it
    else:
        op_ = POW_FLOAT
    return run(op_, (self, exponent), out=out, inplace=inplace)


# --- unary, comparisons, logic ----------------------------------------------------


def _compare(name: str, doc: str) -> Callable[..., Tensor]:
    """A comparison, serving its Tensor and Scalar overloads, out= and in place (where the
    bool result is cast to self's dtype)."""
    return op(f"{name}.Tensor", f"{name}.Scalar",
              out=(f"{name}.Tensor_out", f"{name}.Scalar_out"),
              inplace=(f"{name}_.Tensor", f"{name}_.Scalar"))(binary_function(COMPARE[name], doc))


neg = op("neg.default", out="neg.out", inplace="neg_.default")(
    unary_function(NEG, "``-self``.", same_dtype_out=True))
abs = op("abs.default", out="abs.out", inplace="abs_.default")(
    unary_function(ABS, "``|self|`` (``abs(-0.0)`` is ``0.0``).", same_dtype_out=True))
sign = op("sign.default", "sgn.default", out=("sign.out", "sgn.out"),
          inplace=("sign_.default", "sgn_.default"))(
    unary_function(SIGN, "-1, 0 or 1 by the sign of ``self`` (0 for nan); ``sgn`` for reals.",
                   same_dtype_out=True))
eq = _compare("eq", "``self == other`` as a bool tensor.")
ne = _compare("ne", "``self != other`` as a bool tensor (true for nan).")
lt = _compare("lt", "``self < other`` as a bool tensor.")
le = _compare("le", "``self <= other`` as a bool tensor.")
gt = _compare("gt", "``self > other`` as a bool tensor.")
ge = _compare("ge", "``self >= other`` as a bool tensor.")
logical_and = op("logical_and.default", out="logical_and.out", inplace="logical_and_.default")(
    binary_function(LOGICAL["logical_and"], "Both nonzero, as a bool tensor."))
logical_or = op("logical_or.default", out="logical_or.out", inplace="logical_or_.default")(
    binary_function(LOGICAL["logical_or"], "Either nonzero, as a bool tensor."))
logical_not = op("logical_not.default", out="logical_not.out", inplace="logical_not_.default")(
    unary_function(LOGICAL["logical_not"], "Zero, as a bool tensor."))
def _bitwise(name: str, doc: str) -> Callable[..., Tensor]:
    """A bitwise op, serving its Tensor and Scalar overloads, out= and in place."""
    return op(f"{name}.Tensor", f"{name}.Scalar",
              out=(f"{name}.Tensor_out", f"{name}.Scalar_out"),
              inplace=(f"{name}_.Tensor", f"{name}_.Scalar"))(binary_function(BITWISE[name], doc))


bitwise_and = _bitwise("bitwise_and", "``self & other`` on integers and bools.")
bitwise_or = _bitwise("bitwise_or", "``self | other`` on integers and bools.")
bitwise_xor = _bitwise("bitwise_xor", "``self ^ other`` on integers and bools.")
@op("bitwise_not.default", out="bitwise_not.out", inplace="bitwise_not_.default")
def bitwise_not(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``~self`` on integers; logical not on bools (bools compute as 0/1 integers, whose
    complement would be nonzero either way)."""
    record = LOGICAL["logical_not"] if self.dtype == torch.bool else BITWISE_NOT
    return run(record, (self,), out=out, inplace=inplace)
maximum = op("maximum.default", out="maximum.out")(
    binary_function(MAXIMUM, "Elementwise max; nan wins."))
minimum = op("minimum.default", out="minimum.out")(
    binary_function(MINIMUM, "Elementwise min; nan wins."))


# --- selection --------------------------------------------------------------------


def _clamp(self: Tensor, lo: Value | None, hi: Value | None, out: Tensor | None,
           inplace: bool) -> Tensor:
    if lo is None and hi is None:
        raise Unsupported("clamp without min or max")  # torch raises
    if self.device.type != "cpu" and any(isinstance(b, float) and b != b for b in (lo, hi)):
        # A nan scalar bound: torch's CPU kernel gives nan, its CUDA kernel the input value
        # (seen on an H200, torch 2.11, for integer and float16 tensors); off the CPU it is
        # handed back, so the answer is the device's own torch's.
        raise Unsupported("a nan scalar bound: torch's kernels differ between devices")
    if lo is None:
        return run(CLAMP_MAX, (self, hi), out=out, inplace=inplace)
    if hi is None:
        return run(CLAMP_MIN, (self, lo), out=out, inplace=inplace)
    return run(CLAMP, (self, lo, hi), out=out, inplace=inplace)


@op("clamp.default", "clamp.Tensor", out=("clamp.out", "clamp.Tensor_out"),
    inplace=("clamp_.default", "clamp_.Tensor"))
def clamp(self: Tensor, min: Value | None = None, max: Value | None = None, *,
          out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``min(max(self, min), max)``, nan propagating; scalar or tensor bounds."""
    return _clamp(self, min, max, out, inplace)


@op("clamp_min.default", "clamp_min.Tensor", out=("clamp_min.out", "clamp_min.Tensor_out"),
    inplace=("clamp_min_.default", "clamp_min_.Tensor"))
def clamp_min(self: Tensor, min: Value, *, out: Tensor | None = None,
              inplace: bool = False) -> Tensor:
    """``max(self, min)``."""
    return _clamp(self, min, None, out, inplace)


@op("clamp_max.default", "clamp_max.Tensor", out=("clamp_max.out", "clamp_max.Tensor_out"),
    inplace=("clamp_max_.default", "clamp_max_.Tensor"))
def clamp_max(self: Tensor, max: Value, *, out: Tensor | None = None,
              inplace: bool = False) -> Tensor:
    """``min(self, max)``."""
    return _clamp(self, None, max, out, inplace)


@op("where.self", out="where.self_out")
def where(condition: Tensor, self: Value, other: Value, *, out: Tensor | None = None) -> Tensor:
    """``self`` where ``condition`` (a bool tensor) holds, else ``other``."""
    return run(WHERE, (condition, self, other), out=out)


@op("masked_fill.Scalar", "masked_fill.Tensor",
    inplace=("masked_fill_.Scalar", "masked_fill_.Tensor"))
def masked_fill(self: Tensor, mask: Tensor, value: Value, *, out: Tensor | None = None,
                inplace: bool = False) -> Tensor:
    """``value`` where the bool ``mask`` holds, else ``self`` (``self``'s dtype); in place,
    ``mask`` broadcasts to ``self``."""
    if isinstance(value, Tensor) and value.dim() != 0:
        raise Unsupported("masked_fill takes a 0-dim value tensor")  # torch raises
    return run(MASKED_FILL, (self, mask, value), out=out, inplace=inplace)
