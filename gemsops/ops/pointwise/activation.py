"""Pointwise math functions and activations, with the backward ops autograd calls for them.

exp, log, sqrt, rsqrt, reciprocal, sin, cos, tanh and sigmoid promote integers to the
default float dtype (torch's INT_TO_FLOAT); relu and threshold keep integer dtypes;
gelu and silu take floating tensors only. The backward ops are the ones autograd's
formulas call (``sigmoid_backward(grad, result)``, ``threshold_backward(grad, result, 0)``
for relu...); the rest of the chain rule for these ops is pointwise mul/div/neg.

Each host function is declared (:func:`gemsops.declare.op`) with the aten overloads it
serves; as in :mod:`gemsops.ops.pointwise.arith`, it takes ``out=`` and ``inplace`` so the
derived ``out=`` (``grad_input=`` for the backward ops) and in-place overloads call it
directly.
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
from gemsops.ops.pointwise.iterator import own_dtype_out, run, unary_function
from gemsops.ops.pointwise.types import NO_BOOL
from gemsops.ops.pointwise.types import PointwiseOp as Op
from gemsops.ops.pointwise.types import Promotion as P

__all__ = [
    "FLOOR", "UNARY", "cos", "exp", "floor", "gelu", "gelu_backward", "log", "reciprocal",
    "relu", "rsqrt", "sigmoid", "sigmoid_backward", "silu", "silu_backward", "sin", "sqrt", "tanh",
    "tanh_backward", "threshold", "threshold_backward",
]

# --- element functions (the shared math ones are in elementwise) ----------------------


@triton.jit
def _sigmoid(a):
    return 1.0 / (1.0 + tl.exp(-a))


@triton.jit
def _relu(a):
    # a < 0 is false for nan, so nan passes through as in torch.
    return tl.where(a < 0, 0, a)


@triton.jit
def _gelu(a):
    """``x * Phi(x)`` with erf (``tl.math.erf``, the backend's intrinsic) as torch computes
    it; the results float32 and float64 take it, half types :func:`_gelu_half`."""
    return a * 0.5 * (1.0 + tl.math.erf(a * 0.7071067811865476))


_ERFC_T = tl.constexpr(10.5)
"""Past this ``t``, ``erfc(t)`` is below float32's smallest value (2**-149): 0."""


@triton.jit
def _erfc_scaled(t):
    """``erfc(t)`` for ``0 <= t <= 10.5`` as ``exp2(t * P(t))``: one polynomial, no branch.

    P approximates ``log2(erfc(t)) / t``, a smooth function from -1.628 at 0 to -15.6 at
    10.5. Its coefficients are a least-squares fit on Chebyshev nodes of [0, 10.5],
    reweighted towards the smallest largest relative error of ``x * Phi(x)`` (1e-6 for
    |x| < 4, easing to 1e-4 where the values fall below 1e-7), rounded to float32.
    Evaluated in float32 it gives gelu to 8e-6 relative for |x| < 4 and 7e-4 beyond:
    every bfloat16 and float16 input in [-10, 10] with a normal result gets gelu to
    within one unit in the last place (torch's float32 erf does not, in the tail), for
    8 fmas and one exp2 in place of erf's two polynomials and their selects.
    """
    p = tl.math.fma(t, -3.814601612361912e-08, 2.0931231574650155e-06)
    p = tl.math.fma(p, t, -4.9616413889452815e-05)
    p = tl.math.fma(p, t, 0.0006727234576828778)
    p = tl.math.fma(p, t, -0.005854699295014143)
    p = tl.math.fma(p, t, 0.03508433327078819)
    p = tl.math.fma(p, t, -0.15358787775039673)
    p = tl.math.fma(p, t, -0.9165483713150024)
    p = tl.math.fma(p, t, -1.628144383430481)
    return tl.exp2(t * p)


@triton.jit
def _gelu_half(a):
    """gelu (erf) for half-type results, computed in float32: ``x * Phi(x)`` with
    ``Phi(x) = 1 - e / 2`` for ``x >= 0`` and ``e / 2`` below, ``e = erfc(|x| / sqrt(2))``
    (:func:`_erfc_scaled`), so the negative tail keeps its relative accuracy. Infinities,
    nan and -0.0 give what torch's does (``-inf * 0`` is nan)."""
    e = _erfc_scaled(tl.minimum(tl.abs(a) * 0.7071067811865476, _ERFC_T))
    return a * tl.where(a >= 0, tl.math.fma(e, -0.5, 1.0), 0.5 * e)


@triton.jit
def _gelu_tanh(a):
    """The tanh approximation ``x / 2 * (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``,
    computed as ``x * sigmoid(2u) = x / (1 + 2^-q)`` with ``q = 2u log2(e)``: one exp2 and
    one division, and no cancellation in ``1 + tanh(u)`` for negative ``x``. Infinities
    and nan give torch's results (``x = -inf``: ``-inf / inf`` is nan)."""
    q = a * tl.math.fma(a * a, 0.1029432395800235, 2.302208198144325)
    return a / (1.0 + tl.exp2(-q))


@triton.jit
def _silu(a):
    return a / (1.0 + tl.exp(-a))


@triton.jit
def _threshold(a, th, value):
    return tl.where(a <= th, value, a)


@triton.jit
def _sigmoid_backward(g, y):
    return g * (1.0 - y) * y


@triton.jit
def _tanh_backward(g, y):
    return g * (1.0 - y * y)


@triton.jit
def _silu_backward(g, x):
    s = 1.0 / (1.0 + tl.exp(-x))
    return g * s * (1.0 + x * (1.0 - s))


@triton.jit
def _gelu_backward(g, x):
    cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327  # 1 / sqrt(2 pi)
    return g * (cdf + x * pdf)


@triton.jit
def _gelu_tanh_backward(g, x):
    x_sq = x * x
    inner = 0.7978845608028654 * (x + 0.044715 * x_sq * x)
    t = M.tanh(inner)
    left = 0.5 * x
    right = 1.0 + t
    d_inner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x_sq)
    return g * (0.5 * right + left * (1.0 - t * t) * d_inner)


