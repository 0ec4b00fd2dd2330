"""More activations and the backward ops autograd calls for them: hardtanh (and relu6,
which torch runs as ``hardtanh(x, 0, 6)``), leaky_relu, elu, softplus, hardsigmoid,
hardswish and mish.

They take floating tensors only (torch refuses integers for all but hardtanh, whose
integer form is handed back) and compute half types in float32, with torch's formulas
(softplus is ``x`` above the threshold, elu uses ``expm1``). Their ``out=`` (``grad_input=``)
must have the input's dtype, as torch's kernels insist (hardtanh's, which is clamp's,
may be any dtype the result casts to). The Triton kernels take at most three operands,
so scalar parameters the common calls leave at their defaults are fixed in the body:
elu with both ``scale`` and ``input_scale`` set, its backward with either set, softplus'
backward with ``beta != 1`` and hardtanh's backward with bounds other than (-1, 1) and
(0, 6) are handed to torch.
"""

from __future__ import annotations

from collections.abc import Callable

import triton
import triton.language as tl
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, Number
from gemsops.ops.pointwise import elementwise as M
from gemsops.ops.pointwise.arith import CLAMP
from gemsops.ops.pointwise.elementwise import _exp_precise, _fdiv
from gemsops.ops.pointwise.iterator import run
from gemsops.ops.pointwise.math import expm1_body, log1p_body
from gemsops.ops.pointwise.types import PointwiseOp as Op

__all__ = [
    "elu", "elu_backward", "hardsigmoid", "hardsigmoid_backward", "hardswish",
    "hardswish_backward", "hardtanh", "hardtanh_backward", "leaky_relu", "leaky_relu_backward",
    "mish", "mish_backward", "softplus", "softplus_backward",
]

# --- element functions ----------------------------------------------------------------


@triton.jit
def _leaky_relu(x, slope):
    return tl.where(x > 0, x, x * slope)


@triton.jit
def _leaky_relu_backward(g, x, slope):
    return tl.where(x > 0, g, g * slope)


@triton.jit
def _elu_scaled(x, negcoef, poscoef):
    return tl.where(x <= 0, expm1_body(x) * negcoef, x * poscoef)


@triton.jit
def _elu_input_scaled(x, negcoef, negiptcoef):
    return tl.where(x <= 0, expm1_body(x * negiptcoef) * negcoef, x)


@triton.jit
def _elu_backward(g, x, alpha):
    return tl.where(x > 0, g, g * alpha * _exp_precise(x))  # nan gives nan, as torch


@triton.jit
def _elu_backward_of_result(g, y, alpha):
    return tl.where(y > 0, g, g * (y + alpha))


@triton.jit
def _softplus(x, beta, threshold):
    bx = x * beta
    return tl.where(bx > threshold, x, _fdiv(log1p_body(_exp_precise(bx)), beta))


@triton.jit
def _softplus_backward(g, x, threshold):
    z = _exp_precise(x)
    return tl.where(x > threshold, g, _fdiv(g * z, z + 1.0))


@triton.jit
def _div_by(v, d: tl.constexpr):
    # Correctly rounded v / d (as torch divides), d a constant: _fdiv takes a tensor.
    return _fdiv(v, tl.full(v.shape, d, v.dtype))


@triton.jit
def _relu6_of_shifted(x):
    # min(max(x + 3, 0), 6), nan propagating (std::max and std::min pass nan here).
    return M.minimum(M.maximum(x + 3.0, 0.0), 6.0)


@triton.jit
def _hardsigmoid(x):
    return _div_by(_relu6_of_shifted(x), 6.0)


@triton.jit
def _hardsigmoid_backward(g, x):
    return tl.where((x > -3.0) & (x < 3.0), g * 0.16666666666666666, 0.0)


@triton.jit
def _hardswish(x):
    return _div_by(x * _relu6_of_shifted(x), 6.0)


@triton.jit
def _hardswish_backward(g, x):
    # torch's (vectorised) order: 0 at -3 and below, grad at 3 and above; nan gives nan.
    return tl.where(x <= -3.0, 0.0, tl.where(x >= 3.0, g, g * (_div_by(x, 3.0) + 0.5)))


@triton.jit
def _tanh_softplus(x):
    return M.tanh(log1p_body(_exp_precise(x)))


@triton.jit
def _mish(x):
    return x * _tanh_softplus(x)


@triton.jit
def _mish_backward(g, x):
    s = _fdiv(1.0, 1.0 + _exp_precise(-x))
    t = _tanh_softplus(x)
    return g * (t + x * s * (1.0 - t * t))


@triton.jit
def _hardtanh_backward_unit(g, x):
    return tl.where((x > -1.0) & (x < 1.0), g, 0.0)  # 0 for nan, as torch


@triton.jit
def _hardtanh_backward_six(g, x):
    return tl.where((x > 0.0) & (x < 6.0), g, 0.0)


