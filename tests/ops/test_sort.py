"""Property tests of sort (gemsops/ops/index/sort.py) against torch's stable sort.

Drawn shapes (empty, 0-dim, odd lengths, rank 0-4), dims, directions, dtypes, planted
inf / nan / -0.0, many ties, and transposed or sliced inputs: values and indices must be
torch's exactly (a stable sort has one answer).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.index.sort import MAX_LENGTH, sort
from gemsops.registry import implementations
from gemsops.testing.strategies import FLOAT_DTYPES, INT_DTYPES, tensors, to_target

DEVICE = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.uint8, torch.bool)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


def _check(x: torch.Tensor, dim: int, descending: bool) -> None:
    values, indices = sort(x, dim, descending)
    expected = torch.sort(x.cpu(), dim=dim, descending=descending, stable=True)
    _same(values, expected.values)
    _same(indices, expected.indices)


@settings(max_examples=30)
@given(x=tensors(dtypes=DTYPES, specials=True), data=st.data())
def test_sort_matches_torch_stable_sort(x: torch.Tensor, data: st.DataObject) -> None:
    """sort along any dim, ascending or descending, gives torch's stable sort's values and
    indices exactly: nan ranks largest, -0.0 and 0.0 tie, equal values keep their order."""
    rank = max(x.dim(), 1)
    dim = data.draw(st.integers(-rank, rank - 1))
    _check(x, dim, data.draw(st.booleans()))


@settings(max_examples=20)
@given(data=st.data())
def test_sort_keeps_the_order_of_ties(data: st.DataObject) -> None:
    """Rows drawn from a few values (many ties, nan and -0.0 among them), laid out
    transposed or sliced: indices of equal values stay ascending in either direction."""
    dtype = data.draw(st.sampled_from((torch.float32, torch.float16, torch.float64,
                                       torch.int64, torch.int16)))
    rows = data.draw(st.integers(1, 5))
    length = data.draw(st.integers(1, 70))
    pool = [0.0, -0.0, 1.0, -1.0, float("nan"), 2.0] if dtype.is_floating_point else [0, 1, -3]
    flat = data.draw(st.lists(st.sampled_from(pool), min_size=rows * length,
                              max_size=rows * length))
    base = torch.tensor(flat, dtype=torch.float64).to(dtype).reshape(rows, length)
    layout = data.draw(st.sampled_from(("contiguous", "transposed", "sliced")))
    if layout == "transposed":
        base = base.t().contiguous().t()
    elif layout == "sliced":
        base = torch.stack((base, base), -1)[..., 1]
    x = to_target(base)
    dim = data.draw(st.sampled_from((0, 1, -1)))
    _check(x, dim, data.draw(st.booleans()))


def test_out_forms_and_argsort_are_served() -> None:
    """sort.values / sort.values_stable write torch's answer into the out tensors; argsort
    (a composite over sort.stable) and torch.sort reach gemsops when it is enabled."""
    impl = implementations()
    x = to_target(torch.randn(4, 9, generator=torch.Generator().manual_seed(3)))
    expected = torch.sort(x.cpu(), dim=0, descending=True, stable=True)
    for name, kwargs in (("sort.values", {}), ("sort.values_stable", {"stable": True})):
        v = torch.empty(0, device=DEVICE)
        i = torch.empty(0, dtype=torch.int64, device=DEVICE)
        got = impl[name](x, **kwargs, dim=0, descending=True, values=v, indices=i)
        assert got[0] is v and got[1] is i
        _same(v, expected.values)
        _same(i, expected.indices)
    with gemsops.record() as rec, gemsops.use_gems(include=["sort"]):
        order = torch.argsort(x, dim=1, stable=True)
        values, _ = torch.sort(x)
    assert rec.served["sort.stable"] >= 1 and not rec.fallbacks
    _same(order, torch.argsort(x.cpu(), dim=1, stable=True))
    _same(values, torch.sort(x.cpu()).values)


def test_rows_beyond_the_kernel_and_complex_are_handed_back() -> None:
    """A row longer than the kernel sorts, and complex values, raise Unsupported (torch
    serves them) before anything is computed."""
    with pytest.raises(Unsupported, match=str(MAX_LENGTH)):
        sort(torch.zeros(2, MAX_LENGTH + 1, device=DEVICE))
    with pytest.raises(Unsupported):
        sort(torch.zeros(3, dtype=torch.complex64, device=DEVICE))
