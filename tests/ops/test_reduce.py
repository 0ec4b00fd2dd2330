"""Property tests of the reduce family: sum, mean, prod, amax/amin, max/min, arg*, var_mean, cumsum.

Every op is compared with torch (computed in float64 on the CPU where it rounds) over
drawn shapes (0-size, 1-element, odd, rank 0-4), dim sets, keepdim, dtypes, and
transposed or sliced inputs. Tolerances come from the shared table, widened by the
reduction length.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.rowwise import layout as reduce_layout
from gemsops.ops.rowwise import reduce as R
from gemsops.ops.rowwise.index import argmax, argmin, max_dim, min_dim
from gemsops.ops.rowwise.scan import cumsum
from gemsops.ops.rowwise.stats import var_mean
from gemsops.registry import implementations
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, INT_DTYPES, dims_for, tensors, to_target
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device

# The interpreter evaluates padding lanes too (-inf - -inf, 0 / 0) in numpy, which warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)
ALL_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.bool)
ORDERED = (*FLOAT_DTYPES, *INT_DTYPES, torch.int8)


@st.composite
def nonfinite_tensors(draw: st.DrawFn, **kwargs: Any) -> torch.Tensor:
    """Tensors with inf, nan and -0.0 planted, but no huge finite values.

    Sums of 1e30 and -1e30 cancel differently in every summation order, so those
    specials would test the order rather than the kernel; inf and nan do not.
    """
    x = draw(tensors(specials=True, **kwargs))
    if x.dtype.is_floating_point and x.numel():
        x[torch.isfinite(x) & (x.abs() > 1e20)] = 1.5
    return to_target(x)


def _dims_arg(draw: st.DrawFn, rank: int) -> tuple[int, ...] | None:
    return draw(st.one_of(st.none(), dims_for(rank)))


def _reduced(x: torch.Tensor, dims: tuple[int, ...] | None) -> int:
    if dims is None or not dims:
        return max(1, x.numel())
    return max(1, math.prod(x.shape[d] for d in dims))


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


@settings(max_examples=30)
@given(x=nonfinite_tensors(dtypes=ALL_DTYPES), data=st.data())
def test_sum_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """sum over any dim set, keepdim and dtype= matches torch in dtype, shape and value."""
    dims = _dims_arg(data.draw, x.dim())
    keepdim = data.draw(st.booleans())
    choices = [None, torch.float32, torch.float64] if x.dtype.is_floating_point else [
        None, torch.int64, torch.float32]
    dtype = data.draw(st.sampled_from(choices))
    actual = R.sum(x, dims, keepdim, dtype=dtype)
    assert actual.dtype == torch.sum(x, dims, keepdim, dtype=dtype).dtype
    expected = reference(torch.sum, x, dims, keepdim)
    assert_close(actual, expected, reduce_size=_reduced(x, dims))


@settings(max_examples=25)
@given(x=nonfinite_tensors(dtypes=(*FLOAT_DTYPES, torch.float64)), data=st.data())
def test_mean_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """mean over any dim set matches torch; an empty reduction gives nan."""
    dims = _dims_arg(data.draw, x.dim())
    keepdim = data.draw(st.booleans())
    actual = R.mean(x, dims, keepdim)
    assert actual.dtype == x.dtype
    assert_close(actual, reference(torch.mean, x, dims, keepdim), reduce_size=_reduced(x, dims))


@settings(max_examples=25)
@given(x=nonfinite_tensors(dtypes=ALL_DTYPES), data=st.data())
def test_prod_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """prod over one dim or all matches torch; integer products wrap like torch's."""
    dim = data.draw(st.none() | st.integers(-max(x.dim(), 1), max(x.dim(), 1) - 1))
    keepdim = data.draw(st.booleans())
    actual = R.prod(x, dim, keepdim) if dim is not None else R.prod(x)
    torch_args = (dim, keepdim) if dim is not None else ()
    if x.dtype.is_floating_point:
        dims = None if dim is None else (dim % max(x.dim(), 1),)
        expected = reference(torch.prod, x, *torch_args)
        assert_close(actual, expected, reduce_size=_reduced(x, dims if x.dim() else None))
    else:
        _same(actual, torch.prod(x, *torch_args))


