"""Strategies of the second pass (issue 27): every op ``gemsops ops`` lists.

Training: the backward ops (checked through ``torch.autograd.grad`` of their
forward), the ``_foreach_*`` ops and the fused optimizers (on lists of drawn tensors)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import strategies as st
from torch.nn import functional as F

from gemsops.selftest.inputs import _attention_args, _dim_args, _embedding_args, _norm_args
from gemsops.selftest.records import Args, Inputs
from gemsops.testing.strategies import tensors

_FOREACH_SHAPES = st.sampled_from([(), (1,), (5,), (3, 7), (16,), (2, 33)])


def _meta(shape: Sequence[int]) -> torch.Tensor:
    return torch.empty(tuple(shape), device="meta")


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
def _dropout_backward_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    g = draw(tensors(dtypes=[dtype], specials=True))
    mask = draw(tensors(shape=g.shape, dtypes=[torch.bool], layouts=False))
    return g, mask, draw(st.sampled_from([1.0, 1.25, 2.0, 5.0]))


def _dropout_backward(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _dropout_backward_args(dtype)


def _reduced_all(args: Args) -> int:
    return max(1, int(args[0].numel()))
