"""Strategies of the second pass (issue 27): every op ``gemsops ops`` lists.

The masked, index, scatter, sort and ``isin`` ops."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from gemsops.selftest.inputs import _dim_args, _on_device, _seeded, _select_args
from gemsops.selftest.records import Args
from gemsops.testing.strategies import tensors


@st.composite
def _masked_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], specials=True))
    shape = x.shape[draw(st.integers(0, x.dim())):]
    mask = draw(tensors(shape=shape, dtypes=[torch.bool]))
    return x, mask, draw(tensors(shape=(x.numel(),), dtypes=[dtype], layouts=False))


def _masked(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _masked_args(dtype)


@st.composite
def _index_add_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x, dim, idx = draw(_select_args(dtype))
    shape = list(x.shape)
    shape[dim] = idx.numel()
    return x, dim, idx, draw(tensors(shape=shape, dtypes=[dtype]))


def _index_add(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _index_add_args(dtype)


@st.composite
def _index_put_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    # Without accumulate, distinct positions: which duplicate wins is unspecified.
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    accumulate = draw(st.booleans())
    n = draw(st.integers(0, 6 if accumulate else x.shape[0])) if x.shape[0] else 0
    if accumulate and n:
        idx = torch.randint(0, x.shape[0], (n,), generator=_seeded(draw))
    else:
        idx = torch.randperm(x.shape[0], generator=_seeded(draw))[:n]
    shape = (n, *x.shape[1:])
    values = draw(tensors(shape=shape[draw(st.integers(0, len(shape))):], dtypes=[dtype]))
    return x, _on_device(idx), values, accumulate


def _index_put(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _index_put_args(dtype)


def _setitem(x: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, accumulate: bool) -> Any:
    out = x.clone()
    torch.ops.aten._index_put_impl_(out, (idx,), values, accumulate)
    return out


@st.composite
def _scatter_unique_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    # Distinct targets along dim within each line: scatter's winner among duplicates
    # is unspecified.
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    shape = [min(s, 3) for s in x.shape]
    shape[dim] = min(shape[dim], x.shape[dim])
    order = torch.rand(x.shape, generator=_seeded(draw)).argsort(dim)
    idx = order[tuple(slice(0, s) for s in shape)]
    src = draw(tensors(shape=shape, dtypes=[dtype], layouts=False))
    return x, dim, _on_device(idx.contiguous()), src


def _scatter_unique(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _scatter_unique_args(dtype)


@st.composite
def _sort_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x, dim = draw(_dim_args(dtype, True))
    return x, dim, draw(st.booleans())


def _sort(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _sort_args(dtype)


@st.composite
def _isin_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], specials=True))
    drawn = draw(tensors(dtypes=[dtype], specials=True, max_rank=1)).reshape(-1)
    picks = draw(st.lists(st.integers(0, max(0, x.numel() - 1)), max_size=4)) if x.numel() else []
    return x, torch.cat([drawn, x.reshape(-1)[picks]]), draw(st.booleans())


def _isin(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _isin_args(dtype)
