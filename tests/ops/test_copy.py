"""Property tests of clone and cat (gemsops.ops.memory.copy).

Both are exact copies, so the reference is torch's own op on the same inputs, compared
bit for bit (nan included), together with the result's dtype, shape and strides: a
clone keeps torch's layout choice, a cat takes torch's promoted dtype and memory format.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.memory import copy
from gemsops.testing.strategies import (
    FLOAT_DTYPES,
    INT_DTYPES,
    any_layout,
    shapes,
    target_device,
    tensors,
)

DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.bool)
FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal values (bitwise up to nan), dtype, shape, strides and device."""
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.device == expected.device
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@st.composite
def _clone_inputs(draw: st.DrawFn) -> torch.Tensor:
    shape = draw(shapes(max_rank=4))
    return draw(any_layout(shape, draw(st.sampled_from(DTYPES))))


@settings(max_examples=30)
@given(x=_clone_inputs(), memory_format=st.sampled_from(FORMATS))
def test_clone_matches_torch(x: torch.Tensor, memory_format: torch.memory_format | None) -> None:
    """clone equals torch.clone: values, dtype and the strides of torch's layout choice."""
    expected = x.clone(memory_format=memory_format or torch.preserve_format)
    actual = copy.clone(x, memory_format=memory_format)
    _same(actual, expected)
    if actual.numel():
        assert actual.data_ptr() != x.data_ptr()


@given(x=tensors(shape=(), dtypes=DTYPES, specials=True))
def test_clone_zero_dim(x: torch.Tensor) -> None:
    """A 0-dim tensor clones to a 0-dim tensor of the same value (a CPU one as well)."""
    _same(copy.clone(x), x.clone())
    if target_device().type == "cpu":
        return
    with pytest.raises(Unsupported):
        copy.clone(x.cpu())  # a CPU scalar next to device kernels: torch's to copy


def test_clone_is_independent() -> None:
    """Writing to the clone leaves the source alone (new memory, not a view)."""
    x = torch.arange(6, dtype=torch.float32, device=target_device()).reshape(2, 3)
    y = copy.clone(x)
    y += 1
    assert torch.equal(x, torch.arange(6, dtype=torch.float32, device=x.device).reshape(2, 3))


@st.composite
def _cat_inputs(draw: st.DrawFn) -> tuple[list[torch.Tensor], int]:
    """Tensors of one rank, equal sizes off ``dim`` (maybe negative), maybe legacy empties."""
    base = list(draw(shapes(min_rank=1, max_rank=4, max_numel=128)))
    rank = len(base)
    dim = draw(st.integers(-rank, rank - 1))
    mixed = draw(st.booleans())  # several dtypes: the result is their promotion
    first = draw(st.sampled_from(DTYPES))
    out: list[torch.Tensor] = []
    for _ in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(DTYPES)) if mixed else first
        if draw(st.integers(0, 5)) == 0:
            out.append(torch.zeros(0, dtype=dtype, device=target_device()))  # skipped
            continue
        shape = list(base)
        shape[dim] = draw(st.sampled_from([0, 1, 2, 3, 5]))
        out.append(draw(any_layout(tuple(shape), dtype)))
    return out, dim


@settings(max_examples=30)
@given(inputs=_cat_inputs())
def test_cat_matches_torch(inputs: tuple[list[torch.Tensor], int]) -> None:
    """cat equals torch.cat: values, promoted dtype, shape and memory format, any dim."""
    tensors_, dim = inputs
    _same(copy.cat(tensors_, dim), torch.cat(tensors_, dim))


@settings(max_examples=15)
@given(dtypes=st.lists(st.sampled_from(DTYPES), min_size=2, max_size=4),
       dim=st.sampled_from([0, 1, -1, -2]))
def test_cat_promotes(dtypes: list[torch.dtype], dim: int) -> None:
    """The result dtype is the promotion of every input's (bool < ints < floats, as torch)."""
    gen = torch.Generator().manual_seed(len(dtypes))
    parts = [
        (torch.randn(3, 2, generator=gen) * 40).to(dt).to(target_device()) for dt in dtypes
    ]
    _same(copy.cat(parts, dim), torch.cat(parts, dim))


