"""Property tests of index_put, masked_scatter and their in-place forms (gemsops/ops/index/put.py).

Drawn tensors (odd sizes, rank 1-4, transposed or sliced), index tensors on adjacent
dims (leading, or after full slices), negative indices, broadcasting indices and
values, duplicates with accumulate; compared with torch's own index_put.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.index.put import (
    _index_put_impl_,
    index_put,
    index_put_,
    masked_scatter,
    masked_scatter_,
)
from gemsops.registry import implementations
from gemsops.testing.strategies import FLOAT_DTYPES, INT_DTYPES, tensors, to_target
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.bool)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


@st.composite
def puts(draw: st.DrawFn, unique: bool) -> tuple[torch.Tensor, list[Any], torch.Tensor]:
    """(self, indices, values): index tensors on adjacent dims of ``self``; with
    ``unique`` every indexed position is distinct (torch's result is then defined)."""
    x = draw(tensors(dtypes=DTYPES, specials=True, min_rank=1, max_rank=4))
    rank = x.dim()
    first = draw(st.integers(0, rank - 1))
    count = draw(st.integers(1, rank - first))
    sizes = x.shape[first:first + count]
    total = math.prod(sizes)
    if total == 0:
        bshape: tuple[int, ...] = (0,)
        shapes = [bshape] * count
        coords = [torch.zeros(0, dtype=torch.int64)] * count
    elif unique:
        n = draw(st.integers(1, min(total, 6)))
        bshape = (n,)
        shapes = [bshape] * count
        rest = torch.tensor(draw(st.permutations(range(total)))[:n])
        coords = []
        for size in reversed(sizes):
            coords.append(rest % size)
            rest = rest // size
        coords.reverse()
    else:
        # The first index varies along rows, the others along columns: they broadcast;
        # a few positions drawn many times make duplicates.
        n = draw(st.integers(1, 8))
        m = draw(st.integers(1, 3))
        bshape = (n, m) if count > 1 else (n,)
        shapes = [(n, 1)] + [(1, m)] * (count - 1) if count > 1 else [(n,)]
        coords = [torch.tensor(draw(st.lists(st.integers(0, min(size, 3) - 1),
                                             min_size=math.prod(shape),
                                             max_size=math.prod(shape))))
                  for shape, size in zip(shapes, sizes, strict=True)]
    indices: list[Any] = [None] * first
    for c, shape, size in zip(coords, shapes, sizes, strict=True):
        if c.numel() and draw(st.booleans()):
            c = c - size  # negative indices count from the end
        dtype = draw(st.sampled_from((torch.int64, torch.int32)))
        indices.append(to_target(c.reshape(shape).to(dtype)))
    result = (*x.shape[:first], *bshape, *x.shape[first + count:])
    vshape = draw(st.sampled_from((result, result[-1:], ())))
    values = draw(tensors(shape=vshape, dtypes=[x.dtype], specials=not x.dtype.is_floating_point))
    return x, indices, values


@settings(max_examples=25)
@given(case=puts(unique=True))
def test_index_put_matches_torch(case: tuple[torch.Tensor, list[Any], torch.Tensor]) -> None:
    """Writing broadcast values at distinct positions (adjacent index dims, negative
    indices, full slices before them) gives torch's tensor exactly, in every form:
    index_put (a copy), index_put_ and _index_put_impl_ (in place, strided self)."""
    x, indices, values = case
    expected = torch.ops.aten.index_put.default(x.cpu(), [None if t is None else t.cpu()
                                                         for t in indices], values.cpu())
    _same(index_put(x, indices, values), expected)
    for fn in (index_put_, _index_put_impl_):
        y = x.clone()
        assert fn(y, indices, values) is y
        _same(y, expected)


@settings(max_examples=25)
@given(case=puts(unique=False))
def test_index_put_accumulates_duplicates(case: tuple[torch.Tensor, list[Any],
                                                      torch.Tensor]) -> None:
    """With accumulate, broadcasting index tensors naming one position several times add
    every value there, as torch does (float sums in any order: within tolerance)."""
    x, indices, values = case
    cpu_indices = [None if t is None else t.cpu() for t in indices]
    expected = torch.ops.aten.index_put.default(x.cpu(), cpu_indices, values.cpu(), True)
    actual = index_put(x, indices, values, True)
    if x.dtype.is_floating_point:
        exact = torch.ops.aten.index_put.default(x.cpu().double(), cpu_indices,
                                                 values.cpu().double(), True)
        assert_close(actual, exact, reduce_size=8)
    else:
        _same(actual, expected)
    y = x.clone()
    index_put_(y, indices, values, True)
    if x.dtype.is_floating_point:
        assert_close(y, exact, reduce_size=8)
    else:
        _same(y, expected)


def test_setitem_and_out_are_served_and_refusals_hand_back() -> None:
    """``x[i, j] = v`` and ``x[i] += v`` reach gemsops (_index_put_impl_, index_put_) when
    enabled; index_put.out writes into out; a bool mask, values of another dtype and
    index tensors on dims that are not adjacent are handed back; an index out of range
    raises torch's IndexError on the CPU."""
    gen = torch.Generator().manual_seed(4)
    x = to_target(torch.randn(5, 6, generator=gen))
    i = to_target(torch.tensor([0, 3, -1]))
    j = to_target(torch.tensor([1, 1, 5]))
    v = to_target(torch.randn(3, generator=gen))
    ours, theirs = x.clone(), x.clone().cpu()
    with gemsops.record() as rec, gemsops.use_gems(include=["_index_put_impl_.default",
                                                           "index_put_.default"]):
        ours[i, j] = v
        ours.index_put_((i,), v[:, None], accumulate=True)
    theirs[i.cpu(), j.cpu()] = v.cpu()
    theirs.index_put_((i.cpu(),), v.cpu()[:, None], accumulate=True)
    assert sum(rec.served.values()) == 2 and not rec.fallbacks, (rec.served, rec.fallbacks)
    assert_close(ours, theirs.double(), reduce_size=2)
    out = torch.empty(0, device=DEVICE)
    assert implementations()["index_put.out"](x, [i], v[:, None], out=out) is out
    _same(out, x.cpu().index_put((i.cpu(),), v.cpu()[:, None]))
    with pytest.raises(Unsupported, match="bool"):
        index_put(x, [x > 0], to_target(torch.tensor(1.0)))
    with pytest.raises(Unsupported, match="dtype"):
        index_put(x, [i], v.double()[:, None])
    with pytest.raises(Unsupported, match="adjacent"):
        index_put(torch.zeros(2, 3, 4, device=DEVICE), [i[:1], None, i[:1]],
                  torch.zeros(1, 3, device=DEVICE))
    if DEVICE.type == "cpu":
        with pytest.raises(IndexError):
            index_put(x, [torch.tensor([5])], v[:1])


@settings(max_examples=25)
@given(x=tensors(dtypes=DTYPES, specials=True), data=st.data())
def test_masked_scatter_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """masked_scatter (a copy) and masked_scatter_ (in place) fill the masked positions,
    in order, with source's leading elements, as torch does, the mask broadcasting from
    a suffix of self's shape; too short a source is handed back to torch, and so is an
    empty one off the CPU (checking it would need a sync)."""
    drop = data.draw(st.integers(0, x.dim()))
    mask_shape = x.shape[drop:]
    flags = data.draw(st.lists(st.booleans(), min_size=math.prod(mask_shape),
                               max_size=math.prod(mask_shape)))
    mask = to_target(torch.tensor(flags, dtype=torch.bool).reshape(mask_shape))
    full = int(mask.expand(x.shape).sum())
    extra = data.draw(st.integers(0, 3))
    source = data.draw(tensors(shape=(full + extra,), dtypes=[x.dtype], specials=True))
    expected = x.cpu().masked_scatter(mask.cpu(), source.cpu())
    if not source.numel() and x.numel() and DEVICE.type != "cpu":
        # Whether an empty source is short needs the mask's count: a sync, so torch's.
        with pytest.raises(Unsupported, match="empty source"):
            masked_scatter(x, mask, source)
        return
    _same(masked_scatter(x, mask, source), expected)
    y = x.clone()
    assert masked_scatter_(y, mask, source) is y
    _same(y, expected)
    if full and DEVICE.type == "cpu":
        with pytest.raises(Unsupported, match="fewer source elements"):
            masked_scatter(x, mask, source[:full - 1])


def test_masked_scatter_out_and_refusals() -> None:
    """masked_scatter.out writes torch's answer into out; a uint8 mask and a source of
    another dtype are handed back."""
    gen = torch.Generator().manual_seed(5)
    x = to_target(torch.randn(3, 4, generator=gen))
    mask = x > 0
    source = to_target(torch.randn(12, generator=gen))
    out = torch.empty(0, device=DEVICE)
    assert implementations()["masked_scatter.out"](x, mask, source, out=out) is out
    _same(out, x.cpu().masked_scatter(mask.cpu(), source.cpu()))
    with pytest.raises(Unsupported, match="bool"):
        masked_scatter(x, mask.to(torch.uint8), source)
    with pytest.raises(Unsupported, match="dtype"):
        masked_scatter(x, mask, source.double())
