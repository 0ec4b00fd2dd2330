"""Property tests of the pointwise math family against torch: the unary functions
(gemsops/ops/pointwise/math.py), rounding and class tests (rounding.py), the two-operand
functions (binary_math.py) and the activations (activation_extra.py).

Values are compared with torch's op in float64 on the CPU through the shared tolerance
table; dtypes and shapes must equal torch's own, and integer and bool results must equal
torch's exactly. Inputs torch refuses (or that gemsops hands back by design) must raise
``Unsupported``, which the registry turns into a call of torch's own kernel.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemsops import declare, registry
from gemsops.errors import Unsupported
from gemsops.ops.pointwise import activation_extra as ae
from gemsops.ops.pointwise import binary_math as bm
from gemsops.ops.pointwise import math as pm
from gemsops.ops.pointwise import rounding as pr
from gemsops.testing.reference import reference
from gemsops.testing.strategies import broadcast_pair, target_device
from gemsops.testing.strategies import tensors as _tensors
from gemsops.testing.tolerance import assert_close, tolerance

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

HALF_AND_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16)
EVERY = (*HALF_AND_FLOAT, *INTS, torch.bool)
FEW = settings(max_examples=6)


def impl(overload: str) -> Callable[..., Any]:
    """The function the registry serves ``overload`` with (out= and in-place derived)."""
    return registry.implementations()[overload]


def aten(overload: str) -> Any:
    name, variant = overload.split(".")
    return getattr(getattr(torch.ops.aten, name), variant)


@st.composite
def tensors(draw: st.DrawFn, *, dtypes: tuple[torch.dtype, ...] = HALF_AND_FLOAT,
            scale: bool = True, **kwargs: Any) -> torch.Tensor:
    """The shared strategy (specials planted), uint8 drawn as wrapped int16, and floating
    values maybe scaled so domain edges (|x| near 1, 20, 89, 700) are reached."""
    dtype = draw(st.sampled_from(dtypes))
    kwargs.setdefault("specials", True)
    if dtype == torch.uint8:
        return draw(_tensors(dtypes=(torch.int16,), **kwargs)).to(torch.uint8)
    x = draw(_tensors(dtypes=(dtype,), **kwargs))
    if scale and dtype.is_floating_point:
        x = x * draw(st.sampled_from([1.0, 0.4, 8.0, 40.0, 300.0]))
    return x


def torch_accepts(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return False
    return True


def check(actual: torch.Tensor, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``actual`` has torch's dtype and shape, torch's exact integer and bool values, and
    the float64 reference's floating values. Where torch's own kernel overflows in its
    dtype and the reference does not (its CPU ``cosh(89.0)`` in float32), torch's value
    or the reference's passes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = fn(*args, **kwargs)
        expected = reference(fn, *args, **kwargs)
    assert actual.dtype == native.dtype, (actual.dtype, native.dtype)
    assert actual.shape == native.shape, (actual.shape, native.shape)
    got = actual.detach().cpu()
    native = native.detach().cpu()
    if not got.dtype.is_floating_point:
        torch.testing.assert_close(got, native, rtol=0, atol=0)
        return
    if got.numel():
        overflow = ~torch.isfinite(native) & torch.isfinite(expected.to(native.dtype))
        if overflow.any():
            atol, rtol = tolerance(got.dtype)
            near = (got.double() - expected.to(got.dtype).double()).abs() <= (
                atol + rtol * expected.to(got.dtype).double().abs())
            same = (got == native) | (got.isnan() & native.isnan())
            assert bool((near | same)[overflow].all()), (got[overflow], native[overflow])
            expected = torch.where(overflow, got.to(expected.dtype), expected)
    assert_close(got, expected)


# --- unary functions ------------------------------------------------------------------

UNARY = {
    **{name: (getattr(pm, name), getattr(torch, name)) for name in pm.UNARY_MATH},
    **{name: (getattr(pr, name), getattr(torch, name)) for name in pr.ROUNDING},
}
"""gemsops' function and torch's, by aten name."""
HANDED_BACK = {(name, dtype) for name in ("ceil", "trunc", "round", "frac") for dtype in
               (*INTS, torch.bool)} | {("erfc", torch.float64), ("erfinv", torch.float64)}
"""(op, dtype) pairs gemsops hands to torch by design: rounding integers is a copy;
erfc and erfinv are written for float32 accuracy."""


@pytest.mark.parametrize("name", sorted(UNARY))
@FEW
@given(x=tensors(dtypes=EVERY))
def test_unary(name: str, x: torch.Tensor) -> None:
    """Each unary function matches torch on every dtype it takes (integers promote to
    float, half types compute in float32), with nan, inf, -0.0 and huge values planted
    and values scaled out to the domain edges."""
    ours, theirs = UNARY[name]
    if not torch_accepts(theirs, x) or (name, x.dtype) in HANDED_BACK:
        with pytest.raises(Unsupported):
            ours(x)
        return
    check(ours(x), theirs, x)


_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1e-30, -1e-30, 1e-6, -1e-6,
          0.999, -0.999, 1.0001, 20.5, -20.5, 88.0, -88.0, 300.0, 1e8, 3e9, -3e9, 1e30,
          math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("dtype", HALF_AND_FLOAT)
def test_domain_edges_and_signed_zeros(dtype: torch.dtype) -> None:
    """At the domain edges (acosh(<1), atanh(+-1), log1p(-1), asin(>1), ties of round...)
    every function gives torch's nan, +-inf and finite values, and a zero result has
    torch's sign (sinh(-0.0) is -0.0, round(-0.4) is -0.0, frac(-2.0) is 0.0)."""
    x = torch.tensor(_EDGES, dtype=dtype, device=target_device())
    for name, (ours, theirs) in sorted(UNARY.items()):
        if (name, dtype) in HANDED_BACK:
            continue
        got = ours(x)
        check(got, theirs, x)
        native = theirs(x.cpu())
        if got.dtype.is_floating_point:
            assert torch.equal(got.cpu().isnan(), native.isnan()), name
            zeros = native == 0
            assert torch.equal(torch.signbit(got.cpu()[zeros]), torch.signbit(native[zeros])), name


