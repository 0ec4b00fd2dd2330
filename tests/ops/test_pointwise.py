"""Property tests of the pointwise family against torch (float64 on the CPU where it rounds).

Each op is drawn over shapes (0-size, 1-element, odd, rank 0-4), transposed and sliced
layouts, broadcasting pairs, dtype mixes (half, float, int, bool), Python scalars and
special values (inf, nan, -0.0, huge, tiny). Values are compared with the float64
reference through the shared tolerance table; dtypes and shapes must equal torch's own.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import gemshal
from gemsops import declare, registry
from gemsops.errors import Unsupported
from gemsops.ops.pointwise import activation as act
from gemsops.ops.pointwise import arith as pw
from gemsops.ops.pointwise.iterator import run
from gemsops.ops.pointwise.types import overflows
from gemsops.testing.reference import reference
from gemsops.testing.strategies import (
    FLOAT_DTYPES,
    INT_DTYPES,
    broadcast_pair,
    shapes,
    target_device,
)
from gemsops.testing.strategies import tensors as _tensors
from gemsops.testing.tolerance import assert_close

F = torch.nn.functional
SERVED = sorted(o for d in declare.declarations()
                if d.module.startswith("gemsops.ops.pointwise.") for o in d.served)
"""Every aten overload the pointwise family declares (its modules are imported above)."""


def impl(overload: str) -> Callable[..., Any]:
    """The function the registry serves ``overload`` with (the declaration, bound to the
    overload's schema; out= and in-place overloads derived)."""
    return registry.implementations()[overload]


# nan and inf inputs make numpy (under the interpreter) warn; the values are what count.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
HALF_AND_FLOAT = (*FLOAT_DTYPES, torch.float64)
NUMERIC = (*HALF_AND_FLOAT, *INT_DTYPES, torch.int8, torch.uint8)
EVERY = (*NUMERIC, torch.bool)


@st.composite
def tensors(draw: st.DrawFn, *, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
            **kwargs: Any) -> torch.Tensor:
    """The shared strategy, plus uint8 (drawn as int16, wrapped)."""
    dtype = draw(st.sampled_from(dtypes))
    if dtype == torch.uint8:
        return draw(_tensors(dtypes=(torch.int16,), **kwargs)).to(torch.uint8)
    return draw(_tensors(dtypes=(dtype,), **kwargs))


def check(actual: torch.Tensor, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``actual`` has torch's dtype and shape for ``fn(*args)``, the float64 reference's values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = fn(*args, **kwargs)
        expected = reference(fn, *args, **kwargs)
    assert actual.dtype == native.dtype, (actual.dtype, native.dtype)
    assert actual.shape == native.shape, (actual.shape, native.shape)
    if not actual.dtype.is_floating_point:
        # Exact results (integers, bools): torch's own is the spec; a comparison of a
        # float16 tensor with the scalar 1e30 compares with float16(1e30) = inf.
        torch.testing.assert_close(actual.cpu(), native.cpu(), rtol=0, atol=0)
        return
    if actual.numel():
        # Where torch's own kernel overflows in its dtype (gelu_backward(1e30) is nan in
        # float32, finite in float64), the spec is torch's result, not the reference's.
        native = native.detach().cpu()
        overflow = ~torch.isfinite(native) & torch.isfinite(expected.to(native.dtype))
        if overflow.any():
            torch.testing.assert_close(actual.cpu()[overflow], native[overflow], equal_nan=True)
            expected = torch.where(overflow, actual.cpu().to(expected.dtype), expected)
    assert_close(actual, expected)


def torch_accepts(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return False
    return True


@st.composite
def operand_pairs(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = EVERY,
                  specials: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of independently drawn dtypes and layouts whose shapes broadcast."""
    sa, sb = draw(broadcast_pair())
    a = draw(tensors(shape=sa, dtypes=dtypes, specials=specials))
    b = draw(tensors(shape=sb, dtypes=dtypes, specials=specials))
    return a, b


scalars = st.one_of(
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.5, -2.25, 0.0, -0.0, 1e30, float("inf"), float("nan"), 3.0]),
)

UNARY: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]] = {
    "exp": (act.exp, torch.exp), "log": (act.log, torch.log), "sqrt": (act.sqrt, torch.sqrt),
    "rsqrt": (act.rsqrt, torch.rsqrt), "reciprocal": (act.reciprocal, torch.reciprocal),
    "sin": (act.sin, torch.sin), "cos": (act.cos, torch.cos), "tanh": (act.tanh, torch.tanh),
    "sigmoid": (act.sigmoid, torch.sigmoid), "relu": (act.relu, torch.relu),
    "silu": (act.silu, F.silu), "gelu": (act.gelu, F.gelu),
    "gelu_tanh": (lambda x, **k: act.gelu(x, approximate="tanh", **k),
                  lambda x, **k: F.gelu(x, approximate="tanh", **k)),
    "neg": (pw.neg, torch.neg), "abs": (pw.abs, torch.abs), "sign": (pw.sign, torch.sign),
    "logical_not": (pw.logical_not, torch.logical_not),
    "floor": (act.floor, torch.floor),
    "bitwise_not": (pw.bitwise_not, torch.bitwise_not),
}


# Inputs gemsops hands to torch's own kernel by design: torch's CUDA abs takes bool (an
# identity), its CPU abs refuses it; the registry passes the call on, so the user gets
# whichever torch does on the device.
HANDED_BACK = {("abs", torch.bool)} | {("floor", dtype) for dtype in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary(name: str, data: st.DataObject) -> None:
    """Each unary op matches torch on every dtype torch takes, special values and layouts too."""
    ours, theirs = UNARY[name]
    x = data.draw(tensors(dtypes=EVERY, specials=True))
    if not torch_accepts(theirs, x) or (name, x.dtype) in HANDED_BACK:
        with pytest.raises(Unsupported):
            ours(x)
        return
    check(ours(x), theirs, x)


BINARY: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]] = {
    "add": (pw.add, torch.add), "sub": (pw.sub, torch.sub), "mul": (pw.mul, torch.mul),
    "div": (pw.div, torch.div), "maximum": (pw.maximum, torch.maximum),
    "minimum": (pw.minimum, torch.minimum), "eq": (pw.eq, torch.eq), "ne": (pw.ne, torch.ne),
    "lt": (pw.lt, torch.lt), "le": (pw.le, torch.le), "gt": (pw.gt, torch.gt),
    "ge": (pw.ge, torch.ge), "logical_and": (pw.logical_and, torch.logical_and),
    "logical_or": (pw.logical_or, torch.logical_or), "pow": (pw.pow, torch.pow),
    "bitwise_and": (pw.bitwise_and, torch.bitwise_and),
    "bitwise_or": (pw.bitwise_or, torch.bitwise_or),
    "bitwise_xor": (pw.bitwise_xor, torch.bitwise_xor),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(pair=operand_pairs())
def test_binary_broadcast_promotion(name: str, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Binary ops broadcast, promote mixed dtypes as torch does, and match its values."""
    ours, theirs = BINARY[name]
    a, b = pair
    if not torch_accepts(theirs, a, b):
        with pytest.raises(Unsupported):
            ours(a, b)
        return
    check(ours(a, b), theirs, a, b)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "eq", "lt", "ge", "pow", "maximum"])
@given(x=tensors(dtypes=EVERY, specials=True), value=scalars, swap=st.booleans())
def test_python_scalars(name: str, x: torch.Tensor, value: Any, swap: bool) -> None:
    """A Python number promotes weakly (int tensor + 2.5 is float32) and computes as in torch."""
    ours, theirs = BINARY[name]
    if name == "maximum":  # no Scalar overload in torch: a 0-dim tensor of the number
        value = torch.tensor(value)
    args = (value, x) if swap and name in ("pow", "mul", "add") else (x, value)
    if name == "pow" and swap and isinstance(value, torch.Tensor):
        return
    if not torch_accepts(theirs, *args):
        with pytest.raises(Unsupported):
            ours(*args)
        return
    check(ours(*args), theirs, *args)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@given(pair=operand_pairs(dtypes=NUMERIC))
def test_div_rounding(mode: str, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """div with rounding_mode gives torch's or the exact answer for floats (inf, nan, -0.0),
    and torch's for signed integers."""
    a, b = pair
    if not b.dtype.is_floating_point:
        b = torch.where(b == 0, torch.ones_like(b), b)  # integer division by zero raises in torch
    actual = pw.div(a, b, rounding_mode=mode)
    if actual.dtype.is_floating_point and actual.numel():
        # Rounding is not continuous: where torch's kernel rounds the quotient in the half
        # type before truncating, its integer differs from the float64 reference's by one.
        # Each element must be torch's own or the reference's.
        native = torch.div(a, b, rounding_mode=mode).cpu()
        expected = reference(torch.div, a, b, rounding_mode=mode).to(actual.dtype)
        got = actual.cpu()
        same = (got == native) | (got == expected) | (got.isnan() & native.isnan())
        assert bool(same.all()), (got[~same], native[~same], expected[~same])
        assert actual.dtype == native.dtype and actual.shape == native.shape
        return
    check(actual, torch.div, a, b, rounding_mode=mode)


def test_div_floor_near_integer_quotients() -> None:
    """Floor division whose quotient rounds onto an integer (6 / 0.1f) still floors (exact fmod)."""
    dev = target_device()
    for dtype in (torch.float32, torch.float64):
        a = torch.tensor([6.0, -6.0, 1.0, 0.3, 1e30, 7.0, 5.0], dtype=dtype, device=dev)
        b = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, math.inf, -3.0], dtype=dtype, device=dev)
        expected = torch.div(a.cpu(), b.cpu(), rounding_mode="floor")
        torch.testing.assert_close(pw.div(a, b, rounding_mode="floor").cpu(), expected,
                                   rtol=0, atol=0)


def test_div_trunc_half_quotient_near_an_integer() -> None:
    """A float16 quotient just below an integer truncates as torch does: rounded first.

    2.998046875 / 0.99951171875 is 2.99951... in float32 and 3.0 once rounded to
    float16; torch's CUDA kernel and its vectorised CPU loop truncate the latter.
    """
    dev = target_device()
    a = torch.tensor([2.998046875, -2.998046875, 7.0], dtype=torch.float16, device=dev)
    b = torch.tensor([0.99951171875, 0.99951171875, 2.0], dtype=torch.float16, device=dev)
    expected = torch.div(a, b, rounding_mode="trunc")
    assert expected.tolist() == [3.0, -3.0, 3.0]  # the case this test is about
    torch.testing.assert_close(pw.div(a, b, rounding_mode="trunc"), expected, rtol=0, atol=0)
    x = torch.tensor([0.3, 6.0, -6.0, 1e4, 2.998046875], dtype=torch.float32, device=dev)
    for divisor in (0.1, torch.tensor(0.1, dtype=torch.float64), 0.99951171875):  # host scalars
        for dtype in (torch.float32, torch.float16):
            torch.testing.assert_close(pw.div(x.to(dtype), divisor, rounding_mode="trunc"),
                                       torch.div(x.to(dtype), divisor, rounding_mode="trunc"),
                                       rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@given(pair=operand_pairs(dtypes=(torch.float32,)))
def test_div_trunc_bodies_round_as_torchs_kernels(
        dtype: torch.dtype, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Half types give trunc(round(a / b)); the CUDA scalar body gives trunc(a * (1 / b)).

    Checked on any device against those formulas written in torch, so the interpreter
    tests the body the H200 runs for a scalar divisor (a 0-d CPU tensor), and there the
    interpreter's own answer is torch's CPU kernel's. The values come from torch's RNG,
    so any of them may be drawn: a quotient next to a half-type rounding boundary tells
    the bodies apart.
    """
    a, b = (x.to(dtype) for x in pair)
    if b.dim() == 0 and b.device.type == "cpu":
        # A host scalar divisor: torch's CUDA kernel multiplies by the reciprocal (that
        # body, checked directly), and the interpreter follows torch's CPU kernel.
        recip = torch.trunc(a.float() * (1.0 / b.float())).to(dtype)
        torch.testing.assert_close(run(pw.DIV_TRUNC_RECIPROCAL, (a, b)), recip,
                                   rtol=0, atol=0, equal_nan=True)
        if a.device.type == "cpu":
            torch.testing.assert_close(pw.div(a, b, rounding_mode="trunc"),
                                       torch.div(a, b, rounding_mode="trunc"),
                                       rtol=0, atol=0, equal_nan=True)
        return
    expected = torch.trunc((a.float() / b.float()).to(dtype).float()).to(dtype)
    torch.testing.assert_close(pw.div(a, b, rounding_mode="trunc"), expected,
                               rtol=0, atol=0, equal_nan=True)
    inv = 1.0 / torch.tensor(0.3, dtype=torch.float32)
    expected = torch.trunc(a.float() * inv.to(a.device)).to(dtype)
    torch.testing.assert_close(run(pw.DIV_TRUNC_RECIPROCAL, (a, 0.3)), expected,
                               rtol=0, atol=0, equal_nan=True)


@given(x=tensors(dtypes=(torch.int32, torch.int64, torch.int8, torch.uint8)),
       e=st.integers(-3, 9))
@settings(max_examples=10)
def test_pow_integers(x: torch.Tensor, e: int) -> None:
    """Integer pow wraps like torch; negative scalar exponents of integers are refused."""
    if e < 0:
        with pytest.raises(Unsupported):
            pw.pow(x, e)
        return
    check(pw.pow(x, e), torch.pow, x, e)
    check(pw.pow(x, x.abs() % 5), torch.pow, x, x.abs() % 5)


@given(x=tensors(dtypes=HALF_AND_FLOAT, specials=True),
       e=st.sampled_from([0, 1, 2, 3, 0.5, -0.5, -1, -2, 2.5, -1.5, 0.0, math.inf, math.nan]))
def test_pow_scalar_exponents(x: torch.Tensor, e: float) -> None:
    """pow(x, e) takes torch's special cases (e=0 fills 1, 0.5 is sqrt so (-inf)**0.5 is nan)."""
    check(pw.pow(x, e), torch.pow, x, e)
    check(pw.pow(2.0, x), torch.pow, 2.0, x)
    check(pw.pow(1, x), torch.pow, 1, x)


@given(x=tensors(dtypes=NUMERIC, specials=True), lo=scalars, hi=scalars,
       which=st.sampled_from(["both", "min", "max"]))
def test_clamp_scalars(x: torch.Tensor, lo: Any, hi: Any, which: str) -> None:
    """clamp with scalar bounds promotes like torch and propagates nan from input and bounds."""
    lo, hi = (None if which == "max" else lo), (None if which == "min" else hi)
    if not torch_accepts(torch.clamp, x, lo, hi):
        with pytest.raises(Unsupported):
            pw.clamp(x, lo, hi)
        return
    result = torch.clamp(x, lo, hi).dtype
    nan_bound = any(isinstance(v, float) and v != v for v in (lo, hi))
    if x.device.type != "cpu" and (any(
            v is not None and overflows(v, result) for v in (lo, hi))
            or nan_bound):
        # torch's CUDA kernel converts the bounds to its wider compute type, its CPU kernel
        # refuses a bound the tensor's dtype cannot hold; gemsops hands such bounds back,
        # and a nan bound (nan on the CPU, the input on CUDA).
        with pytest.raises(Unsupported):
            pw.clamp(x, lo, hi)
        return
    check(pw.clamp(x, lo, hi), torch.clamp, x, lo, hi)


@given(pair=operand_pairs(dtypes=HALF_AND_FLOAT), data=st.data())
def test_clamp_tensors(pair: tuple[torch.Tensor, torch.Tensor], data: st.DataObject) -> None:
    """clamp with tensor bounds broadcasts all three operands."""
    x, lo = pair
    hi = data.draw(tensors(shape=lo.shape, dtypes=(lo.dtype,)))
    check(pw.clamp(x, lo, hi), torch.clamp, x, lo, hi)
    check(pw.clamp_min(x, lo), torch.clamp_min, x, lo)
    check(pw.clamp_max(x, hi), torch.clamp_max, x, hi)


@given(pair=operand_pairs(dtypes=EVERY), data=st.data())
def test_where(pair: tuple[torch.Tensor, torch.Tensor], data: st.DataObject) -> None:
    """where(cond, a, b) broadcasts three ways and promotes a and b."""
    a, b = pair
    shape = torch.broadcast_shapes(a.shape, b.shape)
    cond = data.draw(tensors(shape=shape[data.draw(st.integers(0, len(shape))):],
                             dtypes=(torch.bool,)))
    check(pw.where(cond, a, b), torch.where, cond, a, b)
    check(pw.where(cond, a, 2.5), torch.where, cond, a, 2.5)


@given(x=tensors(dtypes=EVERY, specials=True), data=st.data(), value=scalars)
def test_masked_fill(x: torch.Tensor, data: st.DataObject, value: Any) -> None:
    """masked_fill keeps self's dtype, converting the value as torch does (2.7 -> 2 for ints)."""
    mask = data.draw(tensors(shape=x.shape[data.draw(st.integers(0, x.dim())):],
                             dtypes=(torch.bool,)))
    if not torch_accepts(torch.masked_fill, x, mask, value):
        with pytest.raises(Unsupported):
            pw.masked_fill(x, mask, value)
        return
    check(pw.masked_fill(x, mask, value), torch.masked_fill, x, mask, value)
    check(pw.masked_fill(x, mask, torch.tensor(value)), torch.masked_fill, x, mask,
          torch.tensor(value))


@given(x=tensors(dtypes=NUMERIC, specials=True), th=st.sampled_from([0, 0.5, -1]),
       value=st.sampled_from([0, 2, -0.5]))
def test_threshold(x: torch.Tensor, th: float, value: float) -> None:
    """threshold(x, th, v) is v where x <= th (nan stays)."""
    if not torch_accepts(F.threshold, x, th, value):
        return
    check(act.threshold(x, th, value), F.threshold, x, th, value)


BACKWARD = {
    "sigmoid_backward": (act.sigmoid_backward, torch.ops.aten.sigmoid_backward),
    "tanh_backward": (act.tanh_backward, torch.ops.aten.tanh_backward),
    "silu_backward": (act.silu_backward, torch.ops.aten.silu_backward),
    "gelu_backward": (act.gelu_backward, torch.ops.aten.gelu_backward),
    "gelu_backward_tanh": (lambda g, x: act.gelu_backward(g, x, approximate="tanh"),
                           lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh")),
    "threshold_backward": (lambda g, x: act.threshold_backward(g, x, 0.25),
                           lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.25)),
}


@pytest.mark.parametrize("name", sorted(BACKWARD))
@given(data=st.data())
def test_backward_ops(name: str, data: st.DataObject) -> None:
    """The backward ops autograd calls match aten's, special values included."""
    ours, theirs = BACKWARD[name]
    x = data.draw(tensors(dtypes=HALF_AND_FLOAT, specials=True))
    g = data.draw(tensors(shape=x.shape, dtypes=(x.dtype,)))
    check(ours(g, x), theirs, g, x)


def test_backward_ops_take_out_or_grad_input() -> None:
    """A backward op writes into ``out`` or, by aten's name, ``grad_input``; not both."""
    with torch.device(target_device()):
        g, y = torch.randn(5), torch.rand(5)
        expected = torch.ops.aten.sigmoid_backward(g, y)
        for kwarg in ("out", "grad_input"):
            buf = torch.empty(5)
            assert act.sigmoid_backward(g, y, **{kwarg: buf}) is buf
            assert_close(buf, expected)
        with pytest.raises(TypeError):
            act.sigmoid_backward(g, y, out=torch.empty(5), grad_input=torch.empty(5))


@pytest.mark.parametrize("name", ["add", "mul", "div", "eq", "maximum", "pow"])
@given(pair=operand_pairs(dtypes=NUMERIC), out_dtype=st.sampled_from((*NUMERIC, torch.bool)),
       empty=st.booleans())
def test_out_variants(name: str, pair: tuple[torch.Tensor, torch.Tensor],
                      out_dtype: torch.dtype, empty: bool) -> None:
    """out= resizes an empty out, casts to its dtype, refuses a dtype the result cannot cast to."""
    ours, theirs = BINARY[name]
    a, b = pair
    shape = torch.broadcast_shapes(a.shape, b.shape)
    out = torch.empty(0 if empty else shape, dtype=out_dtype)
    if not torch_accepts(theirs, a, b, out=out.clone()):
        before = out.clone()
        with pytest.raises(Unsupported):
            ours(a, b, out=out)
        assert out.shape == before.shape  # untouched
        return
    result = ours(a, b, out=out)
    assert result is out and out.shape == shape
    # torch rounds to the result dtype, then casts to out's: compare at the coarser one.
    native = theirs(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference(theirs, a, b).to(native.dtype)
    coarse = out_dtype
    if native.dtype.is_floating_point and (
        not out_dtype.is_floating_point
        or torch.finfo(native.dtype).eps > torch.finfo(out_dtype).eps
    ):
        coarse = native.dtype
    if not native.dtype.is_floating_point:
        expected = native
    assert_close(out.to(coarse), expected.to(out_dtype).to(coarse))


INPLACE = ["add_.Tensor", "sub_.Tensor", "mul_.Tensor", "div_.Tensor", "div_.Tensor_mode",
           "pow_.Tensor", "clamp_min_.Tensor", "eq_.Tensor", "exp_.default", "sigmoid_.default",
           "relu_.default", "gelu_.default", "neg_.default", "masked_fill_.Scalar"]


@pytest.mark.parametrize("key", INPLACE)
@given(pair=operand_pairs(dtypes=(*HALF_AND_FLOAT, torch.int32), specials=False))
def test_inplace_variants(key: str, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """In-place entries write self (any layout) and agree with torch's in-place op."""
    a, b = pair
    assume(torch.broadcast_shapes(a.shape, b.shape) == a.shape)
    if not b.dtype.is_floating_point:  # integer division by zero: an error on the CPU only
        b = torch.where(b == 0, torch.ones_like(b), b)
    name, overload = key.split(".")
    aten = getattr(getattr(torch.ops.aten, name), overload)
    schema_args = [arg.name for arg in aten._schema.arguments if not arg.kwarg_only]
    args: list[Any] = [a.clone()]
    if "mask" in schema_args:
        args += [b > 0, 1.5]
    elif len(schema_args) > 1:
        args.append(b)
    kwargs = {"rounding_mode": "floor"} if key == "div_.Tensor_mode" else {}
    if not torch_accepts(aten, *[x.clone() if isinstance(x, torch.Tensor) else x
                                 for x in args], **kwargs):
        with pytest.raises(Unsupported):
            impl(key)(*args, **kwargs)
        return
    expected = aten(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args], **kwargs)
    self = args[0]
    result = impl(key)(*args, **kwargs)
    assert result is self
    assert_close(self, expected)


def test_large_rank_and_strided_out() -> None:
    """Operands with more dims than the strided kernel takes, and strided outputs, still match."""
    with torch.device(target_device()):
        _large_rank_and_strided_out()


def _large_rank_and_strided_out() -> None:
    a = torch.randn(2, 3, 2, 3, 2, 3, 2)[..., ::2].transpose(0, 5)
    b = torch.randn(1, 3, 1, 3, 1, 2, 1)
    check(pw.add(a, b), torch.add, a, b)
    out = torch.empty(7, 9).t()
    x, y = torch.randn(9, 7), torch.randn(7)
    pw.mul(x, y, out=out)
    assert_close(out, x * y)
    z = torch.zeros(4, 6)[:, ::2]
    impl("add_.Tensor")(z, torch.ones(3))
    assert_close(z, torch.ones(4, 3))


def test_unsupported_inputs() -> None:
    """Complex dtypes, other devices, partial overlap and torch's errors raise Unsupported."""
    c = torch.randn(4, dtype=torch.complex64)
    with pytest.raises(Unsupported):
        pw.add(c, c)
    with pytest.raises(Unsupported):
        act.exp(c)
    with pytest.raises(Unsupported):
        pw.add(torch.randn(4), torch.randn(4, device="meta"))
    x = torch.randn(8)
    with pytest.raises(Unsupported):
        impl("add_.Tensor")(x[1:], x[:-1])  # overlapping in-place
    with pytest.raises(Unsupported):
        impl("add_.Tensor")(torch.randn(3), torch.randn(2, 3))  # self cannot broadcast
    with pytest.raises(Unsupported):
        pw.sub(torch.ones(3, dtype=torch.bool), True)
    with pytest.raises(Unsupported):
        pw.add(torch.ones(3, dtype=torch.int32), 1, alpha=0.5)
    with pytest.raises(Unsupported):
        pw.div(torch.ones(3, dtype=torch.int32), 0, rounding_mode="floor")
    with pytest.raises(Unsupported):
        pw.where(torch.ones(3, dtype=torch.int32), x[:3], x[:3])  # non-bool condition


def test_empty_and_scalar_shapes() -> None:
    """0-size inputs give correctly shaped empty results; 0-dim inputs give 0-dim results."""
    with torch.device(target_device()):
        _empty_and_scalar_shapes()


def _empty_and_scalar_shapes() -> None:
    e = torch.empty(0, 3)
    assert pw.add(e, torch.ones(3)).shape == (0, 3)
    assert act.exp(torch.empty(2, 0, dtype=torch.int32)).dtype == torch.float32
    s = torch.tensor(2.0)
    out = pw.mul(s, s)
    assert out.shape == () and out.item() == 4.0
    assert pw.add(s, torch.ones(3, dtype=torch.float16)).dtype == torch.float16


def _aten(key: str) -> Any:
    name, overload = key.split(".")
    return getattr(getattr(torch.ops.aten, name), overload)


_SCALARS = {"alpha": 2, "threshold": 0.25, "value": 1.5, "min": -0.5, "max": 0.5,
            "exponent": 2.5, "other": 0.75, "self": 2.0}
_STRINGS = {"rounding_mode": "floor", "approximate": "tanh"}


def _sample(arg: Any, gen: torch.Generator) -> Any:
    kind = str(arg.type)
    if arg.name in ("out", "grad_input"):
        return torch.empty(0, device=target_device())
    if arg.name in ("condition", "mask"):
        return (torch.rand(3, 4, generator=gen) > 0.5).to(target_device())
    if "Tensor" in kind:
        if arg.name == "value":
            return torch.tensor(-1.25)
        return (torch.randn(3, 4, generator=gen) * 2).to(target_device())
    if "number" in kind:
        return _SCALARS[arg.name]
    return _STRINGS[arg.name]


@pytest.mark.parametrize("key", SERVED)
def test_impl_entries_match_aten(key: str) -> None:
    """Each overload the family declares, served as the registry binds it and called as the
    dispatcher calls it, gives aten's result."""
    schema = _aten(key)._schema
    gen = torch.Generator().manual_seed(len(key))
    args, kwargs = [], {}
    for arg in schema.arguments:
        value = _sample(arg, gen)
        if key.startswith("bitwise"):  # integers only: float operands become int64
            value = value.to(torch.int64) if isinstance(value, torch.Tensor) else 3
        (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))

    def copy(v: Any) -> Any:
        return v.clone() if isinstance(v, torch.Tensor) else v

    expected = _aten(key)(*map(copy, args), **{k: copy(v) for k, v in kwargs.items()})
    actual = impl(key)(*args, **kwargs)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, key
    assert_close(actual, expected)


@pytest.mark.parametrize(
    ("dtype", "half"),
    [(torch.float16, True), (torch.bfloat16, True), (torch.float32, False), (torch.int32, False)],
)
def test_exp_takes_the_single_exponential_only_for_half_results(
    dtype: torch.dtype, half: bool
) -> None:
    """exp's range-reduced body serves float32 results; half results take tl.exp, whose
    error is far below their half ulp, and still match the float64 reference."""
    from gemsops.ops.pointwise import elementwise as pm
    from gemsops.ops.pointwise import iterator as it

    x = torch.linspace(-20, 11, 97, dtype=torch.float32).to(dtype).to(target_device())
    plan = it._plan(act.UNARY["exp"], [x], None)
    assert plan is not None
    assert plan.meta["OP"] is (pm.exp_half if half else pm.exp)
    check(act.exp(x), torch.exp, x)


# --- the tiled kernel (broadcast and mixed layouts) and the tuning hooks ---------------


@st.composite
def broadcast_along(draw: st.DrawFn, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank-4 tensor and an operand broadcast along ``dim`` (and maybe other dims): kept
    as size 1, or dropped when all dims before it are too; either may be transposed or
    sliced, and their dtypes differ."""
    full = list(draw(shapes(min_rank=4, max_rank=4)))
    full[dim] = draw(st.sampled_from([2, 3, 7, 16, 33]))
    small = [1 if k == dim or draw(st.integers(0, 3)) == 0 else s for k, s in enumerate(full)]
    lead = 0
    while lead < 4 and small[lead] == 1 and draw(st.booleans()):
        lead += 1
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
    a = draw(tensors(shape=tuple(full), dtypes=dtypes))
    b = draw(tensors(shape=tuple(small[lead:]), dtypes=dtypes))
    return (a, b) if draw(st.booleans()) else (b, a)


@pytest.mark.parametrize("dim", range(4))
@pytest.mark.parametrize("name", ["add", "mul", "maximum"])
@given(data=st.data())
def test_broadcast_along_each_dim(dim: int, name: str, data: st.DataObject) -> None:
    """An operand broadcast along any one dim (a bias row along the leading dims, a
    per-row scale along the last, or any in between), with others maybe broadcast too,
    in any layout and dtype mix, gives torch's dtype, shape and (reference) values."""
    a, b = data.draw(broadcast_along(dim))
    mine, theirs = BINARY[name]
    check(mine(a, b), theirs, a, b)


_ZOO = [
    # (full shape, broadcast operand shape): rows of every width class the tiles take
    ((37, 1025), (1025,)),  # a padded width: tiles of 128 columns, not two of 1024
    ((5, 2049), (5, 1)),  # a column broadcast
    ((300, 3), (3,)),  # narrow rows: many rows per tile
    ((3, 5, 7, 11), (5, 1, 11)),  # three outer dims
    ((2, 3, 4, 5, 6), (4, 1, 6)),  # four outer dims (the most the kernel takes)
    ((2, 3, 2, 3, 2, 3), (3, 1, 3, 1, 3)),  # more: copied out and swept flat
    ((64, 64), (64, 64)),  # operands and output laid out differently (transposed below)
]


@pytest.mark.parametrize(("full", "small"), _ZOO)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_equals_flat_on_materialised_operands(
    full: tuple[int, ...], small: tuple[int, ...], dtype: torch.dtype
) -> None:
    """The tiled kernel computes each element as the flat kernel does: broadcast and
    transposed operands give bitwise the result of the same op on the operands expanded
    and copied contiguous (a flat launch), for two and three operands."""
    gen = torch.Generator().manual_seed(len(full) * 31 + len(small))
    a = torch.randn(full, generator=gen).to(dtype).to(target_device())
    b = torch.randn(small, generator=gen).to(dtype).to(target_device())
    if a.shape == b.shape:
        b = b.t().contiguous().t()  # same shape, column-major: not a flat launch
    cond = (torch.rand(full[-1], generator=gen) > 0.5).to(target_device())
    dense = b.expand(full).contiguous()
    assert torch.equal(pw.add(a, b), pw.add(a, dense))
    assert torch.equal(pw.mul(b, a), pw.mul(dense, a))
    assert torch.equal(pw.where(cond, a, b), pw.where(cond.expand(full).contiguous(), a, dense))
    assert torch.equal(act.gelu(a[..., ::2]), act.gelu(a[..., ::2].contiguous()))


@given(data=st.data(), layout=st.sampled_from(["transposed", "sliced", "both"]))
def test_strided_out_receives_torchs_values(data: st.DataObject, layout: str) -> None:
    """Writing a broadcast result into a non-contiguous ``out=`` (transposed, sliced, or
    both) leaves the reference values in the view and nothing written outside it."""
    shape = data.draw(shapes(min_rank=2, max_rank=2))
    rows, cols = max(shape[0], 1), max(shape[1], 1)
    x = data.draw(tensors(shape=(rows, cols), dtypes=(torch.float32,)))
    row = data.draw(tensors(shape=(cols,), dtypes=(torch.float32,)))
    if layout == "transposed":
        base = torch.full((cols * 2, rows * 2), -7.0, device=target_device())
        out = base[:cols, :rows].t()
    elif layout == "sliced":
        base = torch.full((rows, cols * 2), -7.0, device=target_device())
        out = base[:, ::2]
    else:
        base = torch.full((rows * 2, cols * 2), -7.0, device=target_device())
        out = base.t().t()[::2, ::2]
    pw.add(x, row, out=out)
    assert_close(out, reference(torch.add, x, row))
    outside = torch.ones_like(base, dtype=torch.bool)
    if layout == "transposed":
        outside[:cols, :rows] = False
    elif layout == "sliced":
        outside[:, ::2] = False
    else:
        outside[::2, ::2] = False
    assert bool((base[outside] == -7.0).all())


@pytest.mark.parametrize(("a", "b"), [((0, 5), (5,)), ((3, 0), (3, 1)), ((2, 0, 4), (4,)),
                                      ((0,), (1,)), ((4, 1), (0,))])
def test_broadcast_with_empty_operands(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """Broadcasting against an empty operand gives torch's empty result (shape, dtype)
    without launching; an empty ``out=`` is resized as torch resizes it."""
    x = torch.randn(a, device=target_device())
    y = torch.randn(b, device=target_device(), dtype=torch.float16)
    check(pw.add(x, y), torch.add, x, y)
    out = torch.empty(0, device=target_device())
    pw.mul(x, y, out=out)
    assert out.shape == torch.broadcast_shapes(a, b)


@given(cols=st.integers(1, 1 << 22))
def test_column_width_pads_rows_by_at_most_an_eighth(cols: int) -> None:
    """The tiled kernel's widest column tile is a power of two, at most WIDEST; rows of
    up to 16 columns take one tile at or above them, and longer rows are padded by at
    most an eighth by its multiples (or take 16-wide tiles)."""
    from gemsops.ops.pointwise import codegen

    width = codegen.column_width(cols)
    assert width & (width - 1) == 0 and 1 <= width <= codegen.WIDEST
    padded = -(-cols // width) * width
    if cols <= 16:
        assert width >= cols and width < 2 * cols
    else:
        assert width == 16 or padded * 8 <= cols * 9
        assert width >= 16


@given(n=st.integers(0, 1 << 34))
def test_small_problems_launch_the_first_config_unbenchmarked(n: int) -> None:
    """Pruning keeps every pointwise config for problems of 2**20 elements and more and
    only the first below, so small launches are never benchmarked."""
    from gemsops.ops.pointwise import codegen

    configs = ["first", "second", "third"]
    kept = codegen._prune_small(configs, {"SIZE_CLASS": n.bit_length()})
    assert kept == (configs if n >= codegen.SMALL else ["first"])


# --- gelu's bodies ---------------------------------------------------------------------


def _every_value(dtype: torch.dtype, lo: float, hi: float) -> torch.Tensor:
    """Every finite value of a half type in [lo, hi] (from its bit patterns)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    return values[torch.isfinite(values) & (values >= lo) & (values <= hi)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_half_body_rounds_faithfully(dtype: torch.dtype) -> None:
    """gelu (erf) of every half value in [-10, 10] with a normal result is within one
    unit in the last place of the exact value, though its half-type body replaces erf by
    one polynomial and an exp2; infinities, nan and -0.0 give torch's results."""
    x = _every_value(dtype, -10.0, 10.0)
    got = act.gelu(x.to(target_device())).cpu().double()
    exact = x.double() * 0.5 * torch.special.erfc(-x.double() / math.sqrt(2))
    normal = exact.abs() >= torch.finfo(dtype).tiny  # subnormal halves: not this test's
    digits = 7 if dtype == torch.bfloat16 else 10  # stored mantissa bits
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(got.abs(), exact.abs()))) - digits)
    assert bool(((got - exact).abs() <= ulp)[normal].all())
    specials = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, -1e4], dtype=dtype)
    got_s = act.gelu(specials.to(target_device())).cpu()
    assert got_s[0] == math.inf and got_s[1].isnan() and got_s[2].isnan()
    assert got_s[3] == 0 and not got_s[3].signbit() and got_s[4] == 0 and got_s[4].signbit()
    assert got_s[5] == 0 and got_s[5].signbit()


def test_gelu_tanh_is_the_tanh_form() -> None:
    """gelu(approximate="tanh"), computed as x * sigmoid(2u), is the tanh form to float32
    rounding over [-20, 20]: relative 2e-6 for |x| <= 5, 1e-5 in the tail (where the
    rounding of 2u, up to 126 in magnitude, dominates), absolute 1e-37 near float32's
    smallest normal; it gives torch's results at infinities, nan and -0.0 for every float
    dtype."""
    x = torch.linspace(-20, 20, 40001, dtype=torch.float32)
    got = act.gelu(x.to(target_device()), approximate="tanh").cpu().double()
    xd = x.double()
    # x / 2 * (1 + tanh(u)) without the cancellation of 1 + tanh(u) for negative x.
    exact = xd * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd**3))
    rtol = torch.where(xd.abs() <= 5, 2e-6, 1e-5)
    assert bool(((got - exact).abs() <= rtol * exact.abs() + 1e-37).all())
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        s = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 1e4, -1e4], dtype=dtype)
        got_s = act.gelu(s.to(target_device()), approximate="tanh").cpu()
        assert got_s[0] == math.inf and got_s[1].isnan() and got_s[2].isnan()
        assert got_s[3] == 0 and got_s[3].signbit()
        assert got_s[4] == 1e4 or dtype == torch.float16  # float16: 1e4 itself rounds
        assert got_s[5] == 0 and got_s[5].signbit()


