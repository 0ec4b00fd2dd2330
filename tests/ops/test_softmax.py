"""Property tests of softmax / log_softmax, forward and backward, over any dim.

Compared with torch in float64 over drawn shapes, dims, dtypes and layouts; rows longer
than the interpreter's TILE_N take the two-pass online path, shorter ones the one-tile path.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.rowwise import softmax as S
from gemsops.registry import implementations
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, torch.float64)
aten = torch.ops.aten

# The interpreter evaluates padding lanes too (-inf - -inf) in numpy, which warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


def _dim(data: st.DataObject, x: torch.Tensor) -> int:
    rank = max(x.dim(), 1)
    return data.draw(st.integers(-rank, rank - 1))


def _length(x: torch.Tensor, dim: int) -> int:
    return x.shape[dim] if x.dim() else 1


@settings(max_examples=30)
@given(x=tensors(dtypes=DTYPES, specials=True), data=st.data(), log=st.booleans())
def test_forward_matches_torch(x: torch.Tensor, data: st.DataObject, log: bool) -> None:
    """softmax / log_softmax along any dim match torch, inf and nan lines included."""
    dim = _dim(data, x)
    actual = (S.log_softmax if log else S.softmax)(x, dim)
    expected = reference(torch.log_softmax if log else torch.softmax, x, dim)
    assert actual.dtype == x.dtype
    assert_close(actual, expected, reduce_size=_length(x, dim))


@settings(max_examples=20)
@given(x=tensors(dtypes=(torch.float16,)), data=st.data(), log=st.booleans())
def test_half_to_float_gives_float32(x: torch.Tensor, data: st.DataObject, log: bool) -> None:
    """_softmax(half_to_float=True) of float16 returns float32 computed from the halves."""
    dim = _dim(data, x)
    op = "_log_softmax.default" if log else "_softmax.default"
    actual = implementations()[op](x, dim, True)
    assert actual.dtype == torch.float32
    expected = reference(torch.log_softmax if log else torch.softmax, x, dim)
    assert_close(actual, expected, reduce_size=_length(x, dim))


@settings(max_examples=30)
@given(y_src=tensors(dtypes=DTYPES), data=st.data(), log=st.booleans())
def test_backward_matches_torch(y_src: torch.Tensor, data: st.DataObject, log: bool) -> None:
    """The backward ops match torch's for any dim, with non-contiguous gradients."""
    dim = _dim(data, y_src)
    y = (torch.log_softmax if log else torch.softmax)(y_src, dim)
    grad = data.draw(tensors(shape=y.shape, dtypes=(y.dtype,)))
    ours = S.log_softmax_backward if log else S.softmax_backward
    theirs = aten._log_softmax_backward_data if log else aten._softmax_backward_data
    actual = ours(grad, y, dim, y.dtype)
    expected = reference(lambda g, o: theirs(g, o, dim, torch.float64), grad, y)
    assert actual.dtype == y.dtype
    assert_close(actual, expected, reduce_size=_length(y, dim))


def test_online_pass_survives_leading_minus_inf() -> None:
    """A long row whose first chunks are all -inf still normalises its finite tail."""
    x = torch.full((3, 300), float("-inf"), device=DEVICE)
    x[1, 290] = 2.0
    x[2, 150:] = torch.linspace(-1, 1, 150, device=DEVICE)
    for log in (False, True):
        actual = (S.log_softmax if log else S.softmax)(x, 1)
        expected = reference(torch.log_softmax if log else torch.softmax, x, 1)
        assert_close(actual, expected, reduce_size=300)
        assert torch.isnan(actual[0]).all()  # an all -inf row is nan, as in torch


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (), (1,), (2, 1, 3)])
def test_degenerate_shapes(shape: tuple[int, ...]) -> None:
    """Empty, 0-dim and single-element lines give torch's shapes and values."""
    x = torch.randn(shape, device=DEVICE)
    for dim in ([0, -1] if x.dim() else [0]):
        for ours, theirs in ((S.softmax, torch.softmax), (S.log_softmax, torch.log_softmax)):
            actual = ours(x, dim)
            assert actual.shape == x.shape
            assert_close(actual, reference(theirs, x, dim))


def test_dtype_argument_converts_first() -> None:
    """softmax(x, dtype=float32) of a float16 tensor equals softmax of x.float()."""
    x = torch.randn(4, 33, dtype=torch.float16, device=DEVICE)
    actual = S.softmax(x, 1, dtype=torch.float32)
    assert actual.dtype == torch.float32
    assert_close(actual, reference(torch.softmax, x.float(), 1), reduce_size=33)


def test_out_variants_write_into_out() -> None:
    """The .out overloads resize an empty out, fill it and return it."""
    x = torch.randn(3, 70, device=DEVICE)
    out = torch.empty(0, device=DEVICE)
    assert implementations()["_softmax.out"](x, 1, False, out=out) is out
    assert_close(out, reference(torch.softmax, x, 1), reduce_size=70)
    y = torch.log_softmax(x, 0)
    g = torch.randn(3, 70, device=DEVICE)
    grad_in = torch.empty(3, 70, device=DEVICE)
    implementations()["_log_softmax_backward_data.out"](g, y, 0, torch.float32, out=grad_in)
    expected = reference(lambda a, b: aten._log_softmax_backward_data(a, b, 0, torch.float64), g, y)
    assert_close(grad_in, expected, reduce_size=3)


def test_unsupported_inputs_go_to_torch() -> None:
    """Integer and complex inputs and mismatched gradients raise Unsupported."""
    ones = functools.partial(torch.ones, device=DEVICE)
    with pytest.raises(Unsupported):
        S.softmax(ones(3, dtype=torch.int32))
    with pytest.raises(Unsupported):
        S.log_softmax(ones(3, dtype=torch.complex64))
    with pytest.raises(Unsupported):
        implementations()["_softmax.default"](ones(3), 0, True)  # half_to_float of float32
    with pytest.raises(Unsupported):
        S.softmax_backward(ones(3), ones(3, dtype=torch.float64), 0, torch.float32)
    out = torch.full((3,), 5.0, dtype=torch.float64, device=DEVICE)
    with pytest.raises(Unsupported):
        implementations()["_softmax.out"](ones(3), 0, False, out=out)
    assert (out == 5).all()
