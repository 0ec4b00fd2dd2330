"""Values, layouts and warnings at the edges, against torch (issue 13, item 10).

Each test names one behaviour: an op either gives torch's answer (values within the
shared tolerance, torch's strides, torch's warnings) or hands the input back to torch
with :class:`~gemsops.errors.Unsupported` (the registry then runs torch's own kernel).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gemsops.errors import Unsupported
from gemsops.ops.norm import norm as NM
from gemsops.ops.pointwise import activation as act
from gemsops.ops.pointwise import arith as pw
from gemsops.ops.rowwise.stats import var_mean
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, target_device, tensors, to_target
from gemsops.testing.tolerance import assert_close

Tensor = torch.Tensor
DEV = target_device()
FLOATS = (*FLOAT_DTYPES, torch.float64)
INF, NAN = math.inf, math.nan
# Rows torch's CPU layer norm and var_mean answer by their summation order: an infinity
# (the mean is inf or nan by its position), and values whose squares overflow float32.
EDGE_VALUES = [INF, -INF, 1e30, -3e38, 1e20]

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter


def _row(dtype: torch.dtype, special: float, n: int = 40, at: int = 3) -> torch.Tensor:
    x = torch.randn(3, n)
    x[1, at] = special
    return to_target(x.to(dtype))


def _on_cpu() -> bool:
    return DEV.type == "cpu"


# --- layer norm, rms norm ------------------------------------------------------------


# On a device these rows are computed, not handed back (seeing them would cost a host
# sync per call): their statistics differ from torch's order-dependent ones. A known
# difference (docs/gemsops.md, "Known differences"); on the CPU the tests pin the hand-back.
_DEVICE_COMPUTES_EDGE_ROWS = pytest.mark.xfail(
    DEV.type != "cpu", reason="rows holding an infinity or float32-overflowing values are "
    "computed on a device; their statistics are not torch's", strict=False)


@_DEVICE_COMPUTES_EDGE_ROWS
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("special", EDGE_VALUES)
def test_layer_norm_edge_rows_go_to_torch(dtype: torch.dtype, special: float) -> None:
    """A layer-norm row with an infinity or float32-overflowing values gets torch's answer
    (on the CPU it is handed back; torch's statistics there depend on its order)."""
    x = _row(dtype, special)
    try:
        out, mean, rstd = NM.native_layer_norm(x, [40], None, None, 1e-5)
    except Unsupported:
        return
    # Only float64 keeps 1e30/3e38 within its range: those rows are computed.
    assert not (_on_cpu() and (math.isinf(special) or dtype != torch.float64)), \
        "an order-dependent row was computed, not handed back"
    e_out, e_mean, e_rstd = reference(torch.native_layer_norm, x, [40], None, None, 1e-5)
    assert_close(out, e_out, reduce_size=40)
    assert_close(mean, e_mean, reduce_size=40)
    assert_close(rstd, e_rstd, reduce_size=40)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_nan_rows_are_nan_like_torch(dtype: torch.dtype) -> None:
    """A nan in a layer-norm row makes that row's output and statistics nan, as in torch,
    and leaves the other rows exact (nan is computed, not handed back)."""
    x = _row(dtype, NAN)
    got = NM.native_layer_norm(x, [40], None, None, 1e-5)
    want = torch.native_layer_norm(x, [40], None, None, 1e-5)
    for actual, expected in zip(got, want, strict=True):
        assert_close(actual, expected.double(), reduce_size=40)
    assert bool(got[0][1].isnan().all()) and bool(got[2][1].isnan().all())


@settings(max_examples=15)
@given(x=tensors(dtypes=FLOATS, specials=True, min_rank=1, max_rank=3),
       eps=st.sampled_from([None, 1e-5]))
def test_rms_norm_matches_torch_on_special_values(x: torch.Tensor, eps: float | None) -> None:
    """Property: rms_norm over the last dim equals torch's CPU kernel for inputs holding
    inf, nan, huge and tiny values (inf rows give nan at the inf and 0 elsewhere).

    torch's CPU kernel is the spec on every device: the reciprocal square root of an
    infinite mean square is 0, so the finite elements of such a row are 0."""
    n = x.shape[-1]
    if n == 0:
        return
    ref_eps = eps if eps is not None else torch.finfo(
        torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    out = NM.rms_norm(x, (n,), None, eps)
    native = F.rms_norm(x.cpu(), (n,), None, ref_eps)
    # torch's own kernel overflows where float64 does not: torch's answer is the spec.
    assert_close(out, native.double(), reduce_size=n)


# --- gelu ------------------------------------------------------------------------------


GELU_EDGES = [INF, -INF, NAN, 3.4e38, -3.4e38, 1e30, -1e30, 1e20, -1e20, 1e13, -1e13,
              60000.0, -60000.0, 40.0, -40.0, -13.0, -9.0, -5.5, 0.0, -0.0, 1e-30, -1e-45]


def _check_against_reference(actual: Tensor, fn: Callable[..., Tensor], *args: Tensor,
                             **kwargs: Any) -> None:
    """torch's dtype, nan and inf where torch's own kernel gives them, and the float64
    reference's values elsewhere (the kit's rule: torch's result is the spec only where
    it overflows in its dtype). Where torch overflows but the reference is finite in the
    dtype, the reference's value is accepted too: torch's CPU kernels overflow at
    different points on different instruction sets (3.4e38 in float32, say)."""
    native = fn(*args, **kwargs)
    expected = reference(fn, *args, **kwargs)
    assert actual.dtype == native.dtype
    native = native.cpu()
    got = actual.cpu()
    special = ~torch.isfinite(native)
    ref = expected.cpu().to(native.dtype)
    either = special & torch.isfinite(ref)  # torch overflowed, the true value did not
    strict = special & ~either
    torch.testing.assert_close(got[strict], native[strict], equal_nan=True)
    like_torch = (got[either] == native[either]) | (got[either].isnan() & native[either].isnan())
    like_ref = torch.isclose(got[either].double(), ref[either].double(), rtol=1e-2)
    assert bool((like_torch | like_ref).all()), (got[either], native[either], ref[either])
    assert_close(got, torch.where(special, got.to(expected.dtype), expected.cpu()))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu_and_its_backward_match_torch_at_non_finite_and_huge_inputs(
    approximate: str, dtype: torch.dtype
) -> None:
    """gelu and gelu_backward (both approximations) give torch's nan and inf and the
    float64 reference's values at infinite, huge, tail and tiny inputs and gradients, and
    inf at +inf."""
    x = to_target(torch.tensor(GELU_EDGES).to(dtype))
    # gelu(+inf) is inf (torch's CUDA kernel agrees); some of torch's CPU kernels give nan.
    pos_inf = torch.isposinf(x)
    assert bool(torch.isposinf(act.gelu(x[pos_inf], approximate=approximate)).all())
    rest = x[~pos_inf]
    _check_against_reference(act.gelu(rest, approximate=approximate), F.gelu, rest,
                             approximate=approximate)
    # Huge and non-finite gradients meet inputs whose derivative is 0, 1 or nan: in the
    # tail (-13 < x < -5) torch's float32 kernel, like any, has a large relative error.
    wild = torch.where(x.abs() >= 20, x.flip(0), 2.0)
    for grad in (torch.ones_like(x), torch.full_like(x, 3.0), wild):
        _check_against_reference(act.gelu_backward(grad, x, approximate=approximate),
                                 torch.ops.aten.gelu_backward, grad, x, approximate=approximate)


# --- var_mean --------------------------------------------------------------------------


@_DEVICE_COMPUTES_EDGE_ROWS
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("special", [*EDGE_VALUES, 3e38])
def test_var_mean_edge_values_go_to_torch(dtype: torch.dtype, special: float) -> None:
    """var_mean of a line holding an infinity, or values whose squares overflow the
    accumulator, gets torch's answer (handed back on the CPU: torch's mean of [inf, x]
    is inf or nan by position, and its float64 accumulation keeps 3e38 finite)."""
    x = _row(dtype, special)
    x[2] = special  # a line of nothing but the value
    try:
        var, mean = var_mean(x, 1)
    except Unsupported:
        return
    assert not (_on_cpu() and (math.isinf(special) or dtype != torch.float64))
    e_var, e_mean = reference(torch.var_mean, x, 1)
    assert_close(var, e_var, reduce_size=40)
    assert_close(mean, e_mean, reduce_size=40)


def test_var_mean_nan_lines_are_nan_like_torch() -> None:
    """A nan makes its line's variance and mean nan, as torch's (computed, not handed back)."""
    x = _row(torch.float32, NAN)
    var, mean = var_mean(x, 1)
    e_var, e_mean = torch.var_mean(x, 1)
    assert_close(var, e_var.double(), reduce_size=40)
    assert_close(mean, e_mean.double(), reduce_size=40)


def _warnings(fn: Callable[[], Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize(
    ("shape", "dims", "correction"),
    [((3, 5), 1, 5), ((3, 5), 1, 7.5), ((3, 5), None, 15), ((4,), None, None), ((1,), None, None),
     ((3, 5), 1, 4), ((3, 5), 1, 0), ((0, 3), 1, None), ((3, 0), 1, None), ((3, 0), 1, -1)],
)
def test_var_mean_warns_when_no_degrees_of_freedom_are_left(
    shape: tuple[int, ...], dims: int | None, correction: float | None
) -> None:
    """var_mean warns "degrees of freedom is <= 0" exactly when torch does (correction >=
    the elements per output, or an empty output)."""
    x = to_target(torch.randn(shape))
    ours = _warnings(lambda: var_mean(x, dims, correction=correction))
    theirs = _warnings(lambda: torch.var_mean(x, dims, correction=correction))
    assert [m.startswith("var_mean(): degrees of freedom is <= 0") for m in ours] == \
        [m.startswith("var_mean(): degrees of freedom is <= 0") for m in theirs]


def test_var_mean_out_warns_once() -> None:
    """var_mean's out= form warns about the degrees of freedom once, as torch does."""
    from gemsops.registry import implementations

    x = to_target(torch.randn(3, 2))
    o0, o1 = torch.empty(0, device=DEV), torch.empty(0, device=DEV)
    caught = _warnings(lambda: implementations()["var_mean.correction_out"](
        x, [1], correction=2, out0=o0, out1=o1))
    assert len(caught) == 1 and "degrees of freedom is <= 0" in caught[0]


# --- add / sub with alpha ----------------------------------------------------------------

INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


@settings(max_examples=40)
@given(dtype=st.sampled_from([*INTS, *FLOATS]), sub=st.booleans(),
       alpha=st.one_of(st.integers(-(2**63), 2**63 - 1),
                       st.sampled_from([2, -1, 100, 1000, 2**31 + 5, 2**40 + 3, 1e30, 1e39,
                                        1e300, 2.5])),
       scalar_other=st.booleans())
def test_add_sub_alpha_wrap_or_raise_like_torch(dtype: torch.dtype, sub: bool, alpha: Any,
                                                scalar_other: bool) -> None:
    """Property: add/sub with any alpha wrap in the integer type exactly as torch, and an
    alpha torch cannot convert to the tensor's type (it raises) is handed back."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randint(0, 120, (5,), generator=gen).to(dtype)
    b: Any = 77 if scalar_other else torch.randint(0, 120, (5,), generator=gen).to(dtype)
    a = to_target(a)
    b = b if scalar_other else to_target(b)
    ours, theirs = (pw.sub, torch.sub) if sub else (pw.add, torch.add)
    try:
        # torch on the same device: its accelerator kernels convert a half-type alpha to
        # float32 (no range error), its CPU kernels to the tensor's type.
        expected = theirs(a, b, alpha=alpha).cpu()
    except RuntimeError:
        with pytest.raises(Unsupported):
            ours(a, b, alpha=alpha)
        return
    actual = ours(a, b, alpha=alpha)
    assert actual.dtype == expected.dtype
    if dtype.is_floating_point:
        assert_close(actual, expected.double())
    else:
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)


def test_int8_alpha_out_of_range_is_handed_back() -> None:
    """An int8 add with alpha 1000 (torch raises: alpha does not fit int8) is handed back."""
    a = to_target(torch.ones(4, dtype=torch.int8))
    with pytest.raises(RuntimeError):
        torch.add(a.cpu(), a.cpu(), alpha=1000)
    with pytest.raises(Unsupported):
        pw.add(a, a, alpha=1000)
    assert torch.equal(pw.add(a, a, alpha=100).cpu(), torch.add(a.cpu(), a.cpu(), alpha=100))


# --- layouts -----------------------------------------------------------------------------


def _layouts() -> list[tuple[str, Callable[[], Tensor]]]:
    def cl(*shape: int) -> Tensor:
        return torch.randn(*shape).contiguous(memory_format=torch.channels_last)

    return [
        ("channels_last", lambda: cl(2, 3, 4, 5)),
        ("contiguous4", lambda: torch.randn(2, 3, 4, 5)),
        ("transposed", lambda: torch.randn(2, 5, 4).transpose(-1, -2)),
        ("contiguous3", lambda: torch.randn(2, 4, 5)),
        ("sliced_cl", lambda: cl(2, 3, 8, 5)[:, :, ::2]),
        ("broadcast_c", lambda: torch.randn(3, 1, 1)),
        ("permuted", lambda: torch.randn(4, 5, 2, 3).permute(2, 3, 0, 1)),
    ]


LAYOUTS = dict(_layouts())
PAIRS = [("channels_last", "contiguous4"), ("contiguous4", "channels_last"),
         ("transposed", "contiguous3"), ("contiguous3", "transposed"),
         ("channels_last", "broadcast_c"), ("broadcast_c", "channels_last"),
         ("sliced_cl", "contiguous4"), ("permuted", "contiguous4"),
         ("contiguous4", "permuted"), ("permuted", "channels_last")]


@pytest.mark.parametrize(("first", "second"), PAIRS)
@pytest.mark.parametrize("name", ["add", "mul", "maximum", "eq"])
def test_binary_ops_on_mixed_layouts_keep_torchs_strides(first: str, second: str,
                                                         name: str) -> None:
    """Binary ops on inputs of different memory layouts give torch's output strides (the
    first input's layout) and torch's values."""
    a, b = to_target(LAYOUTS[first]()), to_target(LAYOUTS[second]())
    ours, theirs = getattr(pw, name), getattr(torch, name)
    actual, expected = ours(a, b), theirs(a.cpu(), b.cpu())
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    if expected.dtype.is_floating_point:
        assert_close(actual, expected.double())
    else:
        assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("name", ["sliced_cl", "permuted", "transposed"])
def test_unary_ops_on_non_dense_inputs_keep_torchs_strides(name: str) -> None:
    """A unary op on a sliced or permuted input gives torch's output strides."""
    x = to_target(LAYOUTS[name]())
    assert act.exp(x).stride() == torch.exp(x.cpu()).stride()
    assert pw.add(x, 1.5).stride() == torch.add(x.cpu(), 1.5).stride()


@settings(max_examples=30)
@given(a=tensors(dtypes=(torch.float32,), min_rank=2, max_rank=4), data=st.data())
def test_output_strides_match_torch(a: Tensor, data: st.DataObject) -> None:
    """Property: for any two same-shape inputs of drawn layouts (contiguous, transposed,
    sliced), add's output has torch's strides and values."""
    if a.numel() == 0:
        return  # empty results have no memory order to compare
    b = data.draw(tensors(shape=a.shape, dtypes=(torch.float32,)))
    actual, expected = pw.add(a, b), torch.add(a.cpu(), b.cpu())
    # The memory order: strides of dims of one element carry none (the fast path's
    # empty_like keeps an input's there).
    assert [st for st, n in zip(actual.stride(), a.shape, strict=True) if n != 1] == \
        [st for st, n in zip(expected.stride(), a.shape, strict=True) if n != 1]
    assert_close(actual, expected.double())


# --- out= resize --------------------------------------------------------------------------


@pytest.mark.parametrize("out_shape", [(2,), (3, 4), (0,), (12,)])
@pytest.mark.parametrize("name", ["add", "mul", "pow"])
def test_out_resize_warns_like_torch(out_shape: tuple[int, ...], name: str) -> None:
    """Resizing a non-empty out= tensor warns "An output with one or more elements was
    resized", exactly when torch does (not for an empty out)."""
    a, b = to_target(torch.randn(3, 4)), to_target(torch.randn(4))
    ours, theirs = getattr(pw, name), getattr(torch, name)
    out_ours = torch.empty(out_shape, device=DEV)
    out_theirs = torch.empty(out_shape)
    mine = _warnings(lambda: ours(a, b, out=out_ours))
    torchs = _warnings(lambda: theirs(a.cpu(), b.cpu(), out=out_theirs))
    key = "An output with one or more elements was resized"
    assert [key in m for m in mine] == [key in m for m in torchs]
    assert out_ours.shape == out_theirs.shape
    assert_close(out_ours, out_theirs.double())


def test_pow_zero_exponent_out_resize_warns() -> None:
    """pow(x, 0) into a non-empty out= of another shape warns as torch does."""
    x = to_target(torch.randn(3))
    out = torch.empty(5, device=DEV)
    caught = _warnings(lambda: pw.pow(x, 0, out=out))
    assert any("An output with one or more elements was resized" in m for m in caught)
    assert out.shape == (3,) and bool((out == 1).all())


def test_resized_out_takes_torchs_layout() -> None:
    """An out= tensor resized for channels-last inputs gets torch's (channels-last) strides."""
    a = to_target(torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last))
    out, ref = torch.empty(0, device=DEV), torch.empty(0)
    pw.add(a, a, out=out)
    torch.add(a.cpu(), a.cpu(), out=ref)
    assert out.stride() == ref.stride()
    assert_close(out, ref.double())


SAME_DTYPE_OUT = {"neg": pw.neg, "abs": pw.abs, "sign": pw.sign, "floor": act.floor}


@pytest.mark.parametrize("name", sorted(SAME_DTYPE_OUT))
@pytest.mark.parametrize(("dtype", "out_dtype"), [
    (torch.float32, torch.float64), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32), (torch.float32, torch.float32)])
def test_same_dtype_ops_write_only_their_own_dtype_out(name: str, dtype: torch.dtype,
                                                       out_dtype: torch.dtype) -> None:
    """neg, abs, sign and floor write an ``out=`` of the input's dtype (torch's values)
    and hand any other back with ``out`` untouched, where torch raises."""
    x = to_target(torch.tensor([-2.5, -0.0, 0.75, 3.0]).to(dtype))
    out = to_target(torch.full((4,), 7.0, dtype=out_dtype))
    fn = SAME_DTYPE_OUT[name]
    if out_dtype != dtype:
        with pytest.raises(RuntimeError):
            getattr(torch, name)(x.cpu(), out=torch.empty(4, dtype=out_dtype))
        with pytest.raises(Unsupported, match=str(out_dtype)):
            fn(x, out=out)
        assert bool((out.cpu() == 7.0).all())
    else:
        fn(x, out=out)
        assert torch.equal(out.cpu(), getattr(torch, name)(x.cpu()))


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.bfloat16, torch.float32])
def test_heaviside_writes_only_its_own_dtype_out(out_dtype: torch.dtype) -> None:
    """heaviside writes an ``out=`` of its inputs' dtype (torch's values) and hands any
    other back with ``out`` untouched, where torch raises."""
    from gemsops.ops.pointwise import binary_math as bm

    x = to_target(torch.tensor([-2.0, 0.0, 0.0, 3.0]))
    v = to_target(torch.tensor([5.0, 0.5, -1.0, 9.0]))
    out = to_target(torch.full((4,), 7.0, dtype=out_dtype))
    if out_dtype != torch.float32:
        with pytest.raises(RuntimeError):
            torch.heaviside(x.cpu(), v.cpu(), out=torch.empty(4, dtype=out_dtype))
        with pytest.raises(Unsupported, match=str(out_dtype)):
            bm.heaviside(x, v, out=out)
        assert bool((out.cpu() == 7.0).all())
    else:
        bm.heaviside(x, v, out=out)
        assert torch.equal(out.cpu(), torch.heaviside(x.cpu(), v.cpu()))