def test_accuracy_in_float32_over_dense_ranges() -> None:
    """Over dense ranges of each function's domain, float32 results stay within the
    tolerance table of the float64 reference (a few ulp), tails and reductions included."""
    ranges = {"tan": (-6, 6), "asin": (-1, 1), "acos": (-1, 1), "atan": (-30, 30),
              "sinh": (-88, 88), "cosh": (-88, 88), "asinh": (-1e4, 1e4), "acosh": (1, 1e4),
              "atanh": (-1, 1), "erf": (-5, 5), "erfc": (-3, 10), "erfinv": (-1, 1),
              "log2": (0, 50), "log10": (0, 50), "log1p": (-1, 5), "expm1": (-20, 80),
              "exp2": (-100, 100)}
    for name, (lo, hi) in ranges.items():
        x = torch.linspace(lo, hi, 4097, device=target_device())
        tiny = torch.logspace(-20, -1, 64, device=target_device())
        x = torch.cat([x, tiny, -tiny, lo + tiny, hi - tiny]).clamp(lo, hi)
        ours, theirs = UNARY[name]
        check(ours(x), theirs, x)


@pytest.mark.parametrize("name", ["sinh", "log1p", "erfinv", "ceil", "round", "signbit",
                                  "isinf", "atan"])
@FEW
@given(x=tensors(dtypes=(torch.float32, torch.float16, torch.int32), specials=False),
       out_dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int32,
                                  torch.bool]),
       empty=st.booleans())