def test_python_float_promotion_follows_the_default_dtype_after_a_change() -> None:
    """An integer tensor plus a Python float takes the default dtype in force at the call,
    also after the same op ran under another default (the cached plan is keyed by it)."""
    x = torch.arange(3, device=gemshal.current_device().torch_device)
    saved = torch.get_default_dtype()
    try:
        with registry.use_gems():
            first = (x + 2.5).dtype
            torch.set_default_dtype(torch.float64)
            second = x + 2.5
            torch.set_default_dtype(torch.float32)
            third = (x + 2.5).dtype
    finally:
        torch.set_default_dtype(saved)
    assert (first, second.dtype, third) == (torch.float32, torch.float64, torch.float32)
    torch.testing.assert_close(second.cpu(), torch.arange(3, dtype=torch.float64) + 2.5)


def test_valid_inputs_raise_no_numpy_warnings_from_the_interpreter() -> None:
    """Floor division by negatives, softmax of an all -inf row, pow and a float16 cast of a
    large value warn nothing (on the interpreter numpy computed masked lanes and warned)."""
    import warnings

    dev = gemshal.current_device().torch_device
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with registry.use_gems():
            a = torch.tensor([-7, 7, -8], device=dev) // torch.tensor([2, -2, 3], device=dev)
            torch.softmax(torch.full((2, 3), float("-inf"), device=dev), -1)
            torch.pow(torch.tensor([0.0, 2.0], device=dev), -1.0)
            torch.tensor([1e6, 1.0], device=dev).to(torch.float16)
    numpy_warnings = [w for w in caught if issubclass(w.category, RuntimeWarning)
                      and not str(w.message).startswith("gemshal:")]
    assert numpy_warnings == [], [str(w.message) for w in numpy_warnings]
    assert a.tolist() == [-4, -4, -3]


