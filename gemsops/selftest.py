"""``gemsops selftest``: which ops pass on this device, checked the way the test suite checks them.

A vendor runs it on its hardware. For each op and dtype of the table below it draws
examples with the test suite's strategies (:mod:`gemsops.testing.strategies`), calls
the op through aten inside ``use_gems()`` (the path users take), computes torch's
float64 reference on the CPU (:mod:`gemsops.testing.reference`) and compares them
with the suite's tolerance table (:mod:`gemsops.testing.tolerance`). Hypothesis
shrinks a failure to its smallest example. Each (op, dtype) ends as one of:

- ``passed``: every example matched torch;
- ``failed``: the smallest failing example, with the error or the difference;
- ``handed back``: gemsops handed every call back to torch, with the reasons;
- ``not implemented``: gemsops does not serve the op on this vendor (its unused list).

Every op ``gemsops ops`` lists is checked by a case (its ``aten`` names) or named in
:data:`UNCHECKED` with the reason; tests/test_selftest.py enforces it. Backward ops are
checked through ``torch.autograd.grad`` of their forward, the ``_foreach_*`` ops and the
fused optimizers through torch's calls on lists of drawn tensors, and the random ops
through properties that hold for any random stream (gemsops draws its own Philox
numbers, not torch's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from torch.nn import functional as F

import gemshal
from gemshal.kernel import AUTOTUNE_ENV
from gemsops import registry
from gemsops.testing.reference import reference
from gemsops.testing.strategies import (
    FLOAT_DTYPES,
    INT_DTYPES,
    broadcast_pair,
    dims_for,
    tensors,
)
from gemsops.testing.tolerance import assert_close, tolerance

__all__ = [
    "CASES",
    "DEFAULT_EXAMPLES",
    "OUTCOMES",
    "UNCHECKED",
    "Case",
    "Row",
    "add_parser",
    "main",
    "run",
]

DEFAULT_EXAMPLES = 10
OUTCOMES = ("passed", "failed", "handed back", "not implemented")

Args = tuple[Any, ...]
Inputs = Callable[[torch.dtype], st.SearchStrategy[Args]]


@attrs.frozen
class Case:
    """One op of the self-test: how to draw its inputs, the torch call, what serves it."""

    op: str
    inputs: Inputs
    """A strategy of the call's positional arguments, for one dtype."""
    call: Callable[..., Any]
    """The torch call, run on the drawn arguments (through gemsops, and as the reference)."""
    aten: tuple[str, ...]
    """gemsops op names (as ``gemsops ops`` lists them) that serve the call."""
    reduce: Callable[[Args], int] = lambda args: 1
    """The reduction length, which widens the tolerance."""
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    unregistered: bool = False
    """Compute the reference with gemsops' registration lifted, not only bypassed: for a
    call that torch routes differently once gemsops serves an op torch has no kernel for
    on this device (``rms_norm``'s backward on the CPU reaches ``_fused_rms_norm_backward``
    only then)."""


@attrs.frozen
class Row:
    """The outcome for one op and dtype."""

    op: str
    dtype: str
    outcome: str
    examples: int
    detail: str = ""
    example: str = ""
    """The smallest failing example (failed rows only)."""
    served: tuple[str, ...] = ()
    """The gemsops ops (as ``gemsops ops`` names them) that served some of the calls."""


# Input strategies, built from the test suite's generators.


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


# Strategies of the second pass (issue 27): every op `gemsops ops` lists.

_FOREACH_SHAPES = st.sampled_from([(), (1,), (5,), (3, 7), (16,), (2, 33)])


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]


def _meta(shape: Sequence[int]) -> torch.Tensor:
    return torch.empty(tuple(shape), device="meta")


def _seeded(draw: st.DrawFn) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


def _on_device(x: torch.Tensor) -> torch.Tensor:
    return x.to(gemshal.current_device().torch_device)