@settings(max_examples=30)
@given(x=tensors(dtypes=ALL_DTYPES, specials=True), data=st.data())
def test_amax_amin_match_torch_exactly(x: torch.Tensor, data: st.DataObject) -> None:
    """amax/amin over any non-empty dim set equal torch bit for bit; nan propagates."""
    dims = data.draw(dims_for(x.dim()))
    keepdim = data.draw(st.booleans())
    if any(x.shape[d] == 0 for d in dims) or (not dims and x.numel() == 0):
        with pytest.raises((IndexError, RuntimeError)):
            R.amax(x, dims, keepdim)
        return
    _same(R.amax(x, dims, keepdim), torch.amax(x, dims, keepdim))
    _same(R.amin(x, dims, keepdim), torch.amin(x, dims, keepdim))


@settings(max_examples=25)
@given(x=tensors(dtypes=ALL_DTYPES, specials=True), data=st.data())
def test_all_any_match_torch_exactly(x: torch.Tensor, data: st.DataObject) -> None:
    """all/any over all dims or any dim set equal torch's, dtype included (uint8 stays
    uint8); nan counts as nonzero; over an empty input, torch's identities (True for
    all, False for any) in torch's shape."""
    dims = data.draw(st.one_of(st.none(), dims_for(x.dim())))
    keepdim = data.draw(st.booleans())
    _same(R.all(x, dims, keepdim), torch.ops.aten.all.dims(x, dims, keepdim))
    _same(R.any(x, dims, keepdim), torch.ops.aten.any.dims(x, dims, keepdim))
    if dims is None:
        _same(R.all(x), torch.all(x))


@given(x=tensors(dtypes=ALL_DTYPES, specials=True))
def test_full_max_min_match_torch(x: torch.Tensor) -> None:
    """max(x) / min(x) of a non-empty tensor equal torch's; of an empty one raise like it."""
    if x.numel() == 0:
        with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
            R.max(x)
        return
    _same(R.max(x), torch.max(x))
    _same(R.min(x), torch.min(x))


@settings(max_examples=30)
@given(x=tensors(dtypes=ALL_DTYPES, specials=True), data=st.data())
def test_max_min_dim_values_and_first_indices(x: torch.Tensor, data: st.DataObject) -> None:
    """max/min over one dim give torch's values and its first-occurrence indices (nan first)."""
    rank = max(x.dim(), 1)
    dim = data.draw(st.integers(-rank, rank - 1))
    keepdim = data.draw(st.booleans())
    if x.dim() and x.shape[dim] == 0:
        with pytest.raises(IndexError, match="to have non-zero size"):
            max_dim(x, dim, keepdim)
        return
    for ours, theirs in ((max_dim, torch.max), (min_dim, torch.min)):
        values, indices = ours(x, dim, keepdim)
        t_values, t_indices = theirs(x, dim, keepdim)
        _same(values, t_values)
        _same(indices, t_indices)


@settings(max_examples=30)
@given(x=tensors(dtypes=ORDERED, specials=True), data=st.data())
def test_argmax_argmin_match_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """argmax/argmin over one dim or the flattened tensor equal torch's (ties: first index)."""
    rank = max(x.dim(), 1)
    dim = data.draw(st.none() | st.integers(-rank, rank - 1))
    keepdim = data.draw(st.booleans())
    empty = x.numel() == 0 if dim is None else bool(x.dim()) and x.shape[dim] == 0
    if empty:
        with pytest.raises(IndexError):
            argmax(x, dim, keepdim)
        return
    _same(argmax(x, dim, keepdim), torch.argmax(x, dim, keepdim))
    _same(argmin(x, dim, keepdim), torch.argmin(x, dim, keepdim))