@settings(max_examples=30)
@given(sizes=st.lists(st.sampled_from([1, 1, 3, 4]), min_size=1, max_size=4),
       odd=st.lists(st.sampled_from([1, 7, 2**33]), min_size=4, max_size=4))
def test_size_one_dims_get_torchs_output_strides(sizes: list[int], odd: list[int]) -> None:
    """Property: for a contiguous input whose size-1 dims carry any stride (2**33
    included), unary, tensor-tensor and tensor-number results take torch's strides (not a
    copy of the odd ones), and clone and a dtype conversion keep the input's, as torch's
    do."""
    standard = torch.empty(sizes).stride()
    strides = [odd[i] if size == 1 else standard[i] for i, size in enumerate(sizes)]
    base = torch.randn(max(1, math.prod(sizes)), device=gemshal.current_device().torch_device)
    x = base.as_strided(sizes, strides)
    assert x.is_contiguous()
    calls: list[Callable[[torch.Tensor], torch.Tensor]] = [
        torch.neg, torch.exp, lambda t: t * t, lambda t: t + 1, lambda t: t * 2.5,
        torch.clone, lambda t: t.to(torch.float16)]
    for call in calls:
        expected = call(x).stride()
        with registry.use_gems(), registry.record() as rec:
            got = call(x)
        assert rec.served and not rec.fallbacks, rec.summary()
        assert got.stride() == expected, (sizes, strides)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_neg_flips_the_sign_bit(dtype: torch.dtype) -> None:
    """neg flips the sign bit, as torch's does: -(+0.0) is -0.0 and -(-0.0) is +0.0 (a
    ``0 - x``, which Triton 3.6 makes of unary minus, gives +0.0 for both), infinities
    swap, and every finite value negates exactly."""
    x = torch.tensor([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, 1e-30, 65504.0], dtype=dtype)
    got = pw.neg(x.to(target_device())).cpu()
    want = torch.neg(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(got.signbit(), want.signbit())