# --- records --------------------------------------------------------------------------

LEAKY_RELU = Op("leaky_relu", _leaky_relu, "pa", dtypes=FLOAT_DTYPES)
LEAKY_RELU_BACKWARD = Op("leaky_relu_backward", _leaky_relu_backward, "ppa",
                         dtypes=FLOAT_DTYPES)
ELU = {"scaled": Op("elu", _elu_scaled, "paa", dtypes=FLOAT_DTYPES),
       "input_scaled": Op("elu", _elu_input_scaled, "paa", dtypes=FLOAT_DTYPES)}
ELU_BACKWARD = {False: Op("elu_backward", _elu_backward, "ppa", dtypes=FLOAT_DTYPES),
                True: Op("elu_backward", _elu_backward_of_result, "ppa", dtypes=FLOAT_DTYPES)}
SOFTPLUS = Op("softplus", _softplus, "paa", dtypes=FLOAT_DTYPES)
SOFTPLUS_BACKWARD = Op("softplus_backward", _softplus_backward, "ppa", dtypes=FLOAT_DTYPES)
HARDSIGMOID = Op("hardsigmoid", _hardsigmoid, "p", dtypes=FLOAT_DTYPES)
HARDSIGMOID_BACKWARD = Op("hardsigmoid_backward", _hardsigmoid_backward, "pp",
                          dtypes=FLOAT_DTYPES)
HARDSWISH = Op("hardswish", _hardswish, "p", dtypes=FLOAT_DTYPES)
HARDSWISH_BACKWARD = Op("hardswish_backward", _hardswish_backward, "pp", dtypes=FLOAT_DTYPES)
MISH = Op("mish", _mish, "p", dtypes=FLOAT_DTYPES)
MISH_BACKWARD = Op("mish_backward", _mish_backward, "pp", dtypes=FLOAT_DTYPES)
HARDTANH_BACKWARD = {
    (-1.0, 1.0): Op("hardtanh_backward", _hardtanh_backward_unit, "pp", dtypes=FLOAT_DTYPES),
    (0.0, 6.0): Op("hardtanh_backward", _hardtanh_backward_six, "pp", dtypes=FLOAT_DTYPES),
}


def _out(self: Tensor, out: Tensor | None, grad_input: Tensor | None = None,
         inplace: bool = False) -> Tensor | None:
    """The output tensor (``out`` or aten's ``grad_input``), refused unless it has
    ``self``'s dtype: torch's kernels for these ops raise for any other."""
    if out is not None and grad_input is not None:
        raise TypeError("pass the output as out or as grad_input, not both")
    target = grad_input if out is None else out
    if target is not None and not inplace and target.dtype != self.dtype:
        raise Unsupported(f"an out= of {target.dtype} for a {self.dtype} input")  # torch raises
    if not self.dtype.is_floating_point:
        raise Unsupported(f"{self.dtype} input")  # torch refuses, or (hardtanh) copies
    return target


# --- forward ops ------------------------------------------------------------------------