@settings(max_examples=25)
@given(x=nonfinite_tensors(dtypes=(*FLOAT_DTYPES, torch.float64)), data=st.data())
def test_var_mean_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """var_mean over any dim set and correction matches torch, inf/nan for no dof included.

    torch's own var_mean (a Welford pass) turns the mean of [inf, finite] into nan or
    inf depending on the order it visits them: on the CPU an input holding an infinity
    is handed back to it; elsewhere the mean is compared with torch.mean.
    """
    dims = _dims_arg(data.draw, x.dim())
    keepdim = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([None, 0, 1, 2, 0.5]))
    if x.device.type == "cpu" and bool(x.isinf().any()):
        with pytest.raises(Unsupported):
            var_mean(x, dims, correction=correction, keepdim=keepdim)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the degrees-of-freedom warning: see test_edges
        var, mean = var_mean(x, dims, correction=correction, keepdim=keepdim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when correction leaves no dof
        e_var, _ = reference(torch.var_mean, x, dims, correction=correction, keepdim=keepdim)
    n = _reduced(x, dims)
    assert_close(mean, reference(torch.mean, x, dims, keepdim), reduce_size=n)
    assert_close(var, e_var, reduce_size=n)


@settings(max_examples=25)
@given(x=nonfinite_tensors(dtypes=ALL_DTYPES), data=st.data())
def test_cumsum_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """cumsum along any dim, with dtype=, matches torch (ints and bool give int64)."""
    rank = max(x.dim(), 1)
    dim = data.draw(st.integers(-rank, rank - 1))
    dtype = data.draw(st.sampled_from(
        [None, torch.float32] if x.dtype.is_floating_point else [None, torch.int64]))
    actual = cumsum(x, dim, dtype=dtype)
    assert actual.dtype == torch.cumsum(x, dim, dtype=dtype).dtype
    n = x.shape[dim] if x.dim() else 1
    assert_close(actual, reference(torch.cumsum, x, dim), reduce_size=n)


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every line of 16+ elements split across programs (the two-pass paths)."""
    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_TOTAL", 0)
    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_CHUNK", 8)
    monkeypatch.setattr(reduce_layout, "SPLIT_ALIGN", 8)


SPLIT_CASES = [((300,), None), ((5, 200), (1,)), ((200, 3), (0,)), ((70, 2, 5), (0, 1))]


@pytest.mark.parametrize(("shape", "dims"), SPLIT_CASES)
def test_split_reductions_match_one_pass(split_small: None, shape: tuple[int, ...],
                                         dims: tuple[int, ...] | None) -> None:
    """Lines split across programs and merged by a second launch give torch's results."""
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=gen)
    x.view(-1)[7] = float("nan")
    x = to_target(x)
    n = _reduced(x, dims)
    assert_close(R.sum(x, dims), reference(torch.sum, x, dims), reduce_size=n)
    assert_close(R.mean(x, dims), reference(torch.mean, x, dims), reduce_size=n)
    _same(R.amax(x, dims or ()), torch.amax(x, dims or ()))
    var, mean = var_mean(x, dims)
    e_var, e_mean = reference(torch.var_mean, x, dims)
    assert_close(var, e_var, reduce_size=n)
    assert_close(mean, e_mean, reduce_size=n)
    xi = to_target(torch.randint(-3, 3, shape, generator=gen))  # many ties: first index wins
    d = None if dims is None else dims[0]
    _same(argmax(xi, d), torch.argmax(xi, d))
    _same(argmin(x, d), torch.argmin(x, d))
    if d is not None:
        _same(max_dim(xi, d).indices, torch.max(xi, d).indices)
        assert_close(cumsum(x, d), reference(torch.cumsum, x, d), reduce_size=x.shape[d])
    _same(cumsum(xi, -1), torch.cumsum(xi, -1))


def test_layout_reads_common_cases_without_copying() -> None:
    """sum(dim=0), transposed and sliced inputs reach a kernel as views, not copies."""
    x = torch.randn(6, 5, 4, device=DEVICE)
    for dims in [(0,), (1,), (2,), (0, 1), (1, 2), (0, 1, 2)]:
        assert reduce_layout.plan(x, dims).src is x
    lay = reduce_layout.plan(x, (1,))
    assert (lay.M, lay.N, lay.K, lay.stride_n) == (6, 5, 4, 4)
    t = x[:, :, 0].t()
    assert reduce_layout.plan(t, (0,)).src is t and reduce_layout.plan(t, (1,)).src is t
    s = x[..., ::2]
    assert reduce_layout.plan(s, (2,)).src is s
    assert reduce_layout.plan(x, (0, 2)).src is not x  # needs one permuted copy


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16])
def test_other_integer_dtypes(dtype: torch.dtype) -> None:
    """uint8 and int16 (which the shared strategies do not draw) reduce like torch."""
    gen = torch.Generator().manual_seed(3)
    x = to_target(torch.randint(0, 100, (9, 13), generator=gen).to(dtype))
    for d in (0, 1):
        _same(R.sum(x, d), torch.sum(x, d))
        _same(R.amax(x, d), torch.amax(x, d))
        _same(argmax(x, d), torch.argmax(x, d))
        _same(cumsum(x, d), torch.cumsum(x, d))
        _same(R.prod(x, d), torch.prod(x, d))