@triton.jit
def _threshold_backward(g, x, th):
    return tl.where(x <= th, 0, g)


# --- ops ------------------------------------------------------------------------------

_FLOAT_RESULTS = ("exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh")
UNARY = {name: Op(name, getattr(M, name), "p", P.INT_TO_FLOAT) for name in _FLOAT_RESULTS}
UNARY["exp"] = Op("exp", M.exp, "p", P.INT_TO_FLOAT, half_body=M.exp_half)
UNARY["sigmoid"] = Op("sigmoid", _sigmoid, "p", P.INT_TO_FLOAT)
UNARY["relu"] = Op("relu", _relu, "p", dtypes=NO_BOOL)
UNARY["silu"] = Op("silu", _silu, "p", dtypes=FLOAT_DTYPES)
GELU = {
    "none": Op("gelu", _gelu, "p", dtypes=FLOAT_DTYPES, half_body=_gelu_half),
    "tanh": Op("gelu", _gelu_tanh, "p", dtypes=FLOAT_DTYPES),
}
# torch converts threshold's scalars with a range check; threshold_backward's without.
THRESHOLD = Op("threshold", _threshold, "pvv", P.FIRST, NO_BOOL, scalars="checked")
SIGMOID_BACKWARD = Op("sigmoid_backward", _sigmoid_backward, "pp", dtypes=FLOAT_DTYPES)
TANH_BACKWARD = Op("tanh_backward", _tanh_backward, "pp", dtypes=FLOAT_DTYPES)
SILU_BACKWARD = Op("silu_backward", _silu_backward, "pp", dtypes=FLOAT_DTYPES)
GELU_BACKWARD = {
    "none": Op("gelu_backward", _gelu_backward, "pp", dtypes=FLOAT_DTYPES),
    "tanh": Op("gelu_backward", _gelu_tanh_backward, "pp", dtypes=FLOAT_DTYPES),
}
THRESHOLD_BACKWARD = Op("threshold_backward", _threshold_backward, "ppv", dtypes=NO_BOOL)


def _unary(name: str, doc: str) -> Callable[..., Tensor]:
    """The public function of ``UNARY[name]``, declared for ``name.default``, ``name.out``
    and ``name_.default``."""
    return op(f"{name}.default", out=f"{name}.out", inplace=f"{name}_.default")(
        unary_function(UNARY[name], doc))


exp = _unary("exp", "e ** self (to about 1 ulp in float32).")
log = _unary("log", "Natural logarithm.")
sqrt = _unary("sqrt", "Square root, correctly rounded.")
rsqrt = _unary("rsqrt", "1 / sqrt(self).")
reciprocal = _unary("reciprocal", "1 / self.")
sin = _unary("sin", "Sine.")
cos = _unary("cos", "Cosine.")
tanh = _unary("tanh", "Hyperbolic tangent.")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-self)).")
relu = _unary("relu", "max(self, 0); nan stays nan; integer dtypes stay integer.")
silu = _unary("silu", "self * sigmoid(self).")


