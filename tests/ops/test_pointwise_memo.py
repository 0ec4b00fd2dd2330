"""The pointwise plan memo: a call whose key was seen replays the kept plan with its own
operands, and calls the memo must not take are decided afresh.

The key is what the pointwise host code reads (op, dtypes, shapes, strides, devices,
alignment, numbers' types and values). These tests call a served op twice with
operands of one key and different values, and check the second answer is torch's for
the second operands, with the kept plan used (the deciding code is made to fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemsops.errors import Unsupported
from gemsops.ops.pointwise import arith as pw
from gemsops.ops.pointwise import iterator
from gemsops.testing.strategies import broadcast_pair, target_device

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    iterator.clear_memo()
    yield
    iterator.clear_memo()


def _no_deciding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the call was decided afresh, not replayed from the memo")

    monkeypatch.setattr(iterator, "_decide", refuse)


def _like(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A tensor with ``x``'s dtype, shape, strides and alignment, other values."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.empty(x.untyped_storage().nbytes() // x.element_size() + 1, dtype=x.dtype)
    base.copy_(torch.randn(base.shape, generator=gen).to(x.dtype))
    y = base.as_strided(x.shape, x.stride(), x.storage_offset()).to(x.device)
    if y.stride() != x.stride():  # .to() made it contiguous: rebuild the view there
        b = base.to(x.device)
        y = b.as_strided(x.shape, x.stride(), x.storage_offset())
    return y


def _operand(shape: tuple[int, ...], dtype: torch.dtype, transposed: bool,
             seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape[::-1] if transposed else shape, generator=gen).to(dtype)
    x = x.to(target_device())
    return x.permute(tuple(range(x.dim() - 1, -1, -1))) if transposed else x


@settings(max_examples=25, deadline=None)
@given(pair=broadcast_pair(max_rank=3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.int32]),
       transposed=st.booleans(), scalar=st.sampled_from([None, 2, -0.5]))
def test_replay_computes_from_the_new_operands(
    pair: tuple[tuple[int, ...], tuple[int, ...]], dtype: torch.dtype, transposed: bool,
    scalar: float | None,
) -> None:
    """Property: a second call with operands of the first call's key (broadcast shapes,
    transposed layouts, a number) equals torch's answer for the second operands, dtype,
    shape and layout included, and the memo answered it (deciding is disabled)."""
    iterator.clear_memo()
    a = _operand(pair[0], dtype, transposed, 1)
    b = _operand(pair[1], dtype, False, 2)
    other: Any = b if scalar is None else scalar
    first = pw.mul(a, other)
    assert torch.equal(first, a * other)
    a2, b2 = _like(a, 3), _like(b, 4)
    other2: Any = b2 if scalar is None else scalar
    cpu_scalar = any(t.dim() == 0 and t.device.type == "cpu" for t in (a, b))
    with pytest.MonkeyPatch.context() as mp:
        if not cpu_scalar:  # a 0-dim CPU tensor is read as a number: decided each time
            _no_deciding(mp)
        second = pw.mul(a2, other2)
    want = a2 * other2
    assert second.dtype == want.dtype and second.shape == want.shape
    assert second.stride() == first.stride()  # the layout the first call decided
    if second.numel() > 1:  # torch's layout, where a dim has more than one element
        assert [st for st, n in zip(second.stride(), second.shape, strict=True) if n > 1] == [
            st for st, n in zip(want.stride(), want.shape, strict=True) if n > 1]
    assert torch.equal(second, want)


def test_the_same_tensor_twice_then_two_tensors() -> None:
    """A plan kept from ``mul(x, x)`` serves ``mul(x, y)`` with y, not x again."""
    x = torch.randn(64, device=target_device())
    y = torch.randn(64, device=target_device())
    assert torch.equal(pw.mul(x, x), x * x)
    assert torch.equal(pw.mul(x, y), x * y)
    assert torch.equal(pw.mul(y, x), y * x)


def test_in_place_partial_overlap_is_still_refused() -> None:
    """A kept in-place plan does not serve an operand that now partly overlaps ``self``:
    the call is decided afresh, which refuses it as before (torch then answers)."""
    base = torch.zeros(12, device=target_device())
    other = torch.zeros(12, device=target_device())
    a = base[:8]
    pw.add(a, other[4:12], inplace=True, out=a)  # no overlap: kept
    pw.add(a, other[4:12], inplace=True, out=a)  # replayed
    with pytest.raises(Unsupported, match="overlap"):
        pw.add(a, base[4:12], inplace=True, out=a)


def test_in_place_on_self_reads_the_new_values() -> None:
    """``x.add_(y)`` replayed adds the current values of both."""
    x = torch.ones(32, device=target_device())
    y = torch.full((32,), 2.0, device=target_device())
    for step in range(3):
        pw.add(x, y, inplace=True, out=x)
        assert torch.equal(x, torch.full((32,), 1.0 + 2.0 * (step + 1), device=x.device))


def test_default_dtype_is_part_of_the_key() -> None:
    """An integer tensor times a float follows the default dtype of each call."""
    x = torch.arange(6, device=target_device())
    assert pw.mul(x, 1.5).dtype == torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = pw.mul(x, 1.5)
    finally:
        torch.set_default_dtype(before)
    assert got.dtype == torch.float64
    assert torch.equal(got.cpu(), torch.arange(6, dtype=torch.float64) * 1.5)


def test_cpu_scalar_tensors_are_decided_by_value() -> None:
    """A 0-dim CPU tensor is read as a number, so each value is decided afresh."""
    x = torch.randn(16, device=target_device())
    for v in (2.0, 3.0, -1.0):
        s = torch.tensor(v)
        assert torch.equal(pw.mul(x, s), x * s)


def test_numbers_of_another_value_are_another_key() -> None:
    """``x * 2`` and ``x * 3`` keep two plans and each answers with its own number."""
    x = torch.randn(16, device=target_device())
    for _ in range(2):
        assert torch.equal(pw.mul(x, 2), x * 2)
        assert torch.equal(pw.mul(x, 3), x * 3)


def test_an_empty_output_is_kept_without_a_launch() -> None:
    """A broadcast to zero elements replays as an empty tensor of torch's shape."""
    a = torch.randn(0, 3, device=target_device())
    b = torch.randn(1, 3, device=target_device())
    for _ in range(2):
        got = pw.mul(a, b)
        assert got.shape == (0, 3) and got.dtype == torch.float32