def test_expanded_inputs_read_in_place() -> None:
    """Broadcast (stride-0) inputs reduce, scan and normalise correctly without a copy."""
    x = torch.randn(7, device=DEVICE).expand(5, 7)
    assert reduce_layout.plan(x, (0,)).src is x
    assert_close(R.sum(x, 0), reference(torch.sum, x, 0), reduce_size=5)
    _same(argmax(x, 0), torch.argmax(x, 0))
    assert_close(cumsum(x, 0), reference(torch.cumsum, x, 0), reduce_size=5)
    var, mean = var_mean(x, 1)
    e_var, e_mean = reference(torch.var_mean, x, 1)
    assert_close(var, e_var, reduce_size=7)
    assert_close(mean, e_mean, reduce_size=7)


def test_reductions_of_empty_inputs() -> None:
    """sum of nothing is 0, prod 1, mean nan; amax/argmax of an empty dim raise like torch."""
    x = torch.zeros(0, 3, device=DEVICE)
    _same(R.sum(x, (0,)), torch.zeros(3))
    _same(R.prod(x, 0), torch.ones(3))
    assert torch.isnan(R.mean(x)).item()
    _same(R.amax(x, (1,)), torch.amax(x, (1,)))
    for ours, theirs in ((R.amax, torch.amax), (R.amin, torch.amin)):
        with pytest.raises(IndexError) as expected:
            theirs(x, (0,))
        with pytest.raises(IndexError) as actual:
            ours(x, (0,))
        assert str(actual.value) == str(expected.value)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda f: f.sum(f.ones(3), (0, 0)), RuntimeError),
        (lambda f: f.sum(f.ones(3), 1), IndexError),
        (lambda f: f.mean(f.ones(3, dtype=torch.int32)), RuntimeError),
        (lambda f: f.mean(f.ones(3), dtype=torch.int64), RuntimeError),
        (lambda f: f.amax(f.ones(0, 2)), RuntimeError),
        (lambda f: f.argmax(f.ones(3, dtype=torch.bool)), RuntimeError),
        (lambda f: f.var_mean(f.ones(3, dtype=torch.int64)), RuntimeError),
        (lambda f: f.max(f.ones(0)), RuntimeError),
    ],
)
def test_errors_match_torch(call: Callable[[Any], Any], error: type[Exception]) -> None:
    """Inputs torch rejects raise the same exception type and message here."""

    ones = functools.partial(torch.ones, device=DEVICE)
    ours_ns = SimpleNamespace(sum=R.sum, mean=R.mean, amax=R.amax, max=R.max, argmax=argmax,
                              var_mean=var_mean, ones=ones)
    torch_ns = SimpleNamespace(sum=torch.sum, mean=torch.mean, amax=torch.amax, max=torch.max,
                               argmax=torch.argmax, var_mean=torch.var_mean, ones=ones)
    with pytest.raises(error) as theirs:
        call(torch_ns)
    with pytest.raises(error) as ours:
        call(ours_ns)
    assert str(ours.value) == str(theirs.value)