def _with_dtype(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    # The input and its dtype, for a call whose result depends on the dtype itself.
    return tensors(dtypes=[dtype], specials=True).map(lambda x: (x, dtype))


@st.composite
def _grad_args(draw: st.DrawFn, dtype: torch.dtype, specials: bool) -> Args:
    # An input and the gradient of an output of its shape (pointwise backwards).
    x = draw(tensors(dtypes=[dtype], specials=specials))
    return x, draw(tensors(shape=x.shape, dtypes=[dtype]))


def _unary_grad(specials: bool = True) -> Inputs:
    return lambda dtype: _grad_args(dtype, specials)


def _grad_of(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    """The call ``(x, grad) -> d fn(x) / dx . grad``: the backward op autograd runs."""

    def call(x: torch.Tensor, grad: torch.Tensor) -> Any:
        x = x.detach().requires_grad_()
        return torch.autograd.grad(fn(x), x, grad)[0]

    return call


@st.composite
def _dim_grad_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x, dim = draw(_dim_args(dtype, True))
    return x, dim, draw(tensors(shape=x.shape, dtypes=[dtype]))


def _along_dim_grad(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _dim_grad_args(dtype)


def _dim_grad_of(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[..., Any]:
    def call(x: torch.Tensor, dim: int, grad: torch.Tensor) -> Any:
        x = x.detach().requires_grad_()
        return torch.autograd.grad(fn(x, dim), x, grad)[0]

    return call


@st.composite
def _norm_grad_args(draw: st.DrawFn, dtype: torch.dtype, bias: bool) -> Args:
    args = draw(_norm_args(dtype, bias))
    return (*args, draw(tensors(shape=args[0].shape, dtypes=[dtype])))


def _norm_grad(bias: bool) -> Inputs:
    return lambda dtype: _norm_grad_args(dtype, bias)


def _grads(out: torch.Tensor, wrt: Sequence[torch.Tensor], grad: torch.Tensor) -> Args:
    return tuple(torch.autograd.grad(out, list(wrt), grad))


def _leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().requires_grad_() for x in xs]


def _layer_norm_grad(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> Args:
    x, w, b = _leaves(x, w, b)
    return _grads(F.layer_norm(x, w.shape, w, b, 1e-5), (x, w, b), g)


def _rms_norm_grad(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> Args:
    x, w = _leaves(x, w)
    return _grads(F.rms_norm(x, w.shape, w, 1e-6), (x, w), g)


@st.composite
def _attention_grad_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    q, k, v, causal = draw(_attention_args(dtype))
    return q, k, v, causal, draw(tensors(shape=q.shape, dtypes=[dtype], layouts=False))


def _attention_grad(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _attention_grad_args(dtype)


def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        g: torch.Tensor) -> Args:
    q, k, v = _leaves(q, k, v)
    return _grads(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), g)


@st.composite
def _conv_args(draw: st.DrawFn, dtype: torch.dtype, grad: bool) -> Args:
    # Patch convolutions (stride = kernel size), the kind gemsops serves.
    n, c, o = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3])), draw(
        st.sampled_from([1, 4, 8]))
    kh, kw = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    h, w = draw(st.integers(kh, 9)), draw(st.integers(kw, 9))
    x = draw(tensors(shape=(n, c, h, w), dtypes=[dtype], layouts=False))
    weight = draw(tensors(shape=(o, c, kh, kw), dtypes=[dtype], layouts=False))
    bias = draw(tensors(shape=(o,), dtypes=[dtype], layouts=False))
    if not grad:
        return x, weight, bias
    g = draw(tensors(shape=(n, o, h // kh, w // kw), dtypes=[dtype]))
    return x, weight, bias, g


def _conv(grad: bool) -> Inputs:
    return lambda dtype: _conv_args(dtype, grad)


def _conv_call(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w, b, stride=tuple(w.shape[2:]))


def _conv_backward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> Args:
    x, w, b = _leaves(x, w, b)
    return _grads(_conv_call(x, w, b), (x, w, b), g)


def _conv_reduce(args: Args) -> int:
    # The longer of the forward's (channels x patch) and the weight gradient's
    # (batch x patches) reductions.
    x, w = args[0], args[1]
    patches = x.shape[0] * (x.shape[2] // w.shape[2]) * (x.shape[3] // w.shape[3])
    return int(max(w[0].numel(), patches))


@st.composite
def _embedding_grad_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    idx, weight = draw(_embedding_args(dtype))
    return idx, weight, draw(tensors(shape=(*idx.shape, weight.shape[1]), dtypes=[dtype]))


def _embedding_grad(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _embedding_grad_args(dtype)


def _embedding_backward(idx: torch.Tensor, weight: torch.Tensor, g: torch.Tensor) -> Args:
    (weight,) = _leaves(weight)
    return _grads(F.embedding(idx, weight), (weight,), g)


def _nll_backward(x: torch.Tensor, target: torch.Tensor) -> Args:
    (x,) = _leaves(x)
    loss = F.nll_loss(torch.log_softmax(x, -1), target)
    return tuple(torch.autograd.grad(loss, [x]))


@st.composite
def _slice_args(draw: st.DrawFn, dtype: torch.dtype, select: bool) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    size = x.shape[dim]
    if select:
        if not size:
            return x, dim, 0, None  # no index to select: torch refuses, the example is skipped
        where: Any = draw(st.integers(-size, size - 1))
    else:
        start = draw(st.integers(-size - 1, size + 1))
        where = slice(start, draw(st.integers(-size - 1, size + 1)), draw(st.integers(1, 3)))
    index = (slice(None),) * dim + (where,)
    shape = _meta(x.shape)[index].shape
    return x, dim, where, draw(tensors(shape=shape, dtypes=[dtype]))


def _sliced(select: bool) -> Inputs:
    return lambda dtype: _slice_args(dtype, select)


def _slice_backward(x: torch.Tensor, dim: int, where: Any, g: torch.Tensor | None) -> Args:
    (x,) = _leaves(x)
    return tuple(torch.autograd.grad(x[(slice(None),) * dim + (where,)], [x], g))


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
def _lists_args(draw: st.DrawFn, dtype: torch.dtype, count: int, positive: bool) -> Args:
    # `count` lists of 1-3 contiguous tensors, equal shapes at each position.
    shapes_ = draw(st.lists(_FOREACH_SHAPES, min_size=1, max_size=3))
    lists = []
    for _ in range(count):
        row = [draw(tensors(shape=s, dtypes=[dtype], layouts=False)) for s in shapes_]
        lists.append([t.abs() + 0.5 for t in row] if positive else row)
    return tuple(lists)


def _lists(count: int, positive: bool = False) -> Inputs:
    return lambda dtype: _lists_args(dtype, count, positive)


def _foreach_binary(name: str) -> Callable[..., Any]:
    fn = getattr(torch, f"_foreach_{name}")

    def call(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[torch.Tensor]:
        # The List and Scalar overloads, and the in-place List one.
        inplace = [t.clone() for t in a]
        getattr(torch, f"_foreach_{name}_")(inplace, b)
        return [*fn(a, b), *fn(a, 0.75), *inplace]

    return call


def _foreach_unary(name: str) -> Callable[..., Any]:
    def call(a: list[torch.Tensor]) -> list[torch.Tensor]:
        inplace = [t.clone() for t in a]
        getattr(torch, f"_foreach_{name}_")(inplace)
        return [*getattr(torch, f"_foreach_{name}")(a), *inplace]

    return call


def _foreach_pointwise(name: str) -> Callable[..., Any]:
    fn = getattr(torch, f"_foreach_{name}")

    def call(a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> Any:
        return [*fn(a, b, c), *fn(a, b, c, value=-0.5), *fn(a, b, c, [0.25] * len(a))]

    return call


def _foreach_lerp(a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> Any:
    return [*torch._foreach_lerp(a, b, c), *torch._foreach_lerp(a, b, 0.3)]


def _foreach_copy(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[torch.Tensor]:
    out = [t.clone() for t in a]
    torch._foreach_copy_(out, b)
    return out


def _foreach_zero(a: list[torch.Tensor]) -> list[torch.Tensor]:
    out = [t.clone() for t in a]
    torch._foreach_zero_(out)
    return out


def _optimizer_step(kind: str) -> Callable[..., Any]:
    """One step of a fused optimizer on the drawn parameters and gradients: the new
    parameters and optimizer state."""

    def call(params: list[torch.Tensor], grads: list[torch.Tensor]) -> list[torch.Tensor]:
        ps = [p.detach().clone().requires_grad_() for p in params]
        for p, g in zip(ps, grads, strict=True):
            p.grad = g.clone()
        opt: torch.optim.Optimizer
        if kind == "adamw":
            opt = torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, fused=True)
        elif kind == "adam":
            opt = torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, fused=True)
        else:
            opt = torch.optim.SGD(ps, lr=0.01, momentum=0.9, weight_decay=0.1, fused=True)
        opt.step()
        state = [t for p in ps for t in opt.state[p].values()
                 if isinstance(t, torch.Tensor) and t.dim()]
        return [p.detach() for p in ps] + state

    return call


@st.composite
def _random_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype]))
    return x, draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]))


def _random(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _random_args(dtype)


def _plausible(kept: int, n: int, q: float) -> bool:
    """Whether ``kept`` of ``n`` draws succeeding with probability ``q`` is within 6
    standard deviations (plus one) of its mean: false for a biased or broken stream, true
    for any good one but once in about 10^9 calls."""
    return abs(kept - n * q) <= 6 * math.sqrt(n * q * (1 - q)) + 1


def _bernoulli_call(x: torch.Tensor, p: float) -> torch.Tensor:
    """``bernoulli_(p)``'s properties, which hold for any random stream: every value is
    0 or 1, and the fraction of ones is plausible for ``p``. (gemsops draws counter-based
    Philox numbers, not torch's stream: the values themselves cannot be compared.)"""
    y = x.clone().bernoulli_(p)
    with registry.running():  # torch's kernels check the result
        ones = int((y == 1).sum())
        binary = bool(((y == 0) | (y == 1)).all())
        return torch.tensor([binary, _plausible(ones, y.numel(), p), y.dtype == x.dtype])


def _dropout_call(x: torch.Tensor, p: float) -> torch.Tensor:
    """``native_dropout(x, p, train=True)``'s properties for any random stream: the mask
    is bool, kept elements are ``x / (1 - p)`` (within the dtype's tolerance), dropped
    ones are 0, and the kept fraction is plausible for ``1 - p``."""
    y, mask = torch.native_dropout(x, p, True)
    with registry.running():
        if p == 1:
            values = bool((y == 0).all())
        else:
            atol, rtol = tolerance(x.dtype)
            want = torch.where(mask, x.double() / (1 - p), torch.zeros_like(x, dtype=torch.float64))
            values = bool(torch.isclose(y.double(), want, rtol=rtol, atol=atol).all())
        kept = int(mask.sum())
        return torch.tensor([mask.dtype == torch.bool, values,
                             _plausible(kept, mask.numel(), 1 - p), y.shape == x.shape])


@st.composite
def _dropout_backward_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    g = draw(tensors(dtypes=[dtype], specials=True))
    mask = draw(tensors(shape=g.shape, dtypes=[torch.bool], layouts=False))
    return g, mask, draw(st.sampled_from([1.0, 1.25, 2.0, 5.0]))


def _dropout_backward(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _dropout_backward_args(dtype)


@st.composite
def _vector_norm_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x, dims = draw(_dims_args(dtype))
    return x, dims, draw(st.sampled_from([2, 1, 3, float("inf"), float("-inf"), 0]))


def _vector_norm(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _vector_norm_args(dtype)


def _reduced_all(args: Args) -> int:
    return max(1, int(args[0].numel()))


@st.composite
def _isin_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], specials=True))
    drawn = draw(tensors(dtypes=[dtype], specials=True, max_rank=1)).reshape(-1)
    picks = draw(st.lists(st.integers(0, max(0, x.numel() - 1)), max_size=4)) if x.numel() else []
    return x, torch.cat([drawn, x.reshape(-1)[picks]]), draw(st.booleans())


def _isin(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _isin_args(dtype)


def _random_fill_call(kind: str) -> Callable[..., Any]:
    """An in-place random fill's properties for any stream: the dtype kept, every value
    in the fill's range (uniform_ in [-1, 2), random_ the integers 0..4, exponential_
    above 0, normal_ finite), and a plausible share below the median."""

    def call(x: torch.Tensor, p: float) -> torch.Tensor:
        y = x.clone()
        if kind == "uniform":
            y.uniform_(-1.0, 2.0)
        elif kind == "normal":
            y.normal_(1.0, 2.0)
        elif kind == "random":
            y.random_(0, 5)
        else:
            y.exponential_(2.0)
        with registry.running():
            v = y.double()
            ok = {"uniform": (v >= -1) & (v < 2), "normal": torch.isfinite(v),
                  "random": (v >= 0) & (v <= 4) & (v == v.round()),
                  "exponential": (v > 0) & torch.isfinite(v)}[kind]
            median = {"uniform": 0.5, "normal": 1.0, "random": 2.5, "exponential": 0.3466}
            q = 0.6 if kind == "random" else 0.5  # random_: 0, 1, 2 of 0..4
            below = int((v < median[kind]).sum())
            return torch.tensor([bool(ok.all()), y.dtype == x.dtype,
                                 _plausible(below, v.numel(), q)])

    return call


@st.composite
def _weights_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    shape = draw(st.sampled_from([(5,), (3, 7), (2, 40)]))
    w = draw(tensors(shape=shape, dtypes=[dtype])).abs()
    w[..., draw(st.integers(0, shape[-1] - 1))] = 1.0  # a positive weight in every row
    return w, draw(st.integers(1, 4)), draw(st.booleans())


def _weights(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _weights_args(dtype)


def _multinomial_call(w: torch.Tensor, num: int, replacement: bool) -> torch.Tensor:
    """``multinomial``'s properties for any stream: int64 indices of the right shape,
    each of a positive weight, distinct within a row without replacement."""
    with registry.running():
        num = num if replacement else min(num, int((w > 0).sum(-1).min()))
    x = torch.multinomial(w, num, replacement)
    with registry.running():
        rows, xs = w.reshape(-1, w.shape[-1]), x.reshape(-1, num)
        distinct = replacement or all(len(set(r.tolist())) == num for r in xs)
        return torch.tensor([x.dtype == torch.int64, x.shape == (*w.shape[:-1], num),
                             bool((rows.gather(1, xs) > 0).all()), distinct])


CASES: tuple[Case, ...] = (
    Case("add", _binary, torch.add, ("add",)),
    Case("sub", _binary, torch.sub, ("sub",)),
    Case("mul", _binary, torch.mul, ("mul",)),
    Case("div", _binary, torch.div, ("div",)),
    Case("neg", _unary(), torch.neg, ("neg",)),
    Case("exp", _unary(), torch.exp, ("exp",)),
    Case("sigmoid", _unary(), torch.sigmoid, ("sigmoid",)),
    Case("silu", _unary(), F.silu, ("silu",)),
    Case("gelu", _unary(), F.gelu, ("gelu",)),
    Case("sum", _over_dims, torch.sum, ("sum",), _reduced),
    Case("mean", _over_dims, torch.mean, ("mean",), _reduced),
    Case("amax", _over_dims, torch.amax, ("amax",), _reduced),
    Case("argmax", _along_dim(False), torch.argmax, ("argmax",), _reduced),
    Case("softmax", _along_dim(True), torch.softmax, ("_softmax",), _reduced),
    Case("log_softmax", _along_dim(True), torch.log_softmax, ("_log_softmax",), _reduced),
    Case(
        "layer_norm",
        _norm(bias=True),
        lambda x, w, b: F.layer_norm(x, w.shape, w, b, 1e-5),
        ("native_layer_norm",),
        _last,
    ),
    Case(
        "rms_norm",
        _norm(bias=False),
        lambda x, w: F.rms_norm(x, w.shape, w, 1e-6),
        ("_fused_rms_norm",),
        _last,
    ),
    Case("mm", _mm("mm"), torch.mm, ("mm",), _k),
    Case("addmm", _mm("addmm"), torch.addmm, ("addmm",), _k),
    Case("bmm", _mm("bmm"), torch.bmm, ("bmm",), _k),
    Case("embedding", _embedding, F.embedding, ("embedding",)),
    Case("attention", _attention,
         lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
         ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"),
         lambda args: int(args[1].shape[2])),
    Case("gather", _gather, torch.gather, ("gather",)),
    Case("index_select", _select, torch.index_select, ("index_select",)),
    Case("tril", _tril, torch.tril, ("tril",)),
    Case("pad", _pad, lambda x, pads, value: F.pad(x, pads, value=value),
         ("constant_pad_nd",)),
    Case("cast", _cast, lambda x: x.to(torch.float32).to(torch.bfloat16), ("_to_copy",)),
    Case("floor", _unary(), torch.floor, ("floor",)),
    Case("cumsum", _along_dim(False), torch.cumsum, ("cumsum",), _reduced),
    *(Case(name, _unary(), getattr(torch, name), (name,))
      for name in ("log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "relu", "abs")),
    Case("maximum", _binary, torch.maximum, ("maximum",)),
    Case("pow", _binary, torch.pow, ("pow",)),
    Case("lt", _binary, torch.lt, ("lt",)),
    Case("prod", _along_dim(False), torch.prod, ("prod",), _reduced),
    Case("amin", _over_dims, torch.amin, ("amin",), _reduced),
    Case("argmin", _along_dim(False), torch.argmin, ("argmin",), _reduced),
    Case("var_mean", _along_dim(False), torch.var_mean, ("var_mean",), _reduced),
    Case("any", _along_dim(True), torch.any, ("any",)),
    Case("scatter_add", _scatter, torch.scatter_add, ("scatter_add",), lambda args: 9),
    Case("topk", _topk, lambda x, k: torch.topk(x, k).values, ("topk",)),
    Case("triu", _tril, torch.triu, ("triu",)),
    Case("cat", _cat, lambda a, b, dim: torch.cat([a, b], dim), ("cat",)),
    Case(
        "cross_entropy",
        _cross_entropy,
        F.cross_entropy,
        ("cross_entropy_loss", "nll_loss_forward"),
        lambda args: int(args[0].numel()),
    ),
    # The second pass (issue 27): every op `gemsops ops` lists.
    *(Case(name, _unary(), getattr(torch, name), (name,))
      for name in ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan",
                   "erf", "erfc", "erfinv", "exp2", "expm1", "log10", "log1p", "log2",
                   "ceil", "trunc", "frac", "round", "sgn", "sign", "signbit",
                   "isinf", "isnan", "isneginf", "isposinf", "logical_not")),
    # inf becomes the largest value of the input's dtype: the reference is torch's call in
    # that dtype (the drawn values are exact in float64 and back).
    Case("nan_to_num", _with_dtype, lambda x, dtype: torch.nan_to_num(x.to(dtype)),
         ("nan_to_num",)),
    Case("round_decimals", _unary(), lambda x: torch.round(x, decimals=2), ("round",)),
    *(Case(name, _unary(), getattr(F, name), (name,))
      for name in ("elu", "hardsigmoid", "hardswish", "hardtanh", "leaky_relu", "mish",
                   "softplus")),
    Case("threshold", _unary(), lambda x: F.threshold(x, 0.5, -2.0), ("threshold",)),
    *(Case(f"{name}_backward", _unary_grad(), _grad_of(fn), (f"{name}_backward",))
      for name, fn in (("gelu", F.gelu), ("silu", F.silu), ("sigmoid", torch.sigmoid),
                       ("tanh", torch.tanh), ("elu", F.elu), ("hardsigmoid", F.hardsigmoid),
                       ("hardswish", F.hardswish), ("hardtanh", F.hardtanh),
                       ("leaky_relu", F.leaky_relu), ("mish", F.mish),
                       ("softplus", F.softplus))),
    Case("gelu_tanh_backward", _unary_grad(),
         _grad_of(lambda x: F.gelu(x, approximate="tanh")), ("gelu_backward",)),
    Case("threshold_backward", _unary_grad(), _grad_of(torch.relu), ("threshold_backward",)),
    *(Case(name, _binary, getattr(torch, name), (name,))
      for name in ("minimum", "atan2", "copysign", "fmax", "fmin", "fmod", "hypot",
                   "logaddexp", "logaddexp2", "remainder", "xlogy", "heaviside", "rsub",
                   "eq", "ne", "le", "ge", "gt", "logical_and", "logical_or", "logical_xor")),
    # The next float32 value, not float64's: the reference is torch's float32 call.
    Case("nextafter", _binary, lambda a, b: torch.nextafter(a.float(), b.float()),
         ("nextafter",), dtypes=(torch.float32,)),
    Case("clamp", _binary,
         lambda a, b: (torch.clamp(a, -0.5, 0.5), torch.clamp(a, min=b), torch.clamp(a, max=b)),
         ("clamp",)),
    Case("clamp_min", _binary, lambda a, b: (torch.clamp_min(a, b), torch.clamp_min(a, -0.25)),
         ("clamp_min",)),
    Case("clamp_max", _binary, lambda a, b: (torch.clamp_max(a, b), torch.clamp_max(a, 0.25)),
         ("clamp_max",)),
    Case("lerp", _ternary, lambda a, b, w: (torch.lerp(a, b, 0.3), torch.lerp(a, b, w)),
         ("lerp",)),
    Case("where", _where, torch.where, ("where",)),
    Case("masked_fill", _masked, lambda x, mask, src: x.masked_fill(mask, -2.5),
         ("masked_fill",)),
    Case("masked_scatter", _masked, lambda x, mask, src: x.masked_scatter(mask, src),
         ("masked_scatter",)),
    *(Case(name, _binary, getattr(torch, name), (name,), dtypes=INT_DTYPES)
      for name in ("bitwise_and", "bitwise_or", "bitwise_xor")),
    Case("bitwise_not", _unary(), torch.bitwise_not, ("bitwise_not",), dtypes=INT_DTYPES),
    Case("bitwise_left_shift", _shifts(False), torch.bitwise_left_shift,
         ("bitwise_left_shift",), dtypes=INT_DTYPES),
    Case("bitwise_right_shift", _shifts(False), torch.bitwise_right_shift,
         ("bitwise_right_shift",), dtypes=INT_DTYPES),
    Case("__lshift__", _shifts(False), lambda a, b: a << b, ("__lshift__",), dtypes=INT_DTYPES),
    Case("__rshift__", _shifts(False), lambda a, b: a >> b, ("__rshift__",), dtypes=INT_DTYPES),
    Case("__ilshift__", _shifts(True), lambda a, b: a.clone().__ilshift__(b), ("__ilshift__",),
         dtypes=INT_DTYPES),
    Case("__irshift__", _shifts(True), lambda a, b: a.clone().__irshift__(b), ("__irshift__",),
         dtypes=INT_DTYPES),
    Case("all", _along_dim(True), torch.all, ("all",)),
    Case("max", _along_dim(False), lambda x, dim: tuple(torch.max(x, dim)), ("max",), _reduced),
    Case("min", _along_dim(False), lambda x, dim: tuple(torch.min(x, dim)), ("min",), _reduced),
    Case("var", _over_dims, torch.var, ("var",), _reduced),
    Case("std", _over_dims, torch.std, ("std",), _reduced),
    Case("std_mean", _over_dims, torch.std_mean, ("std_mean",), _reduced),
    Case("linalg_vector_norm", _vector_norm,
         lambda x, dims, order: torch.linalg.vector_norm(x, order, dims),
         ("linalg_vector_norm",), _reduced),
    Case("norm", _vector_norm,
         lambda x, dims, order: torch.ops.aten.norm.ScalarOpt_dim(x, order, dims),
         ("norm",), _reduced),
    # Stable, so the indices of equal values are determined; the default sort's values.
    Case("sort", _sort,
         lambda x, dim, descending: (
             *torch.sort(x, dim=dim, descending=descending, stable=True),
             torch.sort(x, dim=dim, descending=descending).values),
         ("sort",)),
    Case("index", _select, lambda x, dim, idx: x[(slice(None),) * dim + (idx,)], ("index",)),
    Case("index_add", _index_add, torch.index_add, ("index_add",), lambda args: 7),
    Case("index_put", _index_put,
         lambda x, idx, v, acc: torch.index_put(x, (idx,), v, acc), ("index_put",),
         lambda args: 7),
    Case("_index_put_impl", _index_put, _setitem, ("_index_put_impl",), lambda args: 7),
    Case("scatter", _scatter_unique,
         lambda x, dim, idx, src: (torch.scatter(x, dim, idx, src),
                                   torch.scatter(x, dim, idx, -1.5)),
         ("scatter",)),
    Case("arange", _arange, _arange_call, ("arange",)),
    Case("fill", _fill, _fill_call, ("fill",)),
    Case("zero", _unary(), lambda x: x.clone().zero_(), ("zero",)),
    Case("clone", _unary(), torch.clone, ("clone",)),
    Case("copy", _copy, lambda dst, src: dst.clone().copy_(src), ("copy",)),
    Case("convolution", _conv(False), _conv_call, ("convolution",), lambda args: int(
        args[1][0].numel())),
    Case("convolution_backward", _conv(True), _conv_backward, ("convolution_backward",),
         _conv_reduce),
    Case("softmax_backward", _along_dim_grad, _dim_grad_of(torch.softmax),
         ("_softmax_backward_data",), _reduced),
    Case("log_softmax_backward", _along_dim_grad, _dim_grad_of(torch.log_softmax),
         ("_log_softmax_backward_data",), _reduced),
    Case("layer_norm_backward", _norm_grad(bias=True), _layer_norm_grad,
         ("native_layer_norm_backward",), _reduced_all),
    Case("rms_norm_backward", _norm_grad(bias=False), _rms_norm_grad,
         ("_fused_rms_norm_backward",), _reduced_all, unregistered=True),
    Case("attention_backward", _attention_grad, _attention_backward,
         ("_scaled_dot_product_flash_attention_backward",
          "_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_cudnn_attention_backward",
          "_scaled_dot_product_flash_attention_for_cpu_backward"),
         lambda args: int(max(args[0].shape[2], args[1].shape[2]) * args[0].shape[3])),
    Case("embedding_backward", _embedding_grad, _embedding_backward,
         ("embedding_dense_backward",), lambda args: max(1, int(args[0].numel()))),
    Case("nll_loss_backward", _cross_entropy, _nll_backward,
         ("nll_loss_backward", "_log_softmax_backward_data"),
         lambda args: int(args[0].numel())),
    Case("slice_backward", _sliced(False), _slice_backward, ("slice_backward",)),
    Case("select_backward", _sliced(True), _slice_backward, ("select_backward",)),
    *(Case(f"_foreach_{name}", _lists(2), _foreach_binary(name), (f"_foreach_{name}",))
      for name in ("add", "sub", "mul", "div", "maximum", "minimum")),
    *(Case(f"_foreach_{name}", _lists(1, positive=name == "sqrt"), _foreach_unary(name),
           (f"_foreach_{name}",))
      for name in ("neg", "reciprocal", "sqrt")),
    *(Case(f"_foreach_{name}", _lists(3), _foreach_pointwise(name), (f"_foreach_{name}",))
      for name in ("addcmul", "addcdiv")),
    Case("_foreach_lerp", _lists(3), _foreach_lerp, ("_foreach_lerp",)),
    Case("_foreach_copy", _lists(2), _foreach_copy, ("_foreach_copy",)),
    Case("_foreach_zero", _lists(1), _foreach_zero, ("_foreach_zero",)),
    *(Case(f"fused_{kind}", _lists(2), _optimizer_step(kind), (f"_fused_{kind}",))
      for kind in ("adamw", "adam", "sgd")),
    Case("bernoulli", _random, _bernoulli_call, ("bernoulli",)),
    Case("native_dropout", _random, _dropout_call, ("native_dropout",)),
    Case("native_dropout_backward", _dropout_backward,
         torch.ops.aten.native_dropout_backward.default, ("native_dropout_backward",)),
    Case("isin", _isin, lambda x, t, invert: torch.isin(x, t, invert=invert), ("isin",),
         dtypes=(*FLOAT_DTYPES, *INT_DTYPES)),
    *(Case(f"{kind}_", _random, _random_fill_call(kind), (f"{kind}",))
      for kind in ("uniform", "normal", "random", "exponential")),
    Case("multinomial", _weights, _multinomial_call, ("multinomial",)),
)
"""The ops checked, one line each."""

UNCHECKED: dict[str, str] = {}
"""Ops ``gemsops ops`` lists that no case checks, each with the reason (none now: every
served op has a case above). tests/test_selftest.py fails for an op in neither."""


# Running one (op, dtype).


def _describe(args: Args) -> str:
    parts = []
    for value in args:
        if isinstance(value, torch.Tensor):
            layout = "" if value.is_contiguous() else f" strides {tuple(value.stride())}"
            parts.append(f"tensor{tuple(value.shape)} {str(value.dtype)[6:]}{layout}")
        elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
            parts.append(f"[{_describe(tuple(value))}]")
        else:
            parts.append(repr(value))
    return ", ".join(parts)


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = "; ".join(lines) or type(error).__name__
    if not isinstance(error, AssertionError):
        text = f"{type(error).__name__}: {text}"
    return text[:300]


def _compare(actual: Any, expected: Any, reduce_size: int) -> None:
    if isinstance(actual, (tuple, list)):
        assert isinstance(expected, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _compare(a, e, reduce_size)
        return
    assert isinstance(actual, torch.Tensor), f"returned {type(actual).__name__}"
    assert actual.dtype == expected.dtype or expected.dtype == torch.float64, (
        f"dtype {actual.dtype}, torch gives {expected.dtype}"
    )
    assert_close(actual, expected, reduce_size=reduce_size)


def _mismatch(case: Case, args: Args, tally: registry.CallRecord) -> str | None:
    """Why gemsops' result for ``args`` differs from torch's, or None when it matches.

    Call inside ``use_gems()``: the reference and the comparison run as gemsops' own
    work, so torch's kernels serve them and record() does not count them. The calls
    gemsops served or handed back are added to ``tally`` unless torch refuses the inputs.
    """
    with registry.record() as rec:
        try:
            actual = case.call(*args)
        except Exception as error:  # a gemsops error, or torch's on a call handed back
            actual = error
    with registry.running():  # torch's kernels compute the reference and compare
        try:
            if case.unregistered:
                with registry.use_gems(include=()):
                    expected = reference(case.call, *args)
            else:
                expected = reference(case.call, *args)
        except Exception:
            return None  # torch refuses these inputs too: not a property of gemsops
        tally.served.update(rec.served)
        tally.fallbacks.update(rec.fallbacks)
        tally.overrides.update(rec.overrides)
        if isinstance(actual, Exception):
            return _one_line(actual)
        try:
            _compare(actual, expected, case.reduce(args))
        except AssertionError as error:
            return _one_line(error)
    return None


@st.composite
def _drawn(draw: st.DrawFn, strategy: st.SearchStrategy[Args]) -> Args:
    # Inputs are made by torch's kernels: a broken gemsops kernel must not corrupt them.
    with registry.running():
        return draw(strategy)


def check(case: Case, dtype: torch.dtype, *, examples: int) -> Row:
    """Draw ``examples`` inputs of ``dtype`` for ``case`` and classify the op on this device."""
    name = str(dtype)[6:]
    caps = gemshal.current_vendor().capabilities
    if dtype == torch.bfloat16 and not caps.bf16:
        return Row(case.op, name, "not implemented", 0, "the vendor declares no bfloat16")
    calls = 0

    def fails(args: Args) -> bool:
        nonlocal calls
        calls += 1
        return _mismatch(case, args, rec) is not None

    rec = registry.CallRecord()
    with registry.use_gems() as served:
        if not any(registry.base_name(o) in case.aten for o in served):
            return Row(case.op, name, "not implemented", 0, "left to torch on this vendor")
        try:
            smallest = find(
                _drawn(case.inputs(dtype)),
                fails,
                settings=settings(
                    max_examples=examples,
                    database=None,
                    deadline=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except NoSuchExample:
            smallest = None
        failure = None if smallest is None else _mismatch(case, smallest, rec)
    ops = tuple(sorted({registry.base_name(o) for o in rec.served}))
    if smallest is not None:
        detail = failure or "failed once, then passed on the same inputs (flaky)"
        return Row(case.op, name, "failed", calls, detail, _describe(smallest), ops)
    reasons = sorted({reason for (_, reason) in rec.fallbacks})
    handed = sum(rec.fallbacks.values())
    if handed and not rec.served:
        return Row(case.op, name, "handed back", calls, "; ".join(reasons)[:300])
    if not rec.served:
        return Row(case.op, name, "not implemented", calls, "no example reached gemsops")
    notes = []
    if rec.overrides:
        by = sorted(set(rec.overrides.values()))
        notes.append("served by vendor override " + ", ".join(by))
    if handed:
        total = handed + sum(rec.served.values())
        notes.append(f"{handed} of {total} calls handed back: " + "; ".join(reasons))
    return Row(case.op, name, "passed", calls, "; ".join(notes)[:300], served=ops)


def run(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype] | None = None,
    *,
    examples: int = DEFAULT_EXAMPLES,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Check every case in each of its dtypes (those in ``dtypes`` when given)."""
    rows = []
    with warnings.catch_warnings():
        # The interpreter evaluates padding lanes (inf - inf) in numpy, which warns.
        warnings.simplefilter("ignore", RuntimeWarning)
        for case in cases:
            for dtype in case.dtypes:
                if dtypes is not None and dtype not in dtypes:
                    continue
                row = check(case, dtype, examples=examples)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


# The command line.

_OP_WIDTH = 14
"""The op column's width; wider when a checked case's name is longer."""


def _header(width: int = _OP_WIDTH) -> str:
    return f"{'op':<{width}} {'dtype':<9} {'outcome':<16} {'examples':>8}  detail"


def _line(row: Row, width: int = _OP_WIDTH) -> str:
    detail = row.detail
    if row.example:
        detail = f"{detail}\n{'':<{width + 36}}smallest example: {row.example}"
    return (f"{row.op:<{width}} {row.dtype:<9} {row.outcome:<16} {row.examples:>8}  "
            f"{detail}").rstrip()


def summary(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows ended in each outcome."""
    return {outcome: sum(r.outcome == outcome for r in rows) for outcome in OUTCOMES}


def add_parser(sub: Any) -> None:
    """Add the ``selftest`` subcommand to the gemsops command line."""
    p = sub.add_parser(
        "selftest", help="check which ops pass on this device (the test suite's properties)"
    )
    p.add_argument(
        "--ops",
        help=f"comma-separated case names to check (default: all {len(CASES)}, which cover "
        "every op `gemsops ops` lists; an unknown name prints the known ones)",
    )
    p.add_argument("--dtypes", help="comma-separated dtypes to check, e.g. bfloat16,float32")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"examples drawn per op and dtype (default: {DEFAULT_EXAMPLES})",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="benchmark every size bucket's configs, as GEMS_AUTOTUNE=all does (default: "
        "launch the tuning tables' configs, benchmarking nothing: the check is of results, "
        "and tuning every drawn shape would take most of its time)",
    )
    p.set_defaults(run=main)


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _selected(args: argparse.Namespace) -> tuple[list[Case], list[torch.dtype] | None]:
    """The cases and dtypes the arguments pick, or a one-line exit naming a bad value."""
    by_name = {case.op: case for case in CASES}
    ops = _names(args.ops)
    if ops is not None:
        bad = [op for op in ops if op not in by_name]
        if bad or not ops:
            raise SystemExit(
                f"gemsops selftest: unknown op(s) {bad}; known: {', '.join(sorted(by_name))}"
            )
    known = {str(d)[6:]: d for case in CASES for d in case.dtypes}
    names = _names(args.dtypes)
    dtypes = None
    if names is not None:
        names = [n.removeprefix("torch.") for n in names]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise SystemExit(
                f"gemsops selftest: unknown dtype(s) {bad}; known: {', '.join(sorted(known))}"
            )
        dtypes = [known[n] for n in names]
    if args.examples < 1:
        raise SystemExit(f"gemsops selftest: --examples must be at least 1, not {args.examples}")
    cases = list(CASES) if ops is None else [by_name[op] for op in dict.fromkeys(ops)]
    return cases, dtypes


def main(args: argparse.Namespace) -> int:
    """Run the self-test; print a row per op and dtype and a summary. 1 when any failed."""
    from gemsops.bench import output_problem

    problem = output_problem(args.json)
    if problem:
        raise SystemExit(f"gemsops selftest: {problem}")
    cases, dtypes = _selected(args)
    if AUTOTUNE_ENV not in os.environ:
        # This process only (the command exits after): --tune benchmarks every bucket as
        # a tuning run would; otherwise the tables' configs, nothing benchmarked.
        os.environ[AUTOTUNE_ENV] = "all" if getattr(args, "tune", False) else "0"
    dev = gemshal.current_device()
    print(f"gemsops selftest on {dev.vendor.display_name} ({dev.name}), {args.examples} examples")
    for overload, where in registry.overrides().items():
        print(f"vendor override: {overload} <- {where}")
    width = max([_OP_WIDTH, *(len(case.op) for case in cases)])
    print(_header(width))
    start = time.perf_counter()
    rows = run(cases, dtypes, examples=args.examples,
               on_row=lambda row: print(_line(row, width), flush=True))
    counts = summary(rows)
    took = time.perf_counter() - start
    print(", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + f" ({took:.1f} s)")
    if args.json:
        result = {
            "device": dev.as_dict(),
            "examples": args.examples,
            "rows": [attrs.asdict(row) for row in rows],
            "summary": counts,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 1 if counts["failed"] else 0