def test_unary_out(name: str, x: torch.Tensor, out_dtype: torch.dtype, empty: bool) -> None:
    """``name.out`` resizes an empty ``out``, writes the result cast to its dtype where
    torch does, and hands back (touching nothing) where torch raises."""
    if (name, x.dtype) in HANDED_BACK:
        return
    out = torch.empty(0 if empty else x.shape, dtype=out_dtype, device=target_device())
    entry = impl(f"{name}.out")
    if not torch_accepts(aten(f"{name}.out"), x, out=out.clone()):
        before = out.clone()
        with pytest.raises(Unsupported):
            entry(x, out=out)
        assert out.shape == before.shape
        return
    assert entry(x, out=out) is out
    expected = aten(f"{name}.out")(x, out=torch.empty_like(out))
    _, theirs = UNARY[name]
    native = theirs(x)
    if native.dtype.is_floating_point and out_dtype.is_floating_point:
        coarse = out_dtype if torch.finfo(out_dtype).eps >= torch.finfo(native.dtype).eps \
            else native.dtype
        assert_close(out.to(coarse), reference(theirs, x).to(native.dtype).to(out_dtype)
                     .to(coarse))
    else:
        torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["tan", "expm1", "acosh", "erfc", "trunc", "frac", "round"])
@FEW
@given(x=tensors(dtypes=(torch.float32, torch.bfloat16, torch.float16)))
def test_unary_inplace(name: str, x: torch.Tensor) -> None:
    """``name_`` writes ``self`` (its layout kept: a transposed one stays so) with torch's
    values and returns it."""
    self = x.clone()
    result = impl(f"{name}_.default")(self)
    assert result is self
    _, theirs = UNARY[name]
    check(self, theirs, x)