def test_impls_behave_like_aten() -> None:
    """The registered functions, called with aten's arguments, return what the aten op returns."""
    x = torch.randn(4, 6, device=DEVICE)
    aten = torch.ops.aten
    assert_close(implementations()["sum.dim_IntList"](x, [1], True),
                 reference(aten.sum.dim_IntList, x, [1], True), reduce_size=6)
    total = implementations()["sum.default"](x, dtype=torch.float64)
    assert_close(total, aten.sum.default(x, dtype=torch.float64), reduce_size=24)
    v, i = implementations()["max.dim"](x, 0)
    tv, ti = aten.max.dim(x, 0)
    _same(v, tv)
    _same(i, ti)
    out = torch.empty(0, device=DEVICE)
    assert implementations()["mean.out"](x, [0], False, out=out) is out
    assert_close(out, reference(torch.mean, x, 0), reduce_size=4)
    idx = torch.empty(0, dtype=torch.int64, device=DEVICE)
    vals = torch.empty(0, device=DEVICE)
    implementations()["min.dim_min"](x, 1, min=vals, min_indices=idx)
    _same(idx, torch.argmin(x, 1))
    o0, o1 = torch.empty(0, device=DEVICE), torch.empty(0, device=DEVICE)
    implementations()["var_mean.correction_out"](x, [1], correction=0, out0=o0, out1=o1)
    e_var, e_mean = torch.var_mean(x, 1, correction=0)
    assert_close(o0, e_var.double(), reduce_size=6)
    assert_close(o1, e_mean.double(), reduce_size=6)
    y = x.clone()
    assert implementations()["cumsum_.default"](y, 1) is y
    assert_close(y, reference(torch.cumsum, x, 1), reduce_size=6)


def test_unsupported_inputs_are_refused_before_writing() -> None:
    """Complex inputs, out= of another dtype or overlapping the input go to torch untouched."""
    z = torch.randn(3, 4, dtype=torch.complex64, device=DEVICE)
    for fn in (lambda: R.sum(z), lambda: R.amax(z, ()), lambda: argmax(z),
               lambda: var_mean(z), lambda: cumsum(z, 0), lambda: R.prod(z)):
        with pytest.raises(Unsupported):
            fn()
    x = torch.randn(3, 4, device=DEVICE)
    out = torch.full((4,), 7.0, dtype=torch.float16, device=DEVICE)
    with pytest.raises(Unsupported):
        implementations()["sum.IntList_out"](x, [0], out=out)
    assert (out == 7).all()
    with pytest.raises(Unsupported):
        implementations()["cumsum.out"](x, 0, out=x)


# --- one-pass arg reductions, Welford var_mean, wide splits ---------------------------


@st.composite
def tie_lines(draw: st.DrawFn) -> tuple[torch.Tensor, int]:
    """A 2-D tensor of a few distinct values (ties everywhere), with -inf, +inf or nan
    planted anywhere, whose reduced dim spans several of the kernels' chunks; and the
    dim (1: the rows form, 0: the middle form)."""
    dim = draw(st.sampled_from([0, 1]))
    length = draw(st.integers(1, 300))
    other = draw(st.integers(1, 5))
    shape = (other, length) if dim == 1 else (length, other)
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int32, torch.int8]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randint(-2, 3, shape, generator=gen).to(dtype)
    if dtype.is_floating_point:
        for value in draw(st.lists(st.sampled_from([-math.inf, math.inf, math.nan]),
                                   max_size=4)):
            x.view(-1)[draw(st.integers(0, x.numel() - 1))] = value
        if draw(st.booleans()):
            x.fill_(-math.inf)  # nothing beats INIT: the first index must still win
    return to_target(x), dim


@settings(max_examples=40)
@given(case=tie_lines())
def test_arg_reductions_keep_the_first_best_across_chunks(case: tuple[torch.Tensor, int]) -> None:
    """argmax, argmin, max.dim and min.dim give torch's values and first-occurrence
    indices when equal values, infinities (a line of only -inf too) and nans repeat in
    different chunks of a line, in the rows form and the middle form."""
    x, dim = case
    _same(argmax(x, dim), torch.argmax(x, dim))
    _same(argmin(x, dim), torch.argmin(x, dim))
    for ours, theirs in ((max_dim, torch.max), (min_dim, torch.min)):
        values, indices = ours(x, dim)
        t_values, t_indices = theirs(x, dim)
        _same(values, t_values)
        _same(indices, t_indices)


