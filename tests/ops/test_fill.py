"""Property tests of fill_, zero_ and the factories zeros / ones / full.

Values are converted to the tensor's dtype as torch converts them (2.7 -> 2 for
integers, nonzero -> True for bool, float64 kept exact); strided tensors are filled in
place without touching the elements between them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.memory import fill
from gemsops.testing.strategies import FLOAT_DTYPES, INT_DTYPES, target_device, tensors

DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.float64, torch.int8, torch.bool)
values = st.one_of(
    st.booleans(),
    st.integers(-100, 100),
    st.sampled_from([2.7, -2.7, 0.1, -0.0, 1e-30, float("inf"), float("nan"), 1.0 + 2**-40]),
)


def _expected(x: torch.Tensor, value: Any) -> torch.Tensor | None:
    """torch's own fill_ on a copy, or None where torch refuses the value."""
    try:
        return x.clone().fill_(value)
    except RuntimeError:
        return None


@given(x=tensors(dtypes=DTYPES), value=values)
def test_fill_scalar(x: torch.Tensor, value: Any) -> None:
    """fill_ with a number writes torch's conversion of it to every element, in place."""
    expected = _expected(x, value)
    if expected is None:
        with pytest.raises(Unsupported):
            fill.fill_(x.clone(), value)
        return
    target = x.clone()
    assert fill.fill_(target, value) is target
    torch.testing.assert_close(target, expected, equal_nan=True, rtol=0, atol=0)


@given(x=tensors(dtypes=DTYPES), value=tensors(shape=(), dtypes=DTYPES, specials=True))
def test_fill_tensor(x: torch.Tensor, value: torch.Tensor) -> None:
    """fill_ with a 0-dim tensor (on the device or the CPU) converts it to self's dtype."""
    if x.dtype not in (*FLOAT_DTYPES, torch.float64, torch.bool) and value.dtype.is_floating_point:
        v = value.double().item()
        if not (abs(v) < 2**31):
            return  # a float out of an integer's range converts undefined (C), not tested
    v = value.double().item()
    if x.dtype.is_floating_point and math.isfinite(v) and abs(v) > torch.finfo(x.dtype).max:
        # torch's kernels disagree (CUDA refuses, the CPU gives inf): gemsops hands it back.
        with pytest.raises(Unsupported, match="overflows"):
            fill.fill_(x.clone(), value)
        return
    for v in (value, value.cpu()):
        target = x.clone()
        fill.fill_(target, v)
        torch.testing.assert_close(target, x.clone().fill_(v), equal_nan=True, rtol=0, atol=0)


def test_fill_strided_leaves_gaps() -> None:
    """Filling a strided view writes its elements only; the elements between keep their values."""
    base = torch.arange(24, dtype=torch.float32, device=target_device()).reshape(4, 6)
    expected = base.clone()
    expected[:, ::2] = 7.5
    fill.fill_(base[:, ::2], 7.5)
    torch.testing.assert_close(base, expected)
    t = torch.arange(12, device=target_device()).reshape(3, 4).t()
    fill.zero_(t)
    assert int(t.abs().sum()) == 0


def test_fill_refusals() -> None:
    """A value torch rejects (1-dim value, out of range, inf into ints) raises Unsupported."""
    x = torch.zeros(3, dtype=torch.int8, device=target_device())
    for value in (300, float("inf"), float("nan")):
        with pytest.raises(Unsupported):
            fill.fill_(x, value)
    with pytest.raises(Unsupported):
        fill.fill_(x, torch.ones(2))
    with pytest.raises(Unsupported):
        fill.fill_(torch.zeros(2, dtype=torch.complex64), 1.0)
    assert int(x.abs().sum()) == 0  # untouched


@given(size=st.lists(st.integers(0, 9), max_size=3), dtype=st.sampled_from((None, *DTYPES)),
       value=values)
def test_factories(size: list[int], dtype: torch.dtype | None, value: Any) -> None:
    """zeros / ones / full match torch's, dtype inference from the fill value included."""
    dev = target_device()
    torch.testing.assert_close(fill.zeros(size, dtype=dtype, device=dev),
                               torch.zeros(size, dtype=dtype, device=dev))
    torch.testing.assert_close(fill.ones(size, dtype=dtype, device=dev),
                               torch.ones(size, dtype=dtype, device=dev))
    try:
        expected = torch.full(size, value, dtype=dtype, device=dev)
    except RuntimeError:
        return
    torch.testing.assert_close(fill.full(size, value, dtype=dtype, device=dev), expected,
                               equal_nan=True, rtol=0, atol=0)


def test_factories_reach_fill_through_aten() -> None:
    """torch.zeros / ones / full / *_like (composite in aten) are served by zero_ and fill_."""
    dev = target_device()
    with gemsops.use_gems(include=["fill", "zero"]), gemsops.record() as rec:
        z = torch.zeros(3, 4, device=dev)
        o = torch.ones(5, dtype=torch.int32, device=dev)
        f = torch.full((2, 2), 2.5, dtype=torch.float16, device=dev)
        zl = torch.zeros_like(f)
    assert rec.served["zero_.default"] >= 2 and rec.served["fill_.Scalar"] >= 2, rec
    assert not rec.fallbacks, rec.fallback_ops()
    assert int((z == 0).sum()) == 12 and int((o == 1).sum()) == 5
    assert bool((f == 2.5).all()) and bool((zl == 0).all())


def test_impl_entries() -> None:
    """The served implementations fill in place and return self, as aten's do."""
    impls = gemsops.registry.implementations()
    x = torch.randn(5, 3, device=target_device())
    assert impls["fill_.Scalar"](x, 2.5) is x and bool((x == 2.5).all())
    assert impls["fill_.Tensor"](x, torch.tensor(-1)) is x and bool((x == -1).all())
    assert impls["zero_.default"](x) is x and bool((x == 0).all())
