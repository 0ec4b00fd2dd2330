"""The pointwise family: its public host functions and its aten table, in one namespace.

The family is written once. An op is data — an element function
(:mod:`~gemsops.ops.pointwise_math`), operand roles and a promotion kind
(:mod:`~gemsops.ops.pointwise_iterator`, which also does torch's host-side work:
promotion, broadcasting, scalars, out= and in-place checks) — run through two kernel
templates (:mod:`~gemsops.ops.pointwise_codegen`). The host functions live in
:mod:`~gemsops.ops.pointwise_arith` (arithmetic, comparisons, selection) and
:mod:`~gemsops.ops.pointwise_activation` (math functions, activations, their backward
ops); :mod:`~gemsops.ops.pointwise_aten` maps aten overloads onto them.
"""

from __future__ import annotations

from gemsops.ops.pointwise_activation import cos as cos
from gemsops.ops.pointwise_activation import cos_ as cos_
from gemsops.ops.pointwise_activation import exp as exp
from gemsops.ops.pointwise_activation import exp_ as exp_
from gemsops.ops.pointwise_activation import gelu as gelu
from gemsops.ops.pointwise_activation import gelu_ as gelu_
from gemsops.ops.pointwise_activation import gelu_backward as gelu_backward
from gemsops.ops.pointwise_activation import log as log
from gemsops.ops.pointwise_activation import log_ as log_
from gemsops.ops.pointwise_activation import reciprocal as reciprocal
from gemsops.ops.pointwise_activation import reciprocal_ as reciprocal_
from gemsops.ops.pointwise_activation import relu as relu
from gemsops.ops.pointwise_activation import relu_ as relu_
from gemsops.ops.pointwise_activation import rsqrt as rsqrt
from gemsops.ops.pointwise_activation import rsqrt_ as rsqrt_
from gemsops.ops.pointwise_activation import sigmoid as sigmoid
from gemsops.ops.pointwise_activation import sigmoid_ as sigmoid_
from gemsops.ops.pointwise_activation import sigmoid_backward as sigmoid_backward
from gemsops.ops.pointwise_activation import silu as silu
from gemsops.ops.pointwise_activation import silu_ as silu_
from gemsops.ops.pointwise_activation import silu_backward as silu_backward
from gemsops.ops.pointwise_activation import sin as sin
from gemsops.ops.pointwise_activation import sin_ as sin_
from gemsops.ops.pointwise_activation import sqrt as sqrt
from gemsops.ops.pointwise_activation import sqrt_ as sqrt_
from gemsops.ops.pointwise_activation import tanh as tanh
from gemsops.ops.pointwise_activation import tanh_ as tanh_
from gemsops.ops.pointwise_activation import tanh_backward as tanh_backward
from gemsops.ops.pointwise_activation import threshold as threshold
from gemsops.ops.pointwise_activation import threshold_ as threshold_
from gemsops.ops.pointwise_activation import threshold_backward as threshold_backward
from gemsops.ops.pointwise_arith import abs as abs
from gemsops.ops.pointwise_arith import abs_ as abs_
from gemsops.ops.pointwise_arith import add as add
from gemsops.ops.pointwise_arith import add_ as add_
from gemsops.ops.pointwise_arith import clamp as clamp
from gemsops.ops.pointwise_arith import clamp_ as clamp_
from gemsops.ops.pointwise_arith import clamp_max as clamp_max
from gemsops.ops.pointwise_arith import clamp_max_ as clamp_max_
from gemsops.ops.pointwise_arith import clamp_min as clamp_min
from gemsops.ops.pointwise_arith import clamp_min_ as clamp_min_
from gemsops.ops.pointwise_arith import div as div
from gemsops.ops.pointwise_arith import div_ as div_
from gemsops.ops.pointwise_arith import eq as eq
from gemsops.ops.pointwise_arith import eq_ as eq_
from gemsops.ops.pointwise_arith import ge as ge
from gemsops.ops.pointwise_arith import ge_ as ge_
from gemsops.ops.pointwise_arith import gt as gt
from gemsops.ops.pointwise_arith import gt_ as gt_
from gemsops.ops.pointwise_arith import le as le
from gemsops.ops.pointwise_arith import le_ as le_
from gemsops.ops.pointwise_arith import logical_and as logical_and
from gemsops.ops.pointwise_arith import logical_and_ as logical_and_
from gemsops.ops.pointwise_arith import logical_not as logical_not
from gemsops.ops.pointwise_arith import logical_not_ as logical_not_
from gemsops.ops.pointwise_arith import logical_or as logical_or
from gemsops.ops.pointwise_arith import logical_or_ as logical_or_
from gemsops.ops.pointwise_arith import lt as lt
from gemsops.ops.pointwise_arith import lt_ as lt_
from gemsops.ops.pointwise_arith import masked_fill as masked_fill
from gemsops.ops.pointwise_arith import masked_fill_ as masked_fill_
from gemsops.ops.pointwise_arith import maximum as maximum
from gemsops.ops.pointwise_arith import minimum as minimum
from gemsops.ops.pointwise_arith import mul as mul
from gemsops.ops.pointwise_arith import mul_ as mul_
from gemsops.ops.pointwise_arith import ne as ne
from gemsops.ops.pointwise_arith import ne_ as ne_
from gemsops.ops.pointwise_arith import neg as neg
from gemsops.ops.pointwise_arith import neg_ as neg_
from gemsops.ops.pointwise_arith import pow as pow
from gemsops.ops.pointwise_arith import pow_ as pow_
from gemsops.ops.pointwise_arith import rsub as rsub
from gemsops.ops.pointwise_arith import sign as sign
from gemsops.ops.pointwise_arith import sign_ as sign_
from gemsops.ops.pointwise_arith import sub as sub
from gemsops.ops.pointwise_arith import sub_ as sub_
from gemsops.ops.pointwise_arith import where as where
from gemsops.ops.pointwise_aten import IMPLS as IMPLS

__all__ = [
    "IMPLS", "abs", "abs_", "add", "add_", "clamp", "clamp_", "clamp_max", "clamp_max_",
    "clamp_min", "clamp_min_", "cos", "cos_", "div", "div_", "eq", "eq_", "exp", "exp_", "ge",
    "ge_", "gelu", "gelu_", "gelu_backward", "gt", "gt_", "le", "le_", "log", "log_",
    "logical_and", "logical_and_", "logical_not", "logical_not_", "logical_or", "logical_or_",
    "lt", "lt_", "masked_fill", "masked_fill_", "maximum", "minimum", "mul", "mul_", "ne",
    "ne_", "neg", "neg_", "pow", "pow_", "reciprocal", "reciprocal_", "relu", "relu_", "rsqrt",
    "rsqrt_", "rsub", "sigmoid", "sigmoid_", "sigmoid_backward", "sign", "sign_", "silu",
    "silu_", "silu_backward", "sin", "sin_", "sqrt", "sqrt_", "sub", "sub_", "tanh", "tanh_",
    "tanh_backward", "threshold", "threshold_", "threshold_backward", "where",
]
