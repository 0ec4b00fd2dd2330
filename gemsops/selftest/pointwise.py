"""Strategies of the second pass (issue 27): every op ``gemsops ops`` lists.

The pointwise ops (a dtype-dependent cast, shifts, ``where``, ternaries), the fills,
``copy`` and ``arange``, and the vector norms."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from gemsops.selftest.inputs import _binary_args, _broadcast, _dims_args, _on_device, _seeded
from gemsops.selftest.records import Args, Inputs
from gemsops.testing.strategies import FLOAT_DTYPES, broadcast_pair, tensors


def _with_dtype(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    # The input and its dtype, for a call whose result depends on the dtype itself.
    return tensors(dtypes=[dtype], specials=True).map(lambda x: (x, dtype))


@st.composite
def _shift_args(draw: st.DrawFn, dtype: torch.dtype, inplace: bool) -> Args:
    a, b = draw(broadcast_pair())
    if inplace:
        a = _broadcast(a, b)
    x = draw(tensors(shape=a, dtypes=[dtype]))
    amount = torch.randint(0, 8, b, generator=_seeded(draw), dtype=dtype)
    return x, _on_device(amount)


def _shifts(inplace: bool) -> Inputs:
    return lambda dtype: _shift_args(dtype, inplace)


@st.composite
def _where_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    a, b = draw(_binary_args(dtype))
    shape = draw(st.sampled_from([a.shape, b.shape, _broadcast(a.shape, b.shape)]))
    return draw(tensors(shape=shape, dtypes=[torch.bool])), a, b


def _where(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _where_args(dtype)


@st.composite
def _ternary_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    a, b = draw(_binary_args(dtype))
    return a, b, draw(tensors(shape=b.shape, dtypes=[dtype]))


def _ternary(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _ternary_args(dtype)


@st.composite
def _arange_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    step = draw(st.sampled_from([1, 2, 3, -1, 0.5, -0.25]))
    start = draw(st.integers(-20, 20))
    end = start + step * draw(st.integers(0, 60)) + draw(st.sampled_from([0, step / 2]))
    like = draw(tensors(shape=(), dtypes=[dtype]))
    return start, end, step, like


def _arange(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _arange_args(dtype)


def _arange_call(start: float, end: float, step: float, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(start, end, step, dtype=like.dtype, device=like.device)


@st.composite
def _fill_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype]))
    return x, draw(st.sampled_from([0.0, -1.5, 3.0, float("inf"), float("nan")]))


def _fill(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _fill_args(dtype)


def _fill_call(x: torch.Tensor, value: float) -> Args:
    return x.clone().fill_(value), x.clone().fill_(torch.tensor(value, dtype=x.dtype))


@st.composite
def _copy_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    a, b = draw(broadcast_pair())
    dst = _broadcast(a, b)
    return draw(tensors(shape=dst, dtypes=FLOAT_DTYPES)), draw(
        tensors(shape=b, dtypes=[dtype], specials=True))


def _copy(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _copy_args(dtype)


@st.composite
def _vector_norm_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x, dims = draw(_dims_args(dtype))
    return x, dims, draw(st.sampled_from([2, 1, 3, float("inf"), float("-inf"), 0]))


def _vector_norm(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _vector_norm_args(dtype)