@op("hardtanh.default", out="hardtanh.out", inplace="hardtanh_.default")
def hardtanh(self: Tensor, min_val: Number = -1, max_val: Number = 1, *,
             out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``clamp(self, min_val, max_val)`` for floating tensors (torch's hardtanh is clamp)."""
    if not self.dtype.is_floating_point:
        raise Unsupported(f"hardtanh of {self.dtype}")  # torch's integer rules: its own
    return run(CLAMP, (self, min_val, max_val), out=out, inplace=inplace)


@op("leaky_relu.default", out="leaky_relu.out", inplace="leaky_relu_.default")
def leaky_relu(self: Tensor, negative_slope: Number = 0.01, *, out: Tensor | None = None,
               inplace: bool = False) -> Tensor:
    """``self`` where positive, else ``self * negative_slope``."""
    return run(LEAKY_RELU, (self, negative_slope), out=_out(self, out, inplace=inplace),
               inplace=inplace)


@op("elu.default", out="elu.out", inplace="elu_.default")
def elu(self: Tensor, alpha: Number = 1, scale: Number = 1, input_scale: Number = 1, *,
        out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """``scale * self`` where positive, else ``alpha * scale * expm1(input_scale * self)``
    (selu and celu reach it too); ``scale`` and ``input_scale`` both set go to torch."""
    target = _out(self, out, inplace=inplace)
    if input_scale == 1:
        args = (self, float(alpha) * float(scale), scale)
        record = ELU["scaled"]
    elif scale == 1:
        args, record = (self, alpha, input_scale), ELU["input_scaled"]
    else:
        raise Unsupported("elu with both scale and input_scale")  # three scalars
    return run(record, args, out=target, inplace=inplace)


@op("softplus.default", out="softplus.out")
def softplus(self: Tensor, beta: Number = 1, threshold: Number = 20, *,
             out: Tensor | None = None) -> Tensor:
    """``log1p(exp(beta * self)) / beta``, or ``self`` where ``beta * self > threshold``."""
    return run(SOFTPLUS, (self, beta, threshold), out=_out(self, out))


def _unary(record: Op, doc: str, inplace: bool = True) -> Callable[..., Tensor]:
    def fn(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
        return run(record, (self,), out=_out(self, out, inplace=inplace), inplace=inplace)

    fn.__name__ = fn.__qualname__ = name = record.name
    fn.__doc__ = doc
    return op(f"{name}.default", out=f"{name}.out",
              inplace=f"{name}_.default" if inplace else ())(fn)


hardsigmoid = _unary(HARDSIGMOID, "``min(max(self + 3, 0), 6) / 6``; nan stays nan.")
hardswish = _unary(HARDSWISH, "``self * min(max(self + 3, 0), 6) / 6``.")
mish = _unary(MISH, "``self * tanh(softplus(self))``.")


# --- backward ops -----------------------------------------------------------------------


@op("hardtanh_backward.default", out="hardtanh_backward.grad_input")
def hardtanh_backward(grad_output: Tensor, self: Tensor, min_val: Number, max_val: Number, *,
                      out: Tensor | None = None, grad_input: Tensor | None = None) -> Tensor:
    """``grad_output`` strictly inside (min_val, max_val), else 0; the bounds of hardtanh
    and relu6 only."""
    record = HARDTANH_BACKWARD.get((float(min_val), float(max_val)))
    if record is None:
        raise Unsupported(f"hardtanh_backward with bounds ({min_val}, {max_val})")
    return run(record, (grad_output, self), out=_out(self, out, grad_input))


@op("leaky_relu_backward.default", out="leaky_relu_backward.grad_input")
def leaky_relu_backward(grad_output: Tensor, self: Tensor, negative_slope: Number,
                        self_is_result: bool, *, out: Tensor | None = None,
                        grad_input: Tensor | None = None) -> Tensor:
    """``grad_output`` where ``self > 0``, else ``grad_output * negative_slope``."""
    if self_is_result and negative_slope < 0:
        raise Unsupported("in-place leaky_relu backward with a negative slope")  # torch raises
    return run(LEAKY_RELU_BACKWARD, (grad_output, self, negative_slope),
               out=_out(self, out, grad_input))


@op("elu_backward.default", out="elu_backward.grad_input")
def elu_backward(grad_output: Tensor, alpha: Number, scale: Number, input_scale: Number,
                 is_result: bool, self_or_result: Tensor, *, out: Tensor | None = None,
                 grad_input: Tensor | None = None) -> Tensor:
    """elu's gradient from its input or (``is_result``) its output, for ``scale`` and
    ``input_scale`` 1 (``F.elu``); other scales go to torch."""
    if scale != 1 or input_scale != 1:
        raise Unsupported("elu_backward with a scale or input_scale")  # four operands
    if is_result and alpha < 0:
        raise Unsupported("in-place elu backward with a negative alpha")  # torch raises
    return run(ELU_BACKWARD[bool(is_result)], (grad_output, self_or_result, alpha),
               out=_out(self_or_result, out, grad_input))


@op("softplus_backward.default", out="softplus_backward.grad_input")
def softplus_backward(grad_output: Tensor, self: Tensor, beta: Number, threshold: Number, *,
                      out: Tensor | None = None, grad_input: Tensor | None = None) -> Tensor:
    """``grad_output * sigmoid(self)`` below the threshold, else ``grad_output``; for
    ``beta`` 1 (other betas go to torch)."""
    if beta != 1:
        raise Unsupported("softplus_backward with beta != 1")  # four operands
    return run(SOFTPLUS_BACKWARD, (grad_output, self, threshold),
               out=_out(self, out, grad_input))


@op("hardsigmoid_backward.default", out="hardsigmoid_backward.grad_input")
def hardsigmoid_backward(grad_output: Tensor, self: Tensor, *, out: Tensor | None = None,
                         grad_input: Tensor | None = None) -> Tensor:
    """``grad_output / 6`` strictly inside (-3, 3), else 0."""
    return run(HARDSIGMOID_BACKWARD, (grad_output, self), out=_out(self, out, grad_input))


@op("hardswish_backward.default", out="hardswish_backward.out")
def hardswish_backward(grad_output: Tensor, self: Tensor, *,
                       out: Tensor | None = None) -> Tensor:
    """0 up to -3, ``grad_output * (self / 3 + 1/2)`` inside, ``grad_output`` from 3."""
    return run(HARDSWISH_BACKWARD, (grad_output, self), out=_out(self, out))


@op("mish_backward.default")
def mish_backward(grad_output: Tensor, self: Tensor) -> Tensor:
    """mish's gradient ``t + x * sigmoid(x) * (1 - t^2)``, ``t = tanh(softplus(x))``."""
    return run(MISH_BACKWARD, (grad_output, self), out=_out(self, None))