@pytest.mark.parametrize(("shape", "dims"), SPLIT_CASES)
def test_split_arg_reductions_keep_the_first_best(split_small: None, shape: tuple[int, ...],
                                                  dims: tuple[int, ...] | None) -> None:
    """Split lines with ties and a repeated nan across parts give torch's first index (the
    second pass compares (value, index) pairs)."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(0, 3, shape, generator=gen).float()
    d = None if dims is None else dims[0]
    _same(argmax(to_target(x), d), torch.argmax(x, d))
    x.view(-1)[5] = x.view(-1)[-2] = math.nan
    _same(argmax(to_target(x), d), torch.argmax(x, d))
    _same(argmin(to_target(x), d), torch.argmin(x, d))


@settings(max_examples=30)
@given(length=st.integers(1, 600), lines=st.integers(1, 4), dim=st.sampled_from([0, 1]),
       offset=st.sampled_from([0.0, -3.0, 1e4, 1e5]), seed=st.integers(0, 2**31 - 1))
def test_var_mean_is_exact_to_float32_rounding(length: int, lines: int, dim: int,
                                               offset: float, seed: int) -> None:
    """var_mean of float32 lines of any length (inside one chunk, whole chunks, with a
    tail) in either form is within 1e-6 relative of the float64 result, even for data
    with a large common offset (1e5 + unit noise), where E[x^2] - E[x]^2 in float32
    would keep no digit."""
    gen = torch.Generator().manual_seed(seed)
    shape = (lines, length) if dim == 1 else (length, lines)
    x = to_target(torch.randn(shape, generator=gen) + offset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lines of one value: no degrees of freedom
        var, mean = var_mean(x, dim)
        e_var, e_mean = torch.var_mean(x.cpu().double(), dim)
    ok = torch.isfinite(e_var)  # a line of one value has no degree of freedom: nan
    assert bool(torch.equal(var.cpu().isnan(), ~ok))
    assert bool(((var.cpu().double() - e_var).abs() <= 1e-6 * e_var + 1e-12)[ok].all())
    assert bool(((mean.cpu().double() - e_mean).abs() <= 1e-6 * (e_mean.abs() + 1)).all())


@pytest.mark.parametrize(("shape", "dims"), SPLIT_CASES)
def test_split_var_mean_keeps_large_offsets_exact(split_small: None, shape: tuple[int, ...],
                                                  dims: tuple[int, ...] | None) -> None:
    """A split line's parts shift by the line's first value, so partial means of data
    with a large offset (1e5 + unit noise) keep their digits: var within 1e-6 relative."""
    gen = torch.Generator().manual_seed(len(shape) + 11)
    x = torch.randn(shape, generator=gen) + 1e5
    var, mean = var_mean(to_target(x), dims)
    e_var, e_mean = torch.var_mean(x.double(), dims)
    assert bool(((var.cpu().double() - e_var).abs() <= 1e-6 * e_var).all())
    assert bool(((mean.cpu().double() - e_mean).abs() <= 1e-6 * e_mean.abs()).all())


@settings(max_examples=60)
@given(m=st.integers(1, 64), n=st.integers(1, 1 << 16), k=st.integers(1, 1 << 16),
       width=st.sampled_from([64, 128, 256, 512, 1024]))
def test_wide_split_fills_the_device_at_the_widest_tile(m: int, n: int, k: int,
                                                        width: int) -> None:
    """A middle-form split planned for tiles ``width`` columns wide never has fewer parts
    than the plain split, gives every part at least SPLIT_MIN_CHUNK / MID_WIDTH rows of
    a narrow tile's work (as the plain split does), covers the line exactly, and aims at
    SPLIT_WAVES programs per multiprocessor for the widest tiles where the line allows."""
    from gemsops.ops.rowwise import tiles

    src = torch.empty(1, device=DEVICE)
    lay = reduce_layout.Layout(src, m, n, k, n * k, k)
    parts, chunk = tiles.wide_split(lay, width)
    plain_parts, _ = reduce_layout.split(lay)
    assert parts >= plain_parts
    assert -(-n // chunk) == parts and (parts == 1 or (parts - 1) * chunk < n)
    if parts > plain_parts:
        assert chunk * min(k, reduce_layout.MID_WIDTH) >= reduce_layout.SPLIT_MIN_CHUNK // 2
        sms = gemshal.device_of(src).multiprocessor_count
        wide_programs = m * -(-k // width)
        assert wide_programs * (parts - 1) < reduce_layout.SPLIT_WAVES * sms


def test_sum_dim0_split_for_wide_tiles_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """sum/mean over dim 0 of a tall matrix, split for the widest reduce_mid tile (more
    parts than the plain split), equal torch's (float64 reference)."""
    from gemsops.ops.rowwise import value

    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_TOTAL", 0)
    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_CHUNK", 64)
    monkeypatch.setattr(value, "_mid_width", lambda: 1024)
    x = to_target(torch.randn(600, 400, generator=torch.Generator().manual_seed(5)))
    lay = reduce_layout.plan(x, (0,))
    assert lay is not None and tiles_parts(lay, 1024) > reduce_layout.split(lay)[0]
    assert_close(R.sum(x, 0), reference(torch.sum, x, 0), reduce_size=600)
    assert_close(R.mean(x, 0), reference(torch.mean, x, 0), reduce_size=600)
    _same(R.amax(x, 0), torch.amax(x, 0))