@FEW
@given(x=tensors(dtypes=HALF_AND_FLOAT), decimals=st.sampled_from([-2, -1, 1, 2, 3]))
def test_round_decimals(x: torch.Tensor, decimals: int) -> None:
    """round(x, decimals) gives torch's own result bit for bit (it scales in the compute
    dtype, then rounds half to even: a discontinuity no reference tolerance covers), out=
    and in place too."""
    expected = torch.round(x, decimals=decimals)
    got = pr.round(x, decimals=decimals)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    self = x.clone()
    impl("round_.decimals")(self, decimals=decimals)
    torch.testing.assert_close(self, expected, rtol=0, atol=0, equal_nan=True)
    out = torch.empty(0, dtype=x.dtype, device=target_device())
    impl("round.decimals_out")(x, decimals=decimals, out=out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


@FEW
@given(x=tensors(dtypes=HALF_AND_FLOAT, scale=False),
       values=st.sampled_from([(None, None, None), (1.5, None, None), (0.0, 7.0, -7.0),
                               (-1.0, 1e30, -1e30), (2.0, 3.0, None)]))
def test_nan_to_num(x: torch.Tensor, values: tuple[Any, Any, Any]) -> None:
    """nan_to_num replaces nan, +inf and -inf as torch does (the dtype's extremes by
    default, 1e30 becoming inf in a half type); replacements of unequal magnitude and
    integer tensors are handed back."""
    nan, posinf, neginf = values
    if values == (2.0, 3.0, None):
        with pytest.raises(Unsupported):
            pr.nan_to_num(x, nan, posinf, neginf)
        with pytest.raises(Unsupported):
            pr.nan_to_num(torch.arange(3, device=target_device()))
        return
    expected = torch.nan_to_num(x, nan, posinf, neginf)
    torch.testing.assert_close(pr.nan_to_num(x, nan, posinf, neginf), expected, rtol=0,
                               atol=0, equal_nan=True)
    self = x.clone()
    impl("nan_to_num_.default")(self, nan, posinf, neginf)
    torch.testing.assert_close(self, expected, rtol=0, atol=0, equal_nan=True)


def test_signbit_of_negative_nan_and_zero() -> None:
    """signbit sees the sign bit itself: -0.0 and a negative nan have it, in every
    floating dtype (half types through float32); integers test ``x < 0``."""
    for dtype in HALF_AND_FLOAT:
        x = torch.tensor([0.0, -0.0, math.nan, 1.0, -math.inf], dtype=dtype)
        x = torch.cat([x, -x[2:3]]).to(target_device())
        assert pr.signbit(x).tolist() == torch.signbit(x.cpu()).tolist(), dtype
    for dtype in INTS:
        x = torch.tensor([0, 3, 100], dtype=dtype)
        x = torch.cat([x, -x[1:]]) if dtype != torch.uint8 else x
        assert pr.signbit(x.to(target_device())).tolist() == torch.signbit(x).tolist()


# --- every declared overload, as the registry binds it ------------------------------

MODULES = ("gemsops.ops.pointwise.math", "gemsops.ops.pointwise.rounding",
           "gemsops.ops.pointwise.binary_math", "gemsops.ops.pointwise.activation_extra")
SERVED = sorted(o for d in declare.load() if d.module in MODULES for o in d.served)
"""Every aten overload this family's modules declare."""
_SCALARS = {"other": 0.75, "self": 2.0, "decimals": 2, "nan": 1.5, "posinf": 9.0,
            "neginf": -9.0, "min_val": -1.0, "max_val": 1.0, "negative_slope": 0.1,
            "alpha": 1.0, "scale": 1.0, "input_scale": 1.0, "beta": 1.0, "threshold": 20.0,
            "is_result": False, "self_is_result": False, "weight": 0.3}


def _sample(overload: str, arg: Any, gen: torch.Generator) -> Any:
    kind = str(arg.type)
    integer = "shift" in overload or overload.startswith(("__", "fmod", "remainder"))
    if arg.name in ("out", "grad_input"):
        return torch.empty(0, device=target_device(),
                           dtype=torch.int64 if "shift" in overload or "__" in overload
                           else torch.bool if overload.startswith(("signbit", "is"))
                           else torch.float32)
    if "Tensor" in kind:
        x = torch.randn(3, 4, generator=gen) * 2
        if "shift" in overload or overload.startswith("__"):
            x = torch.randint(0, 9, (3, 4), generator=gen)
        elif integer and "Scalar" not in overload:
            x = x.abs() + 0.5
        elif overload.startswith(("acosh",)):
            x = x.abs() + 1
        elif overload.startswith(("asin", "acos", "atanh", "erfinv")):
            x = x.tanh()
        return x.to(target_device())
    if "bool" in kind:
        return False
    if arg.name in _SCALARS:
        value = _SCALARS[arg.name]
        return 3 if "shift" in overload or overload.startswith("__") else value
    raise AssertionError(f"no sample for {overload} argument {arg.name}: {kind}")


@pytest.mark.parametrize("key", SERVED)
def test_impl_entries_match_aten(key: str) -> None:
    """Each overload this family declares, served as the registry binds it and called as
    the dispatcher calls it (out= and in-place derived), gives aten's result."""
    schema = aten(key)._schema
    gen = torch.Generator().manual_seed(len(key))
    args, kwargs = [], {}
    for arg in schema.arguments:
        value = _sample(key, arg, gen)
        (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))

    def copy(v: Any) -> Any:
        return v.clone() if isinstance(v, torch.Tensor) else v

    expected = aten(key)(*map(copy, args), **{k: copy(v) for k, v in kwargs.items()})
    actual = impl(key)(*args, **kwargs)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, key
    assert_close(actual, expected)


# --- two-operand functions ------------------------------------------------------------

BINARY = {name: (getattr(bm, name), getattr(torch, name)) for name in (
    "atan2", "hypot", "copysign", "logaddexp", "logaddexp2", "xlogy", "fmod", "remainder",
    "fmax", "fmin", "heaviside", "nextafter", "logical_xor", "bitwise_left_shift",
    "bitwise_right_shift")}
EXACT = {"nextafter"}
"""Compared with torch's own result bit for bit (a float64 reference has other neighbours)."""


