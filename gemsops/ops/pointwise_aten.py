"""The pointwise family's aten table: overload name -> a function taking its schema's arguments.

Every entry takes exactly the arguments of ``torch.ops.aten.<op>.<overload>._schema``:
the same names, positional or keyword-only as there, defaults where the schema has them
(the registry calls ``fn(*args, **kwargs)`` as the dispatcher passes them). The entries
only forward to the public host functions of :mod:`gemsops.ops.pointwise_arith` and
:mod:`gemsops.ops.pointwise_activation`. Overloads listed are those with a backend
kernel in torch, plus the Scalar forms of add/sub/mul/div, abs and logical_*
(CompositeExplicitAutograd: served directly they skip wrapping the number in a tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from gemsops.ops import pointwise_activation as act
from gemsops.ops import pointwise_arith as ar

__all__ = ["IMPLS"]

Fn = Callable[..., Any]
Number = bool | int | float


def _unary(name: str, fn: Fn, fn_: Fn, out: bool = True) -> dict[str, Fn]:
    def functional(self: Tensor) -> Tensor:
        return fn(self)

    def inplace(self: Tensor) -> Tensor:
        return fn_(self)

    def out_variant(self: Tensor, *, out: Tensor) -> Tensor:
        return fn(self, out=out)

    table: dict[str, Fn] = {f"{name}.default": functional, f"{name}_.default": inplace}
    if out:
        table[f"{name}.out"] = out_variant
    return table


def _binary(fn: Fn, fn_: Fn | None, functional: tuple[str, ...], inplace: tuple[str, ...],
            outs: tuple[str, ...]) -> dict[str, Fn]:
    def plain(self: Tensor, other: Any) -> Tensor:
        return fn(self, other)

    def in_place(self: Tensor, other: Any) -> Tensor:
        assert fn_ is not None
        return fn_(self, other)

    def out_variant(self: Tensor, other: Any, *, out: Tensor) -> Tensor:
        return fn(self, other, out=out)

    return {**dict.fromkeys(functional, plain), **dict.fromkeys(inplace, in_place),
            **dict.fromkeys(outs, out_variant)}


def _add_like(name: str, fn: Fn, fn_: Fn) -> dict[str, Fn]:
    def tensor(self: Tensor, other: Tensor, *, alpha: Number = 1) -> Tensor:
        return fn(self, other, alpha=alpha)

    def tensor_(self: Tensor, other: Tensor, *, alpha: Number = 1) -> Tensor:
        return fn_(self, other, alpha=alpha)

    def out_variant(self: Tensor, other: Tensor, *, alpha: Number = 1, out: Tensor) -> Tensor:
        return fn(self, other, alpha=alpha, out=out)

    def scalar(self: Tensor, other: Number, alpha: Number = 1) -> Tensor:
        return fn(self, other, alpha=alpha)

    def scalar_(self: Tensor, other: Number, alpha: Number = 1) -> Tensor:
        return fn_(self, other, alpha=alpha)

    return {f"{name}.Tensor": tensor, f"{name}_.Tensor": tensor_, f"{name}.out": out_variant,
            f"{name}.Scalar": scalar, f"{name}_.Scalar": scalar_}


def _rsub_tensor(self: Tensor, other: Tensor, *, alpha: Number = 1) -> Tensor:
    return ar.rsub(self, other, alpha=alpha)


def _rsub_scalar(self: Tensor, other: Number, alpha: Number = 1) -> Tensor:
    return ar.rsub(self, other, alpha=alpha)


def _div_mode(self: Tensor, other: Any, *, rounding_mode: str | None) -> Tensor:
    return ar.div(self, other, rounding_mode=rounding_mode)


def _div_mode_(self: Tensor, other: Any, *, rounding_mode: str | None) -> Tensor:
    return ar.div_(self, other, rounding_mode=rounding_mode)


def _div_mode_out(self: Tensor, other: Tensor, *, rounding_mode: str | None,
                  out: Tensor) -> Tensor:
    return ar.div(self, other, rounding_mode=rounding_mode, out=out)


def _pow(self: Any, exponent: Any) -> Tensor:
    return ar.pow(self, exponent)


def _pow_(self: Tensor, exponent: Any) -> Tensor:
    return ar.pow_(self, exponent)


def _pow_out(self: Any, exponent: Any, *, out: Tensor) -> Tensor:
    return ar.pow(self, exponent, out=out)


def _clamp(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return ar.clamp(self, min, max)


def _clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return ar.clamp_(self, min, max)


def _clamp_out(self: Tensor, min: Any = None, max: Any = None, *,
               out: Tensor) -> Tensor:
    return ar.clamp(self, min, max, out=out)


def _clamp_min(self: Tensor, min: Any) -> Tensor:
    return ar.clamp_min(self, min)


def _clamp_min_(self: Tensor, min: Any) -> Tensor:
    return ar.clamp_min_(self, min)


def _clamp_min_out(self: Tensor, min: Any, *, out: Tensor) -> Tensor:
    return ar.clamp_min(self, min, out=out)


def _clamp_max(self: Tensor, max: Any) -> Tensor:
    return ar.clamp_max(self, max)


def _clamp_max_(self: Tensor, max: Any) -> Tensor:
    return ar.clamp_max_(self, max)


def _clamp_max_out(self: Tensor, max: Any, *, out: Tensor) -> Tensor:
    return ar.clamp_max(self, max, out=out)


def _where(condition: Tensor, self: Tensor, other: Tensor) -> Tensor:
    return ar.where(condition, self, other)


def _where_out(condition: Tensor, self: Tensor, other: Tensor, *, out: Tensor) -> Tensor:
    return ar.where(condition, self, other, out=out)


def _masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
    return ar.masked_fill(self, mask, value)


def _masked_fill_(self: Tensor, mask: Tensor, value: Any) -> Tensor:
    return ar.masked_fill_(self, mask, value)


def _gelu(self: Tensor, *, approximate: str = "none") -> Tensor:
    return act.gelu(self, approximate=approximate)


def _gelu_(self: Tensor, *, approximate: str = "none") -> Tensor:
    return act.gelu_(self, approximate=approximate)


def _gelu_out(self: Tensor, *, approximate: str = "none", out: Tensor) -> Tensor:
    return act.gelu(self, approximate=approximate, out=out)


def _threshold(self: Tensor, threshold: Number, value: Number) -> Tensor:
    return act.threshold(self, threshold, value)


def _threshold_(self: Tensor, threshold: Number, value: Number) -> Tensor:
    return act.threshold_(self, threshold, value)


def _threshold_out(self: Tensor, threshold: Number, value: Number, *, out: Tensor) -> Tensor:
    return act.threshold(self, threshold, value, out=out)


def _output_backward(fn: Fn) -> tuple[Fn, Fn]:
    """Entries for ``(grad_output, output)`` backward ops (sigmoid, tanh)."""

    def functional(grad_output: Tensor, output: Tensor) -> Tensor:
        return fn(grad_output, output)

    def out_variant(grad_output: Tensor, output: Tensor, *, grad_input: Tensor) -> Tensor:
        return fn(grad_output, output, grad_input=grad_input)

    return functional, out_variant


def _silu_backward(grad_output: Tensor, self: Tensor) -> Tensor:
    return act.silu_backward(grad_output, self)


def _silu_backward_out(grad_output: Tensor, self: Tensor, *, grad_input: Tensor) -> Tensor:
    return act.silu_backward(grad_output, self, grad_input=grad_input)


def _gelu_backward(grad_output: Tensor, self: Tensor, *, approximate: str = "none") -> Tensor:
    return act.gelu_backward(grad_output, self, approximate=approximate)


def _gelu_backward_out(grad_output: Tensor, self: Tensor, *, approximate: str = "none",
                       grad_input: Tensor) -> Tensor:
    return act.gelu_backward(grad_output, self, approximate=approximate, grad_input=grad_input)


def _threshold_backward(grad_output: Tensor, self: Tensor, threshold: Number) -> Tensor:
    return act.threshold_backward(grad_output, self, threshold)


def _threshold_backward_out(grad_output: Tensor, self: Tensor, threshold: Number, *,
                            grad_input: Tensor) -> Tensor:
    return act.threshold_backward(grad_output, self, threshold, grad_input=grad_input)


def _table() -> dict[str, Fn]:
    table: dict[str, Fn] = {
        **_add_like("add", ar.add, ar.add_),
        **_add_like("sub", ar.sub, ar.sub_),
        "rsub.Tensor": _rsub_tensor,
        "rsub.Scalar": _rsub_scalar,
        **_binary(ar.mul, ar.mul_, ("mul.Tensor", "mul.Scalar"), ("mul_.Tensor", "mul_.Scalar"),
                  ("mul.out",)),
        **_binary(ar.div, ar.div_, ("div.Tensor", "div.Scalar"), ("div_.Tensor", "div_.Scalar"),
                  ("div.out",)),
        "div.Tensor_mode": _div_mode, "div.Scalar_mode": _div_mode,
        "div_.Tensor_mode": _div_mode_, "div_.Scalar_mode": _div_mode_,
        "div.out_mode": _div_mode_out,
        **dict.fromkeys(("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar"), _pow),
        **dict.fromkeys(("pow_.Tensor", "pow_.Scalar"), _pow_),
        **dict.fromkeys(("pow.Tensor_Tensor_out", "pow.Tensor_Scalar_out", "pow.Scalar_out"),
                        _pow_out),
        **_unary("neg", ar.neg, ar.neg_),
        **_unary("abs", ar.abs, ar.abs_),
        **_unary("sign", ar.sign, ar.sign_),
        **_unary("sgn", ar.sign, ar.sign_),
        **_unary("logical_not", ar.logical_not, ar.logical_not_),
        **_binary(ar.maximum, None, ("maximum.default",), (), ("maximum.out",)),
        **_binary(ar.minimum, None, ("minimum.default",), (), ("minimum.out",)),
        "where.self": _where,
        "where.self_out": _where_out,
        "masked_fill.Scalar": _masked_fill, "masked_fill.Tensor": _masked_fill,
        "masked_fill_.Scalar": _masked_fill_, "masked_fill_.Tensor": _masked_fill_,
        "gelu.default": _gelu, "gelu_.default": _gelu_, "gelu.out": _gelu_out,
        "threshold.default": _threshold, "threshold_.default": _threshold_,
        "threshold.out": _threshold_out,
        "silu_backward.default": _silu_backward,
        "silu_backward.grad_input": _silu_backward_out,
        "gelu_backward.default": _gelu_backward,
        "gelu_backward.grad_input": _gelu_backward_out,
        "threshold_backward.default": _threshold_backward,
        "threshold_backward.grad_input": _threshold_backward_out,
    }
    for kind, out in (("default", "out"), ("Tensor", "Tensor_out")):
        table.update({
            f"clamp.{kind}": _clamp, f"clamp_.{kind}": _clamp_, f"clamp.{out}": _clamp_out,
            f"clamp_min.{kind}": _clamp_min, f"clamp_min_.{kind}": _clamp_min_,
            f"clamp_min.{out}": _clamp_min_out, f"clamp_max.{kind}": _clamp_max,
            f"clamp_max_.{kind}": _clamp_max_, f"clamp_max.{out}": _clamp_max_out,
        })
    for name in ("logical_and", "logical_or"):
        fn, fn_ = getattr(ar, name), getattr(ar, name + "_")
        table.update(_binary(fn, fn_, (f"{name}.default",), (f"{name}_.default",),
                             (f"{name}.out",)))
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        fn, fn_ = getattr(ar, name), getattr(ar, name + "_")
        table.update(_binary(fn, fn_, (f"{name}.Tensor", f"{name}.Scalar"),
                             (f"{name}_.Tensor", f"{name}_.Scalar"),
                             (f"{name}.Tensor_out", f"{name}.Scalar_out")))
    for name in ("exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid",
                 "relu", "silu"):
        table.update(_unary(name, getattr(act, name), getattr(act, name + "_")))
    for name, fn in (("sigmoid_backward", act.sigmoid_backward),
                     ("tanh_backward", act.tanh_backward)):
        functional, out_variant = _output_backward(fn)
        table.update({f"{name}.default": functional, f"{name}.grad_input": out_variant})
    return table


IMPLS: dict[str, Fn] = _table()
