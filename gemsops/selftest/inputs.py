"""Input strategies of the first pass, built from the test suite's generators.

Also the helpers the second pass's strategies share: a broadcast shape, a seeded
generator, a tensor moved to the current device."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis import strategies as st

import gemshal
from gemsops.selftest.records import Args, Inputs
from gemsops.testing.strategies import broadcast_pair, dims_for, tensors


def _unary(specials: bool = True) -> Inputs:
    return lambda dtype: tensors(dtypes=[dtype], specials=specials).map(lambda x: (x,))


@st.composite
def _binary_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    a, b = draw(broadcast_pair())
    return (
        draw(tensors(shape=a, dtypes=[dtype], specials=True)),
        draw(tensors(shape=b, dtypes=[dtype], specials=True)),
    )


def _binary(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _binary_args(dtype)


@st.composite
def _dims_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype]))
    return x, list(draw(dims_for(x.dim())))


def _over_dims(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _dims_args(dtype)


@st.composite
def _dim_args(draw: st.DrawFn, dtype: torch.dtype, specials: bool) -> Args:
    # An empty dim (argmax refuses it) is skipped: torch refuses the reference too.
    x = draw(tensors(dtypes=[dtype], specials=specials, min_rank=1))
    return x, draw(st.integers(-x.dim(), x.dim() - 1))


def _along_dim(specials: bool) -> Inputs:
    return lambda dtype: _dim_args(dtype, specials)


@st.composite
def _norm_args(draw: st.DrawFn, dtype: torch.dtype, bias: bool) -> Args:
    lead = draw(st.lists(st.sampled_from([1, 2, 3, 7]), max_size=2))
    n = draw(st.sampled_from([1, 5, 16, 33, 100, 257]))
    x = draw(tensors(shape=(*lead, n), dtypes=[dtype]))
    w = draw(tensors(shape=(n,), dtypes=[dtype], layouts=False))
    if not bias:
        return x, w
    return x, w, draw(tensors(shape=(n,), dtypes=[dtype], layouts=False))


def _norm(bias: bool) -> Inputs:
    return lambda dtype: _norm_args(dtype, bias)


_SIZES = st.sampled_from([1, 2, 5, 16, 33, 64])


@st.composite
def _mm_args(draw: st.DrawFn, dtype: torch.dtype, kind: str) -> Args:
    m, n, k = draw(_SIZES), draw(_SIZES), draw(_SIZES)
    batch = (draw(st.integers(1, 3)),) if kind == "bmm" else ()
    a = draw(tensors(shape=(*batch, m, k), dtypes=[dtype]))
    b = draw(tensors(shape=(*batch, k, n), dtypes=[dtype]))
    if kind == "addmm":
        return draw(tensors(shape=(n,), dtypes=[dtype], layouts=False)), a, b
    return a, b


def _mm(kind: str) -> Inputs:
    return lambda dtype: _mm_args(dtype, kind)


def _indices(draw: st.DrawFn, shape: tuple[int, ...], high: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    idx = torch.randint(0, high, shape, generator=gen, dtype=torch.int64)
    return idx.to(gemshal.current_device().torch_device)


@st.composite
def _embedding_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    num, dim = draw(st.integers(1, 40)), draw(st.sampled_from([1, 5, 64, 70]))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=2)))
    return _indices(draw, shape, num), draw(tensors(shape=(num, dim), dtypes=[dtype]))


def _embedding(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _embedding_args(dtype)


@st.composite
def _cross_entropy_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    rows, classes = draw(st.integers(1, 16)), draw(st.sampled_from([2, 5, 33, 100]))
    x = draw(tensors(shape=(rows, classes), dtypes=[dtype]))
    return x, _indices(draw, (rows,), classes)


def _cross_entropy(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _cross_entropy_args(dtype)


@st.composite
def _attention_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    b, heads, d = draw(st.integers(0, 2)), draw(st.sampled_from([1, 2])), draw(
        st.sampled_from([16, 64]))
    lq, lk = draw(st.integers(1, 33)), draw(st.integers(1, 33))
    q = draw(tensors(shape=(b, heads, lq, d), dtypes=[dtype], layouts=False))
    k = draw(tensors(shape=(b, heads, lk, d), dtypes=[dtype], layouts=False))
    v = draw(tensors(shape=(b, heads, lk, d), dtypes=[dtype], layouts=False))
    return q, k, v, draw(st.booleans()) and lq == lk


def _attention(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _attention_args(dtype)


@st.composite
def _gather_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3, specials=True))
    dim = draw(st.integers(0, x.dim() - 1))
    shape = tuple(min(s, 3) for s in x.shape)
    return x, dim, _indices(draw, shape, x.shape[dim]) if x.shape[dim] else _indices(
        draw, tuple(0 for _ in shape), 1)


def _gather(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _gather_args(dtype)


@st.composite
def _select_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3, specials=True))
    dim = draw(st.integers(0, x.dim() - 1))
    n = draw(st.integers(0, 6)) if x.shape[dim] else 0
    return x, dim, _indices(draw, (n,), max(x.shape[dim], 1))


def _select(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _select_args(dtype)


@st.composite
def _tril_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=2, max_rank=3, specials=True))
    return x, draw(st.integers(-3, 3))


def _tril(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _tril_args(dtype)


@st.composite
def _pad_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    pads = [draw(st.integers(0, 3)) for _ in range(2 * draw(st.integers(1, x.dim())))]
    return x, pads, draw(st.sampled_from([0.0, -1.5]))


def _pad(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _pad_args(dtype)


def _cast(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    # Every dtype to float32 and back to bfloat16: what a mixed-precision model casts.
    return tensors(dtypes=[dtype], specials=True).map(lambda x: (x,))


@st.composite
def _scatter_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    shape = tuple(min(s, 3) for s in x.shape)
    src = draw(tensors(shape=shape, dtypes=[dtype], layouts=False))
    return x, dim, _indices(draw, shape, max(x.shape[dim], 1)), src


def _scatter(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _scatter_args(dtype)


@st.composite
def _topk_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    return x, draw(st.integers(0, min(x.shape[-1], 8)))


def _topk(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _topk_args(dtype)


@st.composite
def _cat_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    other = list(x.shape)
    other[dim] = draw(st.integers(0, 4))
    return x, draw(tensors(shape=other, dtypes=[dtype])), dim


def _cat(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _cat_args(dtype)


def _reduced(args: Args) -> int:
    x, dims = args[0], args[1]
    if isinstance(dims, int):
        dims = [dims]
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def _last(args: Args) -> int:
    return int(args[0].shape[-1])


def _k(args: Args) -> int:
    return int(args[-1].shape[-2])


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]


def _seeded(draw: st.DrawFn) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _on_device(x: torch.Tensor) -> torch.Tensor:
    return x.to(gemshal.current_device().torch_device)