def tiles_parts(lay: reduce_layout.Layout, width: int) -> int:
    """The parts :func:`gemsops.ops.rowwise.tiles.wide_split` plans for ``lay``."""
    from gemsops.ops.rowwise import tiles

    return tiles.wide_split(lay, width)[0]


def test_var_mean_kernel_keeps_an_infinite_first_value_infinite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel shifts each line by its first value; an infinite first value is not
    used as the shift, so the line's mean stays +-inf (its variance nan), as a device
    computes it. (On the CPU such lines go to torch; here the kernel is made to run.)"""
    from gemsops.ops.rowwise import stats

    monkeypatch.setattr(stats, "holds_large", lambda *a: False)
    x = torch.tensor([[math.inf, 1.0, 2.0], [-math.inf, 3.0, 4.0], [5.0, 6.0, 7.0]],
                     device=DEVICE)
    var, mean = var_mean(x, 1)
    assert mean[0].item() == math.inf and mean[1].item() == -math.inf
    assert mean[2].item() == pytest.approx(6.0) and var[2].item() == pytest.approx(1.0)
    assert math.isnan(var[0].item()) and math.isnan(var[1].item())


@settings(max_examples=200)
@given(m=st.integers(1, 4096), n=st.integers(1, 1 << 22),
       k=st.sampled_from([1, 1, 2, 7, 128, 1024]), sms=st.sampled_from([1, 8, 132]))
def test_small_problems_split_only_long_lines(m: int, n: int, k: int, sms: int) -> None:
    """Below SPLIT_MIN_TOTAL a line is split exactly when it is LONG_LINE elements or
    longer and the problem has fewer programs than SPLIT_WAVES per multiprocessor; then
    its parts cover it exactly, no program reads fewer than SHORT_CHUNK elements (its chunk
    times its columns), and the parts add at most one program per line past the
    target."""
    if m * n * k >= reduce_layout.SPLIT_MIN_TOTAL:
        return
    parts, chunk = reduce_layout.split_sizes(m, n, k, sms)
    width = 1 if k == 1 else min(k, reduce_layout.MID_WIDTH)
    programs = m if k == 1 else m * -(-k // reduce_layout.MID_WIDTH)
    target = reduce_layout.SPLIT_WAVES * sms
    if n < reduce_layout.LONG_LINE or programs >= target:
        assert (parts, chunk) == (1, n)
        return
    assert parts > 1 and -(-n // chunk) == parts
    assert chunk * width >= reduce_layout.SHORT_CHUNK
    assert programs * (parts - 1) < target


def test_a_long_line_of_a_small_problem_is_split_and_matches_torch() -> None:
    """A full reduction of a 20000-element line (a small problem, so at the default
    sizes only the long-line rule splits it) runs in parts, and sum, mean, amax, argmax
    and cumsum over it equal torch's."""
    gen = torch.Generator().manual_seed(11)
    x = to_target(torch.randn(20000, generator=gen))
    lay = reduce_layout.plan(x, (0,))
    assert lay is not None and lay.M == 1 and reduce_layout.split(lay)[0] > 1
    assert_close(R.sum(x, None), reference(torch.sum, x, None), reduce_size=20000)
    assert_close(R.mean(x, None), reference(torch.mean, x, None), reduce_size=20000)
    _same(R.amax(x, ()), torch.amax(x.cpu(), ()))
    _same(argmax(x, None), torch.argmax(x.cpu(), None))
    assert_close(cumsum(x, 0), reference(torch.cumsum, x, 0), reduce_size=20000)