def test_cat_legacy_empty() -> None:
    """1-D (0,) tensors are skipped for shapes but count in the dtype, as torch's rule."""
    dev = target_device()
    x = torch.arange(6, dtype=torch.int32, device=dev).reshape(2, 3)
    e = torch.zeros(0, dtype=torch.float64, device=dev)
    for parts, dim in (([e, x], 1), ([x, e, x], -1), ([e], 0), ([e, e.int()], 3)):
        _same(copy.cat(parts, dim), torch.cat(parts, dim))


def test_cat_channels_last() -> None:
    """Channels-last inputs give a channels-last result; a contiguous one among them does not."""
    dev = target_device()
    x = torch.randn(2, 3, 4, 5, device=dev).to(memory_format=torch.channels_last)
    for parts in ([x, x], [x, x.contiguous()], [x[:, :, ::2], x[:, :, 1::2]]):
        _same(copy.cat(parts, 1), torch.cat(parts, 1))


def test_refusals() -> None:
    """What torch rejects, or the kernels do not take, raises Unsupported."""
    dev = target_device()
    x = torch.randn(2, 3, device=dev)
    bad_cats = (
        [],  # no tensors
        [x, torch.tensor(1.0, device=dev)],  # a 0-dim input
        [x, torch.randn(2, 4, device=dev)],  # sizes differ off dim 0
        [x, torch.randn(2, 3, 1, device=dev)],  # ranks differ
        [x, torch.empty(2, 3, device="meta")],  # mixed devices
        [x, torch.randn(2, 3, dtype=torch.complex64, device=dev)],  # complex
        [x.to_sparse()],  # a sparse layout
    )
    for parts in bad_cats:
        with pytest.raises(Unsupported):
            copy.cat(parts, 0)
    with pytest.raises(Unsupported):
        copy.cat([x, x], 2)  # dim out of range
    with pytest.raises(Unsupported):
        copy.clone(x.reshape(1, 2, 3, 1), memory_format=torch.channels_last)
    with pytest.raises(Unsupported):
        copy.clone(x.to(torch.complex64))
    with pytest.raises(Unsupported):
        copy.clone(torch.empty(3, device="meta"))


def test_served_through_aten() -> None:
    """torch.cat, Tensor.clone and the cat in chunk's backward are served by gemsops."""
    dev = target_device()
    x = torch.randn(4, 6, device=dev)
    w = torch.randn(4, 6, device=dev, requires_grad=True)
    with gemsops.use_gems(include=["clone", "cat"]), gemsops.record() as rec:
        c = torch.cat([x, x.t().contiguous().t(), torch.zeros(0, device=dev)], dim=-1)
        y = x.t().clone()
        z = x.clone(memory_format=torch.contiguous_format)
        q, k, v = w.chunk(3, dim=-1)
        (q * k + v).sum().backward()
    assert rec.served["cat.default"] >= 2, rec  # torch.cat and chunk's backward
    assert rec.served["clone.default"] >= 2, rec
    assert not rec.fallbacks, rec.fallback_ops()
    _same(c, torch.cat([x, x], dim=-1))
    _same(y, x.t().clone())
    _same(z, x)
    q, k, _ = w.detach().chunk(3, dim=-1)
    assert w.grad is not None
    _same(w.grad, torch.cat([k, q, torch.ones_like(q)], dim=-1))


def test_fallback_through_aten() -> None:
    """An input gemsops refuses (a channels-last clone) is handed to torch and counted."""
    x = torch.randn(2, 3, 4, 5, device=target_device())
    with gemsops.use_gems(include=["clone"]), gemsops.record() as rec:
        y = x.clone(memory_format=torch.channels_last)
    assert rec.fallbacks and not rec.served, rec
    _same(y, x.clone(memory_format=torch.channels_last))