@triton.jit
def _floor(a):
    return tl.floor(a)


FLOOR = Op("floor", _floor, "p", dtypes=FLOAT_DTYPES)


@op("floor.default", out="floor.out", inplace="floor_.default")
def floor(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """The largest integer not above ``self``, elementwise, in ``self``'s dtype (exact).

    Integer and bool tensors, where floor is a copy, are handed to torch, and so is an
    ``out=`` of another dtype than ``self``'s (torch raises).
    """
    own_dtype_out("floor", self.dtype, out, inplace)
    return run(FLOOR, (self,), out=out, inplace=inplace)


def _pick(table: dict[str, Op], approximate: str) -> Op:
    record = table.get(approximate)
    if record is None:
        raise Unsupported(f"approximate={approximate!r}")  # torch raises
    return record


@op("gelu.default", out="gelu.out", inplace="gelu_.default")
def gelu(self: Tensor, *, approximate: str = "none", out: Tensor | None = None,
         inplace: bool = False) -> Tensor:
    """GELU: ``x * Phi(x)`` (``"none"``, with erf) or its tanh approximation (``"tanh"``)."""
    return run(_pick(GELU, approximate), (self,), out=out, inplace=inplace)


@op("threshold.default", out="threshold.out", inplace="threshold_.default")
def threshold(self: Tensor, threshold: Number, value: Number, *, out: Tensor | None = None,
              inplace: bool = False) -> Tensor:
    """``value`` where ``self <= threshold``, else ``self``."""
    return run(THRESHOLD, (self, threshold, value), out=out, inplace=inplace)


# The backward ops' out= tensor is aten's ``grad_input``; the host functions take it as
# ``out`` (the name the declared grad_input overloads pass) or as ``grad_input``.


def _grad_input(out: Tensor | None, grad_input: Tensor | None) -> Tensor | None:
    if out is not None and grad_input is not None:
        raise TypeError("pass the output as out or as grad_input, not both")
    return grad_input if out is None else out


@op("sigmoid_backward.default", out="sigmoid_backward.grad_input")
def sigmoid_backward(grad_output: Tensor, output: Tensor, *, out: Tensor | None = None,
                     grad_input: Tensor | None = None) -> Tensor:
    """``grad_output * (1 - output) * output``, given sigmoid's output."""
    return run(SIGMOID_BACKWARD, (grad_output, output), out=_grad_input(out, grad_input))


@op("tanh_backward.default", out="tanh_backward.grad_input")
def tanh_backward(grad_output: Tensor, output: Tensor, *, out: Tensor | None = None,
                  grad_input: Tensor | None = None) -> Tensor:
    """``grad_output * (1 - output ** 2)``, given tanh's output."""
    return run(TANH_BACKWARD, (grad_output, output), out=_grad_input(out, grad_input))


@op("silu_backward.default", out="silu_backward.grad_input")
def silu_backward(grad_output: Tensor, self: Tensor, *, out: Tensor | None = None,
                  grad_input: Tensor | None = None) -> Tensor:
    """silu's gradient ``s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``, times grad_output."""
    return run(SILU_BACKWARD, (grad_output, self), out=_grad_input(out, grad_input))


@op("gelu_backward.default", out="gelu_backward.grad_input")
def gelu_backward(grad_output: Tensor, self: Tensor, *, approximate: str = "none",
                  out: Tensor | None = None, grad_input: Tensor | None = None) -> Tensor:
    """gelu's gradient at ``self`` (for either ``approximate``), times grad_output."""
    return run(_pick(GELU_BACKWARD, approximate), (grad_output, self),
               out=_grad_input(out, grad_input))


@op("threshold_backward.default", out="threshold_backward.grad_input")
def threshold_backward(grad_output: Tensor, self: Tensor, threshold: Number, *,
                       out: Tensor | None = None, grad_input: Tensor | None = None) -> Tensor:
    """``0`` where ``self <= threshold``, else ``grad_output`` (relu's backward at 0)."""
    return run(THRESHOLD_BACKWARD, (grad_output, self, threshold),
               out=_grad_input(out, grad_input))
