"""Property tests of isin (every overload: tensor/tensor, tensor/number, number/tensor
and their out forms) against torch's own isin on the CPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.testing.strategies import target_device, tensors

DEV = target_device()
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64]


def _torch(*args: object, **kwargs: object) -> torch.Tensor:
    """torch's own isin, on the CPU."""
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    return torch.isin(*cpu, **kwargs)  # type: ignore[call-overload, no-any-return]


@st.composite
def _test_set(draw: st.DrawFn, elements: torch.Tensor) -> torch.Tensor:
    """Test elements of a drawn dtype: some taken from ``elements`` (so there are hits),
    some drawn (nan and -0.0 among them for floats), any size from 0 up to 100."""
    dtype = draw(st.sampled_from(DTYPES))
    drawn = draw(tensors(dtypes=[dtype], specials=True, max_rank=1))
    flat = elements.reshape(-1)
    picks = draw(st.lists(st.integers(0, max(0, flat.numel() - 1)), max_size=5))
    taken = flat[picks].to(dtype) if flat.numel() and dtype.is_floating_point else (
        flat[picks].clamp(-50, 50).to(dtype) if flat.numel() else flat[:0].to(dtype))
    test = torch.cat([drawn.reshape(-1), taken.to(DEV)])
    return test if draw(st.booleans()) else test.reshape(1, -1)


@given(data=st.data(), dtype=st.sampled_from(DTYPES), invert=st.booleans(),
       unique=st.booleans())
def test_isin_is_torchs(data: st.DataObject, dtype: torch.dtype, invert: bool,
                        unique: bool) -> None:
    """Property: isin(elements, test_elements, invert=, assume_unique=) equals torch's for
    any shape (0-size and 0-dim included) and layout, mixed dtypes (compared in the
    common dtype), test sets of 0 to ~100 elements, nan (never in a set) and -0.0;
    assume_unique does not change the answer."""
    elements = data.draw(tensors(dtypes=[dtype], specials=True))
    test = data.draw(_test_set(elements))
    got = gemsops.isin(elements, test, assume_unique=unique, invert=invert)
    # torch's sort path may answer wrongly for assume_unique=True on repeated values (its
    # contract); gemsops ignores the flag, so the answer is torch's without it.
    want = _torch(elements, test, invert=invert)
    assert got.dtype == torch.bool and got.shape == elements.shape and got.is_contiguous()
    assert torch.equal(got.cpu(), want)


@settings(max_examples=10)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), invert=st.booleans(),
       number=st.sampled_from([0, 3, -7, 2.5, -0.0, 1e30, float("nan"), float("inf")]))
def test_isin_with_a_number_is_torchs(data: st.DataObject, dtype: torch.dtype, invert: bool,
                                      number: float) -> None:
    """Property: isin(tensor, number) and isin(number, tensor) equal torch's, with the
    number converted as torch promotes it (a float number against integers compares in
    the default float dtype); a number the dtype cannot hold is handed back."""
    x = data.draw(tensors(dtypes=[dtype], specials=True))
    for args in ((x, number), (number, x)):
        try:
            got = gemsops.isin(*args, invert=invert)
        except Unsupported:
            continue  # torch serves it (an int8 tensor and 1e30)
        assert torch.equal(got.cpu(), _torch(*args, invert=invert))


def test_served_overloads_and_out() -> None:
    """Inside use_gems() every isin overload (the out forms included) is served by
    gemsops and gives torch's answer; bool operands are handed back (torch refuses them)."""
    e = torch.tensor([[1, 2, 3], [4, 5, 2]], device=DEV)
    t = torch.tensor([2, 5], device=DEV)
    out = torch.empty(2, 3, dtype=torch.bool, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        a = torch.isin(e, t)
        b = torch.isin(e, 2, invert=True)
        c = torch.isin(5, t)
        torch.isin(e, t, invert=True, out=out)
        with pytest.raises(RuntimeError):
            torch.isin(e.bool(), t.bool())
    assert torch.equal(a.cpu(), _torch(e, t))
    assert torch.equal(b.cpu(), _torch(e, 2, invert=True))
    assert bool(c) and c.dim() == 0
    assert torch.equal(out.cpu(), ~a.cpu())
    assert {"isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor",
            "isin.Tensor_Tensor_out"} <= set(rec.served)
    assert any(op == "isin.Tensor_Tensor" for op, _ in rec.fallbacks)


def test_large_test_sets_are_handed_back() -> None:
    """More than MAX_TEST test elements is handed back, naming the size."""
    from gemsops.ops.index.isin import MAX_TEST

    with pytest.raises(Unsupported, match=str(MAX_TEST + 1)):
        gemsops.isin(torch.arange(4, device=DEV), torch.arange(MAX_TEST + 1, device=DEV))