@st.composite
def operand_pairs(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = EVERY,
                  specials: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of independently drawn dtypes and layouts whose shapes broadcast."""
    sa, sb = draw(broadcast_pair())
    return (draw(tensors(shape=sa, dtypes=dtypes, specials=specials)),
            draw(tensors(shape=sb, dtypes=dtypes, specials=specials)))


def _compare(name: str, ours: Callable[..., Any], theirs: Callable[..., Any],
             *args: Any) -> None:
    if name in EXACT:
        got, native = ours(*args), theirs(*args)
        assert got.dtype == native.dtype and got.shape == native.shape
        torch.testing.assert_close(got, native, rtol=0, atol=0, equal_nan=True)
    else:
        check(ours(*args), theirs, *args)


@pytest.mark.parametrize("name", sorted(BINARY))
@FEW
@given(pair=operand_pairs())
def test_binary(name: str, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Each two-operand function broadcasts, promotes mixed dtypes as torch does, and
    matches its values (integers exactly: truncated fmod, the divisor's sign for
    remainder, shifts past the bit width); torch's refusals are handed back."""
    ours, theirs = BINARY[name]
    a, b = pair
    if name.startswith("bitwise") and not torch.is_floating_point(b):
        b = b.remainder(70) - 5  # counts in [-5, 65): below 0 and past every width
    if name in ("fmod", "remainder") and not torch.is_floating_point(b):
        b = torch.where(b == 0, torch.ones_like(b), b)
    if not torch_accepts(theirs, a, b):
        with pytest.raises(Unsupported):
            ours(a, b)
        return
    try:
        _compare(name, ours, theirs, a, b)
    except Unsupported:
        assert name == "nextafter"  # by design: nextafter of half types


SPECIAL_GRID = [0.0, -0.0, 1.0, -1.0, 2.5, -3.0, 1e-30, 1e30, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("name", sorted(set(BINARY) - {"bitwise_left_shift",
                                                        "bitwise_right_shift"}))
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT)
def test_binary_special_grid(name: str, dtype: torch.dtype) -> None:
    """Every pair of special values (signed zeros, infinities, nan, huge and tiny) gives
    torch's value: atan2's quadrants, hypot(inf, nan) = inf, copysign of -0.0 and -nan,
    logaddexp(inf, inf), xlogy(0, nan) = nan, fmod(x, +-inf) = x, nextafter's steps."""
    ours, theirs = BINARY[name]
    grid = torch.tensor(SPECIAL_GRID, dtype=dtype)
    a = grid.repeat_interleave(len(SPECIAL_GRID)).to(target_device())
    b = grid.repeat(len(SPECIAL_GRID)).to(target_device())
    if not torch_accepts(theirs, a, b) or (name == "nextafter" and dtype in (
            torch.float16, torch.bfloat16)):
        with pytest.raises(Unsupported):
            ours(a, b)
        return
    _compare(name, ours, theirs, a, b)
    if name in ("atan2", "copysign", "hypot", "xlogy") or (
            name in ("fmod", "remainder") and dtype in (torch.float32, torch.float64)):
        got, native = ours(a, b).cpu(), theirs(a.cpu(), b.cpu())
        zeros = native == 0
        assert torch.equal(torch.signbit(got[zeros]), torch.signbit(native[zeros]))


def test_fmod_integer_division_by_zero_and_huge_quotients() -> None:
    """An integer fmod or remainder by a zero the host can see is handed back (torch's CPU
    kernel raises; a device divisor is not read back, so its zeros give the device's
    value, as torch's CUDA kernel does). A float quotient of 2^52 and more, up to 1e60,
    gives torch's remainder exactly. Scalar divisors take the divisor's dtype first."""
    dev = target_device()
    i = torch.tensor([7, -7, 3], dtype=torch.int32, device=dev)
    for fn, theirs in ((bm.fmod, torch.fmod), (bm.remainder, torch.remainder)):
        with pytest.raises(Unsupported):
            fn(i, 0)
        if dev.type == "cpu":
            with pytest.raises(Unsupported):
                fn(i, torch.tensor([1, 0, 2], dtype=torch.int32, device=dev))
        for dtype in (torch.float32, torch.float64):
            a = torch.tensor([1e30, -1e30, 3e38, 1e-30, 7.0], dtype=dtype)
            b = torch.tensor([1e-30, 1e-30, 1e-38, 3e-45, -1e-30], dtype=dtype)
            got = fn(a.to(dev), b.to(dev)).cpu()
            torch.testing.assert_close(got, theirs(a, b), rtol=0, atol=0)
            assert torch.equal(got.signbit(), theirs(a, b).signbit())
    x = torch.tensor([7.5, -7.5, 1e6, -0.0], dtype=torch.bfloat16, device=dev)
    for fn, theirs in ((bm.fmod, torch.fmod), (bm.remainder, torch.remainder)):
        for divisor in (0.3, -2, 2.5):
            torch.testing.assert_close(fn(x, divisor), theirs(x, divisor), rtol=0, atol=0)
        check(fn(i, -2), theirs, i, -2)
    check(bm.remainder(5, i), torch.remainder, 5, i)


@FEW
@given(dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_fmod_is_exact_at_every_quotient(dtype: torch.dtype, data: st.DataObject) -> None:
    """fmod and remainder of finite pairs drawn across the dtype's whole exponent range
    (so quotients up to 2^2000 in float64, and subnormals) equal torch's CPU result bit
    for bit, signed zeros included: the long division takes the quotients the one-fma
    remainder cannot."""
    info = torch.finfo(dtype)
    lo, hi = math.log2(info.smallest_normal) - 20, math.log2(info.max) - 1
    exps = data.draw(st.lists(st.floats(lo, hi), min_size=2, max_size=2 * 16))
    mants = data.draw(st.lists(st.floats(-2, 2).filter(lambda m: abs(m) > 0.01),
                               min_size=len(exps), max_size=len(exps)))
    v = torch.tensor([m * 2.0 ** e for m, e in zip(mants, exps, strict=True)],
                     dtype=torch.float64).to(dtype)
    half = len(v) // 2
    a, b = v[:half], v[half:2 * half]
    b = torch.where(b == 0, torch.ones_like(b), b)
    for fn, theirs in ((bm.fmod, torch.fmod), (bm.remainder, torch.remainder)):
        got = fn(a.to(target_device()), b.to(target_device())).cpu()
        want = theirs(a, b)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got.signbit(), want.signbit())


@pytest.mark.parametrize("name", ["bitwise_left_shift", "bitwise_right_shift"])
@given(x=tensors(dtypes=INTS), count=st.integers(-3, 70), data=st.data())
@FEW
def test_shifts(name: str, x: torch.Tensor, count: int, data: st.DataObject) -> None:
    """Shifts match torch bit for bit for every integer dtype, counts below zero and past
    the bit width, Tensor_Scalar and Scalar_Tensor forms, the dunder overloads, out= and
    in place (``x <<= 3``)."""
    ours, theirs = BINARY[name]
    check(ours(x, count), theirs, x, count)
    check(ours(5, x.remainder(70) - 3), theirs, 5, x.remainder(70) - 3)
    dunder = "__lshift__" if "left" in name else "__rshift__"
    check(impl(f"{dunder}.Scalar")(x, count), theirs, x, count)
    self = x.clone()
    impl(f"{dunder.replace('__', '__i', 1)}.Scalar")(self, count)
    check(self, theirs, x, count)
    out = torch.empty(0, dtype=x.dtype, device=target_device())
    impl(f"{name}.Tensor_out")(x, x.remainder(9), out=out)
    check(out, theirs, x, x.remainder(9))


@pytest.mark.parametrize("key", ["atan2_.default", "copysign_.Scalar", "fmod_.Scalar",
                                 "remainder_.Tensor", "hypot_.default", "xlogy_.Scalar_Other",
                                 "lerp_.Scalar", "heaviside_.default", "logical_xor_.default"])
@FEW
@given(pair=operand_pairs(dtypes=(torch.float32, torch.bfloat16, torch.float16),
                          specials=False))
def test_binary_inplace(key: str, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """In-place entries write ``self`` and agree with torch's in-place op (or hand back
    where torch refuses: a broadcast self, other dtypes for heaviside and lerp)."""
    a, b = pair
    if not a.numel():
        return  # an empty self may have zero strides: the iterator hands it back
    name, overload = key.split(".")
    second: Any = 0.75 if "Scalar" in overload else b
    args = (a.clone(), b, 0.3) if name == "lerp_" else (a.clone(), second)
    if not torch_accepts(aten(key), *[v.clone() if isinstance(v, torch.Tensor) else v
                                      for v in args]):
        with pytest.raises(Unsupported):
            impl(key)(*args)
        return
    expected = aten(key)(*[v.clone() if isinstance(v, torch.Tensor) else v for v in args])
    assert impl(key)(*args) is args[0]
    assert_close(args[0], expected.double() if expected.dtype.is_floating_point else expected)


@FEW
@given(pair=operand_pairs(dtypes=(torch.float32, torch.float16, torch.float64)),
       weight=st.sampled_from([0.0, 0.3, 0.5, 1.0, -0.25, 1.5]))
def test_lerp(pair: tuple[torch.Tensor, torch.Tensor], weight: float) -> None:
    """lerp with a scalar or tensor weight matches torch (from the nearer end, so weight
    1 gives ``end`` exactly); tensors of other dtypes are handed back as torch refuses."""
    a, b = pair
    if a.dtype != b.dtype:
        with pytest.raises(Unsupported):
            bm.lerp(a, b, weight)
        return
    check(bm.lerp(a, b, weight), torch.lerp, a, b, weight)
    w = torch.full_like(b, weight)
    if torch_accepts(torch.lerp, a, b, w):
        check(bm.lerp(a, b, w), torch.lerp, a, b, w)


# --- activations and their backward ops ---------------------------------------------

A = torch.ops.aten
F = torch.nn.functional
ACTIVATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "hardtanh": (ae.hardtanh, F.hardtanh),
    "relu6": (lambda x: ae.hardtanh(x, 0, 6), F.relu6),
    "leaky_relu": (lambda x: ae.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
    "elu": (lambda x: ae.elu(x, 1.3), lambda x: F.elu(x, 1.3)),
    "selu": (lambda x: ae.elu(x, 1.6732632423543772, 1.0507009873554805), F.selu),
    "celu": (lambda x: ae.elu(x, 0.7, 1, 1 / 0.7), lambda x: F.celu(x, 0.7)),
    "softplus": (lambda x: ae.softplus(x, 2.0, 10), lambda x: F.softplus(x, 2.0, 10)),
    "hardsigmoid": (ae.hardsigmoid, F.hardsigmoid),
    "hardswish": (ae.hardswish, F.hardswish),
    "mish": (ae.mish, F.mish),
}
BACKWARD: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "hardtanh_backward": (lambda g, x: ae.hardtanh_backward(g, x, -1, 1),
                          lambda g, x: A.hardtanh_backward(g, x, -1, 1)),
    "relu6_backward": (lambda g, x: ae.hardtanh_backward(g, x, 0, 6),
                       lambda g, x: A.hardtanh_backward(g, x, 0, 6)),
    "leaky_relu_backward": (lambda g, x: ae.leaky_relu_backward(g, x, 0.2, False),
                            lambda g, x: A.leaky_relu_backward(g, x, 0.2, False)),
    "elu_backward": (lambda g, x: ae.elu_backward(g, 1.3, 1, 1, False, x),
                     lambda g, x: A.elu_backward(g, 1.3, 1, 1, False, x)),
    "elu_backward_of_result": (lambda g, y: ae.elu_backward(g, 1.3, 1, 1, True, y),
                               lambda g, y: A.elu_backward(g, 1.3, 1, 1, True, y)),
    "softplus_backward": (lambda g, x: ae.softplus_backward(g, x, 1, 20),
                          lambda g, x: A.softplus_backward(g, x, 1, 20)),
    "hardsigmoid_backward": (ae.hardsigmoid_backward, A.hardsigmoid_backward),
    "hardswish_backward": (ae.hardswish_backward, A.hardswish_backward),
    "mish_backward": (ae.mish_backward, A.mish_backward),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@FEW
@given(x=tensors(dtypes=(*HALF_AND_FLOAT, torch.int32)))
def test_activations(name: str, x: torch.Tensor) -> None:
    """Each activation matches torch on floating tensors (half types in float32), nan,
    inf and the kinks (-3, 3, 0, 6, the softplus threshold) included; integer tensors
    are handed back (torch refuses them, or clamps them by its own rules)."""
    ours, theirs = ACTIVATIONS[name]
    if not x.dtype.is_floating_point:
        with pytest.raises(Unsupported):
            ours(x)
        return
    check(ours(x), theirs, x)
    kinks = torch.tensor([-3.0, 3.0, 0.0, -0.0, 6.0, 5.0, 10.0, -1.0, 1.0, 20.0],
                         dtype=x.dtype, device=target_device())
    check(ours(kinks), theirs, kinks)


NAN_BY_PATH = {"elu_backward", "elu_backward_of_result", "hardswish_backward",
               "hardtanh_backward", "relu6_backward"}
"""Where torch's own CPU kernel answers a nan input by the loop it takes (its vectorised
loop and its scalar loop differ; a float16 tensor of nine elements takes the scalar
one): gemsops gives the vectorised loop's answer (nan; 0 for hardtanh's backward)."""


@pytest.mark.parametrize("name", sorted(BACKWARD))
@FEW
@given(x=tensors(dtypes=HALF_AND_FLOAT), data=st.data())
def test_activation_backward_ops(name: str, x: torch.Tensor, data: st.DataObject) -> None:
    """The backward ops autograd calls match aten's, at the kinks and special values too
    (nan gives torch's 0, grad or nan)."""
    ours, theirs = BACKWARD[name]
    g = data.draw(tensors(shape=x.shape, dtypes=(x.dtype,), specials=False))
    kinks = [-3.0, 3.0, 0.0, 6.0, -1.0, 1.0, 20.0, 21.0, math.nan]
    if name in NAN_BY_PATH:
        x = torch.where(x.isnan(), torch.zeros_like(x), x)
        kinks = kinks[:-1]
    check(ours(g, x), theirs, g, x)
    kinks = torch.tensor(kinks, dtype=x.dtype, device=target_device())
    check(ours(torch.ones_like(kinks), kinks), theirs, torch.ones_like(kinks), kinks)


def test_activation_variants_handed_back() -> None:
    """Parameters the three-operand kernels do not take, torch's refusals and out= of
    another dtype are handed back; in place and grad_input= write their tensor."""
    x = torch.randn(4, 5, device=target_device())
    with pytest.raises(Unsupported):
        ae.elu(x, 1.0, 2.0, 3.0)
    with pytest.raises(Unsupported):
        ae.elu_backward(x, 1.0, 2.0, 1.0, False, x)
    with pytest.raises(Unsupported):
        ae.elu_backward(x, -1.0, 1.0, 1.0, True, x)
    with pytest.raises(Unsupported):
        ae.softplus_backward(x, x, 2.0, 20)
    with pytest.raises(Unsupported):
        ae.hardtanh_backward(x, x, -2, 2)
    with pytest.raises(Unsupported):
        ae.leaky_relu_backward(x, x, -0.1, True)
    with pytest.raises(Unsupported):
        ae.leaky_relu(x, out=torch.empty(4, 5, dtype=torch.float64, device=target_device()))
    for key, extra in (("hardtanh_.default", ()), ("leaky_relu_.default", (0.1,)),
                       ("elu_.default", ()), ("hardsigmoid_.default", ()),
                       ("hardswish_.default", ()), ("mish_.default", ())):
        self = x.clone()
        assert impl(key)(self, *extra) is self
        assert_close(self, aten(key)(x.clone().double(), *extra))
    buf = torch.empty(0, device=target_device())
    assert impl("hardswish_backward.out")(x, x, out=buf) is buf
    assert_close(buf, A.hardswish_backward(x.double(), x.double()))
