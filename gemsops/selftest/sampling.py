"""Strategies of the second pass (issue 27): every op ``gemsops ops`` lists.

The random ops, checked through properties that hold for any random stream
(gemsops draws its own Philox numbers, not torch's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from gemsops import registry
from gemsops.selftest.records import Args
from gemsops.testing.strategies import tensors
from gemsops.testing.tolerance import tolerance


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
