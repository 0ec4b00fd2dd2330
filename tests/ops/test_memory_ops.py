"""Property tests of the memory ops transformer models reach: ``_to_copy``, ``copy_``,
``constant_pad_nd``, ``tril``/``triu``, ``slice_backward``/``select_backward`` and
``arange.start_out`` (gemsops.ops.memory).

All but ``arange`` move or cast values without arithmetic, so torch's own op on the same
inputs is the reference, compared bit for bit (nan included) with the result's dtype,
shape and strides. ``arange`` computes ``start + step * i``: floating results are
compared within the tolerance table, integers exactly.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.memory import arange, copy, triangle, window
from gemsops.testing.strategies import (
    FLOAT_DTYPES,
    INT_DTYPES,
    any_layout,
    shapes,
    target_device,
    tensors,
)
from gemsops.testing.tolerance import assert_close

DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.bool)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values (bitwise up to nan), dtype, shape, strides and device."""
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.device == expected.device
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _castable(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` with values every cast to ``dtype`` defines (C leaves a float out of an
    integer's range, inf and nan undefined)."""
    if x.dtype.is_floating_point and not dtype.is_floating_point and dtype != torch.bool:
        return torch.nan_to_num(x, nan=0.0, posinf=100.0, neginf=-100.0).clamp(-100, 100)
    return x


@st.composite
def _laid_out(draw: st.DrawFn, min_rank: int = 0, max_rank: int = 4) -> torch.Tensor:
    """A tensor of any dtype: contiguous, transposed, sliced, channels-last or expanded."""
    shape = draw(shapes(min_rank=min_rank, max_rank=max_rank))
    return draw(any_layout(shape, draw(st.sampled_from(DTYPES))))


FORMATS = (None, torch.preserve_format, torch.contiguous_format, torch.channels_last)


@settings(max_examples=40)
@given(x=_laid_out(), dtype=st.sampled_from((None, *DTYPES)),
       memory_format=st.sampled_from(FORMATS))
def test_to_copy_matches_torch(x: torch.Tensor, dtype: torch.dtype | None,
                               memory_format: torch.memory_format | None) -> None:
    """_to_copy equals aten's: torch's cast of every value, the dtype, and the strides of
    torch's layout (preserve keeps dense strides, else their dense order)."""
    x = _castable(x, dtype or x.dtype)
    try:
        expected = torch.ops.aten._to_copy.default(x, dtype=dtype, memory_format=memory_format)
    except RuntimeError:
        with pytest.raises(Unsupported):
            copy.to_copy(x, dtype=dtype, memory_format=memory_format)
        return
    actual = copy.to_copy(x, dtype=dtype, memory_format=memory_format, non_blocking=True)
    _same(actual, expected)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the interpreter's numpy
def test_to_copy_uint8_and_bool_casts() -> None:
    """Floats become uint8 through int64 (-1.0 -> 255) and bool as nonzero (nan is True)."""
    dev = target_device()
    x = torch.tensor([-1.5, -1.0, 0.0, 0.5, 2.7, 255.0, float("nan")], device=dev)
    _same(copy.to_copy(x[:-1], dtype=torch.uint8), x[:-1].to(torch.uint8))
    _same(copy.to_copy(x, dtype=torch.bool), x.to(torch.bool))
    big = torch.tensor([2**24 + 1, -(2**40) - 3], dtype=torch.int64, device=dev)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        _same(copy.to_copy(big, dtype=dt), big.to(dt))


def test_to_copy_refusals() -> None:
    """Another device or layout, pinned memory, a mis-ranked channels-last format, or a
    dtype the kernels do not take raise Unsupported."""
    x = torch.randn(2, 3, device=target_device())
    for kwargs in ({"device": "meta"}, {"pin_memory": True}, {"layout": torch.sparse_coo},
                   {"memory_format": torch.channels_last},
                   {"memory_format": torch.channels_last_3d}, {"dtype": torch.complex64}):
        with pytest.raises(Unsupported):
            copy.to_copy(x, **kwargs)
    _same(copy.to_copy(x, device=x.device, pin_memory=False), x.clone())


@st.composite
def _copy_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """(self, src): self of any strides, src of any dtype broadcasting to self's shape."""
    self_ = draw(tensors(dtypes=DTYPES, specials=True))
    shape = list(self_.shape)
    drop = draw(st.integers(0, len(shape)))
    src_shape = [1 if draw(st.booleans()) else s for s in shape[drop:]]
    src = draw(tensors(shape=tuple(src_shape), dtypes=DTYPES, specials=True))
    return self_, _castable(src, self_.dtype)


@settings(max_examples=40)
@given(pair=_copy_pairs())
def test_copy_matches_torch(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """copy_ writes torch's cast of src, broadcast, into self's own strides; returns self."""
    self_, src = pair
    expected = self_.clone().copy_(src)
    target = self_.clone()
    assert copy.copy_(target, src) is target
    _same(target, expected)


def test_copy_strided_and_refusals() -> None:
    """copy_ into a strided view leaves the gaps; broadcasting wider than self, an
    expanded self, partial overlap or another device raise Unsupported."""
    dev = target_device()
    base = torch.zeros(4, 6, dtype=torch.int32, device=dev)
    expected = base.clone()
    src = torch.randn(4, 3, device=dev) * 10
    expected[:, ::2] = src.to(torch.int32)
    copy.copy_(base[:, ::2], src)
    _same(base, expected)
    x = torch.randn(3, device=dev)
    bad = (
        (x, torch.randn(1, 3, device=dev)),  # broadcast shape (1, 3) is not self's
        (torch.randn(1, 3, device=dev).expand(2, 3), x),  # overlapping self
        (x, torch.randn(3, device="meta")),  # another device
        (x[1:], x[:-1]),  # partial overlap
    )
    for self_, s in bad:
        with pytest.raises(Unsupported):
            copy.copy_(self_, s)
    assert copy.copy_(x, x) is x


@st.composite
def _pads(draw: st.DrawFn) -> tuple[torch.Tensor, list[int]]:
    x = draw(_laid_out())
    pairs = draw(st.integers(0, x.dim()))
    pad = [draw(st.integers(-3, 3)) for _ in range(2 * pairs)]
    return x, pad


@settings(max_examples=40)
@given(inputs=_pads(), value=st.sampled_from([0, 1, -2.5, 300, float("inf"), True]))
def test_constant_pad_matches_torch(inputs: tuple[torch.Tensor, list[int]],
                                    value: float) -> None:
    """constant_pad_nd equals F.pad(mode='constant'): values, dtype, shape and layout;
    negative pads crop; where torch raises (a crop past the input, a value that overflows
    the dtype) gemsops refuses."""
    x, pad = inputs
    try:
        expected = torch.ops.aten.constant_pad_nd.default(x, pad, value)
    except RuntimeError:
        with pytest.raises(Unsupported):
            window.constant_pad_nd(x, pad, value)
        return
    _same(window.constant_pad_nd(x, pad, value), expected)


def test_constant_pad_refusals() -> None:
    """An odd pad length or more pairs than dims raise Unsupported."""
    x = torch.randn(2, 3, device=target_device())
    for pad in ([1], [1, 1, 1, 1, 1, 1], [-3, -1]):
        with pytest.raises(Unsupported):
            window.constant_pad_nd(x, pad)


@st.composite
def _triangles(draw: st.DrawFn) -> tuple[torch.Tensor, int]:
    return draw(_laid_out(min_rank=2)), draw(st.integers(-6, 6))


@settings(max_examples=30)
@given(inputs=_triangles(), lower=st.booleans())
def test_triangle_matches_torch(inputs: tuple[torch.Tensor, int], lower: bool) -> None:
    """tril/triu equal torch's for any diagonal, batch and strides: functional
    (contiguous result), out= (an empty out resized) and in place (self's strides kept)."""
    x, k = inputs
    ours, theirs = (triangle.tril, torch.tril) if lower else (triangle.triu, torch.triu)
    expected = theirs(x, k)
    _same(ours(x, k), expected)
    out = torch.empty(0, dtype=x.dtype, device=x.device)
    assert ours(x, k, out=out) is out
    _same(out, expected)
    if not any(st_ == 0 and s > 1 for s, st_ in zip(x.shape, x.stride(), strict=True)):
        y = x.clone()
        y_ref = x.clone()
        assert ours(y, k, out=y, inplace=True) is y
        (y_ref.tril_ if lower else y_ref.triu_)(k)
        _same(y, y_ref)


def test_triangle_refusals() -> None:
    """Fewer than 2 dims, an out of another dtype or of another non-empty shape raise."""
    dev = target_device()
    x = torch.randn(3, 3, device=dev)
    with pytest.raises(Unsupported):
        triangle.tril(torch.randn(3, device=dev))
    with pytest.raises(Unsupported):
        triangle.triu(x, out=torch.empty(3, 3, dtype=torch.float64, device=dev))
    with pytest.raises(Unsupported):
        triangle.triu(x, out=torch.empty(2, 2, device=dev))
    big = torch.ones(2, 3, 3, dtype=torch.bool, device=dev)
    _same(triangle.tril(big, 10**12), big.tril(10**12))
    _same(triangle.triu(big, -(10**12)), big.triu(-(10**12)))


@st.composite
def _slices(draw: st.DrawFn) -> tuple[torch.Tensor, list[int], int, int, int, int]:
    sizes = list(draw(shapes(min_rank=1, max_rank=4)))
    dim = draw(st.integers(-len(sizes), len(sizes) - 1))
    start = draw(st.integers(-7, 7))
    end = draw(st.sampled_from([-3, 0, 2, 5, 9, 2**63 - 1]))
    step = draw(st.integers(1, 3))
    window_shape = list(sizes)
    window_shape[dim] = len(range(*slice(start, end, step).indices(sizes[dim])))
    grad = draw(tensors(shape=tuple(window_shape), dtypes=DTYPES, specials=True))
    return grad, sizes, dim, start, end, step


@settings(max_examples=40)
@given(inputs=_slices())
def test_slice_backward_matches_torch(
        inputs: tuple[torch.Tensor, list[int], int, int, int, int]) -> None:
    """slice_backward is zeros of input_sizes with the gradient in the sliced positions,
    as aten's (contiguous, the gradient's dtype), for any start, end, step and dim."""
    args = inputs
    _same(window.slice_backward(*args), torch.ops.aten.slice_backward.default(*args))


@settings(max_examples=30)
@given(data=st.data())
def test_select_backward_matches_torch(data: st.DataObject) -> None:
    """select_backward is zeros of input_sizes with the gradient at index of dim, as aten's."""
    sizes = list(data.draw(shapes(min_rank=1, max_rank=4).filter(lambda s: all(s))))
    dim = data.draw(st.integers(-len(sizes), len(sizes) - 1))
    index = data.draw(st.integers(-sizes[dim], sizes[dim] - 1))
    grad_shape = tuple(s for d, s in enumerate(sizes) if d != dim % len(sizes))
    grad = data.draw(tensors(shape=grad_shape, dtypes=DTYPES, specials=True))
    _same(window.select_backward(grad, sizes, dim, index),
          torch.ops.aten.select_backward.default(grad, sizes, dim, index))


def test_view_backward_refusals() -> None:
    """A dim or index out of range, a non-positive step or a mismatched gradient raise."""
    g = torch.randn(2, 3, device=target_device())
    with pytest.raises(Unsupported):
        window.select_backward(g, [2, 4, 3], 1, 4)
    with pytest.raises(Unsupported):
        window.select_backward(g, [2, 4, 3], 3, 0)
    with pytest.raises(Unsupported):
        window.slice_backward(g, [2, 4, 3], 1, 0, 3, 0)
    with pytest.raises(Unsupported):
        window.slice_backward(g, [2, 4, 3], 1, 0, 4, 1)  # window (2, 4, 3), grad (2, 3)


scalars = st.one_of(st.integers(-20, 20), st.sampled_from([0.5, -1.25, 0.1, 3.7, 1e-3]))


@settings(max_examples=40)
@given(start=scalars, end=scalars, step=st.one_of(st.integers(-5, 5),
                                                  st.sampled_from([0.3, -0.7, 2.5])),
       dtype=st.sampled_from((*FLOAT_DTYPES, *INT_DTYPES, torch.float64)))
def test_arange_matches_torch(start: float, end: float, step: float,
                              dtype: torch.dtype) -> None:
    """arange.start_out has torch's size and dtype and ``start + step * i`` values (within
    the tolerance table for floats, exact for integers); what torch raises on raises."""
    dev = target_device()
    if not dtype.is_floating_point and int(step) == 0 and step != 0:
        # A step truncating to 0 in an integer dtype: handed to torch, whose kernels
        # differ (some divide by it and crash the process), so torch is not called here.
        with pytest.raises(Unsupported):
            arange.arange(start, end, step, out=torch.empty(0, dtype=dtype, device=dev))
        return
    try:
        expected = torch.arange(start, end, step, dtype=dtype, device=dev)
    except (RuntimeError, ValueError):
        with pytest.raises(Unsupported):
            arange.arange(start, end, step, out=torch.empty(0, dtype=dtype, device=dev))
        return
    if expected.numel() > 2048:
        return
    out = torch.empty(0, dtype=dtype, device=dev)
    assert arange.arange(start, end, step, out=out) is out
    assert out.shape == expected.shape and out.dtype == dtype
    assert_close(out, torch.arange(start, end, step, dtype=torch.float64).to(dtype)
                 if dtype.is_floating_point else expected.cpu())


def test_arange_out_layouts() -> None:
    """An out of the right size keeps its shape; a strided one is written in index order;
    one of another non-empty size is refused (torch resizes it with a warning)."""
    dev = target_device()
    out = torch.empty(2, 3, dtype=torch.int32, device=dev)
    arange.arange(0, 6, 1, out=out)
    _same(out, torch.arange(6, dtype=torch.int32, device=dev).reshape(2, 3))
    base = torch.zeros(10, device=dev)
    arange.arange(0, 5, 1, out=base[::2])
    _same(base, torch.arange(10.0, device=dev) / 2 * (torch.arange(10, device=dev) % 2 == 0))
    with pytest.raises(Unsupported):
        arange.arange(0, 5, 1, out=torch.empty(3, device=dev))
    for bad in ((0, 5, 0), (0, 5, -1), (0, float("inf"), 1)):
        with pytest.raises(Unsupported):
            arange.arange(*bad, out=torch.empty(0, device=dev))
    with pytest.raises(Unsupported):
        arange.arange(0, 5, 1, out=torch.empty(0, dtype=torch.bool, device=dev))
    _same(arange.arange(0, 4, device=dev), torch.arange(0, 4, device=dev))


def test_served_through_aten() -> None:
    """A model's casts, pads, masks and slicing gradients are served by gemsops at the
    backend key, with nothing handed back to torch; the composite factories (ones_like,
    zeros_like, full_like, new_zeros, arange) reach gemsops through fill_, zero_ and
    arange.start_out."""
    dev = target_device()
    x = torch.randn(2, 6, device=dev, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with gemsops.use_gems(), gemsops.record() as rec:
            h = x.to(torch.bfloat16).float()
            p = F.pad(x, (1, 2), value=0.5)
            mask = torch.tril(torch.ones(4, 4, device=dev))
            upper = torch.ones(4, 4, device=dev).triu_(1)
            loss = x[:, 1:].sum() + x[:, 2].sum() + p.sum() + h.sum()
            loss.backward()  # type: ignore[no-untyped-call]
            pos = torch.arange(5, device=dev)
            like = torch.ones_like(x) + torch.zeros_like(x) + torch.full_like(x, 3)
            z = x.new_zeros(2, 6)
            z.copy_(x.detach().double())
    for overload in ("_to_copy.default", "constant_pad_nd.default", "tril.default",
                     "triu_.default", "slice_backward.default", "select_backward.default",
                     "arange.start_out", "copy_.default", "fill_.Scalar", "zero_.default"):
        assert rec.served[overload] >= 1, (overload, rec)
    assert not rec.fallbacks, rec.fallback_ops()
    _same(mask, torch.ones(4, 4, device=dev).tril())
    _same(upper, torch.ones(4, 4, device=dev).triu(1))
    _same(pos, torch.arange(5, device=dev))
    _same(like, torch.full_like(x.detach(), 4))
    _same(z, x.detach())
    assert x.grad is not None
    expected = torch.full((2, 6), 3.0, device=dev)
    expected[:, 0] = 2.0
    expected[:, 2] = 4.0
    _same(x.grad, expected)


def test_fallback_through_aten() -> None:
    """Inputs gemsops refuses (a pad cropping past the input) are handed to torch, which
    raises its own error; the refusal is counted."""
    x = torch.randn(2, 3, device=target_device())
    with (gemsops.use_gems(include=["constant_pad_nd"]), gemsops.record() as rec,
          pytest.raises(RuntimeError)):
        F.pad(x, (-4, 0))
    assert rec.fallbacks and not rec.served, rec