def test_out_tensor_replay_and_overlap() -> None:
    """A kept ``out=`` plan writes the new values into the new ``out``, and an operand
    that partly overlaps ``out`` (kept without one) is refused as before."""
    dev = target_device()
    a, b = torch.randn(8, device=dev), torch.randn(8, device=dev)
    for _ in range(2):
        o = torch.empty(8, device=dev)
        assert pw.add(a, b, out=o) is o and torch.equal(o, a + b)
    c = torch.randn(8, device=dev)
    o = torch.empty(8, device=dev)
    pw.add(a, c, out=o)
    assert torch.equal(o, a + c)
    store = torch.zeros(12, device=dev)
    with pytest.raises(Unsupported, match="overlap"):
        pw.add(a, store[4:12], out=store[:8])
    with pytest.raises(Unsupported, match="overlap"):
        pw.add(store[4:12], b, out=store[:8])


def test_an_out_tensor_that_is_resized_is_not_kept() -> None:
    """An ``out=`` of another shape is resized (torch's warning) on every call, not only
    the first: the resize is never replayed away."""
    dev = target_device()
    a = torch.randn(4, device=dev)
    for _ in range(2):
        o = torch.empty(0, device=dev)
        pw.add(a, 1, out=o)
        assert o.shape == (4,) and torch.equal(o, a + 1)


def test_casts_into_a_given_output_replay() -> None:
    """A dtype conversion (the copy into a given output) replayed converts the new
    values."""
    dev = target_device()
    for seed in range(3):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed)).to(dev).t()
        got = torch.ops.aten._to_copy.default(x, dtype=torch.float16)
        from gemsops import registry

        with registry.use_gems(), registry.record() as rec:
            mine = x.to(torch.float16)
        assert rec.served and not rec.fallbacks
        assert torch.equal(mine, got) and mine.stride() == got.stride()
