"""Property tests of mm, bmm and addmm against torch in float64.

Operands are drawn contiguous, transposed (the views a linear layer's backward passes)
or sliced, with odd and 0-size dims: K = 0 gives zeros (addmm: ``beta * self``), M = 0 or
N = 0 gives an empty result. Tolerances come from the shared table, widened by K.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.matmul import mm as MM
from gemsops.registry import implementations
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, torch.float64)
SIZES = st.one_of(st.sampled_from([0, 1, 2, 16, 31, 32, 33]), st.integers(1, 70))


def _matrix(draw: st.DrawFn, rows: int, cols: int, dtype: torch.dtype,
            batch: tuple[int, ...] = ()) -> torch.Tensor:
    t = draw(tensors(shape=(*batch, rows, cols), dtypes=[dtype]))
    return t.to(DEV)


@given(data=st.data(), m=SIZES, n=SIZES, k=SIZES, dtype=st.sampled_from(DTYPES))
def test_mm_matches_torch(data: st.DataObject, m: int, n: int, k: int,
                          dtype: torch.dtype) -> None:
    """mm of contiguous, transposed or sliced [M, K] x [K, N] operands matches torch."""
    a = _matrix(data.draw, m, k, dtype)
    b = _matrix(data.draw, k, n, dtype)
    out = MM.mm(a, b)
    assert out.dtype == dtype and out.device == a.device
    assert_close(out, reference(torch.mm, a, b), reduce_size=max(k, 1))


@settings(max_examples=15)
@given(data=st.data(), bs=st.integers(0, 3), m=SIZES, n=SIZES, k=SIZES,
       dtype=st.sampled_from(DTYPES))
def test_bmm_matches_torch(data: st.DataObject, bs: int, m: int, n: int, k: int,
                           dtype: torch.dtype) -> None:
    """bmm over a batch (0 included) of strided operands matches torch."""
    a = _matrix(data.draw, m, k, dtype, (bs,))
    b = _matrix(data.draw, k, n, dtype, (bs,))
    assert_close(MM.bmm(a, b), reference(torch.bmm, a, b), reduce_size=max(k, 1))


@given(data=st.data(), m=SIZES, n=SIZES, k=SIZES, dtype=st.sampled_from(DTYPES),
       self_kind=st.sampled_from(["full", "row", "col", "vector", "scalar"]),
       beta=st.sampled_from([0.0, 1.0, 0.5, -2]), alpha=st.sampled_from([1.0, 0.25, -3]))
def test_addmm_matches_torch(data: st.DataObject, m: int, n: int, k: int, dtype: torch.dtype,
                             self_kind: str, beta: float, alpha: float) -> None:
    """addmm = beta * self + alpha * mat1 @ mat2 with self broadcast from any shape."""
    shape = {"full": (m, n), "row": (1, n), "col": (m, 1), "vector": (n,), "scalar": ()}
    bias = data.draw(tensors(shape=shape[self_kind], dtypes=[dtype])).to(DEV)
    a = _matrix(data.draw, m, k, dtype)
    b = _matrix(data.draw, k, n, dtype)
    out = MM.addmm(bias, a, b, beta=beta, alpha=alpha)
    expected = reference(torch.addmm, bias, a, b, beta=beta, alpha=alpha)
    assert_close(out, expected, reduce_size=max(k, 1) * 4)


def test_addmm_beta_zero_ignores_nan() -> None:
    """With beta = 0 addmm never reads self: its nan and inf do not propagate (torch's rule)."""
    bias = torch.full((3, 4), float("nan"), device=DEV)
    a, b = torch.randn(3, 5, device=DEV), torch.randn(5, 4, device=DEV)
    out = MM.addmm(bias, a, b, beta=0)
    assert torch.isfinite(out).all()
    assert_close(out, reference(torch.mm, a, b), reduce_size=5)


@pytest.mark.parametrize("beta", [2.0, 0.0])
def test_addmm_alpha_zero_does_not_form_the_product(beta: float) -> None:
    """With alpha = 0 the product is not formed (BLAS's rule, torch's on every device): an
    inf or nan in mat1 or mat2 gives beta * self, not nan (and zeros when beta is 0)."""
    bias = torch.randn(2, 3, device=DEV)
    a = torch.tensor([[float("inf"), 1.0], [1.0, float("nan")]], device=DEV)
    b = torch.randn(2, 3, device=DEV)
    out = MM.addmm(bias, a, b, beta=beta, alpha=0)
    expected = torch.addmm(bias, a, b, beta=beta, alpha=0)
    assert torch.isfinite(expected).all()  # what torch does here, checked
    torch.testing.assert_close(out, expected)


def test_k_zero_gives_zeros_and_m_zero_gives_empty() -> None:
    """mm with K = 0 is all zeros; addmm with K = 0 is beta * self; M = 0 is empty."""
    z = MM.mm(torch.randn(3, 0, device=DEV), torch.randn(0, 4, device=DEV))
    assert z.shape == (3, 4) and bool((z == 0).all())
    bias = torch.randn(4, device=DEV)
    out = MM.addmm(bias, torch.randn(3, 0, device=DEV), torch.randn(0, 4, device=DEV), beta=2)
    assert_close(out, reference(lambda s: (2 * s).expand(3, 4), bias))
    assert MM.mm(torch.randn(0, 5, device=DEV), torch.randn(5, 4, device=DEV)).shape == (0, 4)
    assert MM.bmm(torch.randn(2, 3, 5, device=DEV), torch.randn(2, 5, 0, device=DEV)).shape \
        == (2, 3, 0)


@given(data=st.data(), n=SIZES, k=st.one_of(SIZES, st.integers(100, 700)),
       dtype=st.sampled_from(DTYPES), weight_layout=st.booleans(),
       beta=st.sampled_from([0.0, 1.0, -0.5]), alpha=st.sampled_from([1.0, 0.25]))
def test_single_row_products_match_torch(data: st.DataObject, n: int, k: int,
                                         dtype: torch.dtype, weight_layout: bool,
                                         beta: float, alpha: float) -> None:
    """Property: with one row (decode with one sequence), mm and addmm match torch for a
    [K, N] operand stored either way: a linear layer's weight.t() or a plain matrix."""
    a = _matrix(data.draw, 1, k, dtype)
    if weight_layout:
        b = data.draw(tensors(shape=(n, k), dtypes=[dtype])).to(DEV).t()
    else:
        b = _matrix(data.draw, k, n, dtype)
    assert_close(MM.mm(a, b), reference(torch.mm, a, b), reduce_size=max(k, 1))
    bias = data.draw(tensors(shape=(n,), dtypes=[dtype])).to(DEV)
    out = MM.addmm(bias, a, b, beta=beta, alpha=alpha)
    expected = reference(torch.addmm, bias, a, b, beta=beta, alpha=alpha)
    assert_close(out, expected, reduce_size=max(k, 1) * 4)


@settings(max_examples=10)
@given(data=st.data(), m=st.integers(1, 20), n=st.integers(1, 40), k=st.integers(1, 300),
       split=st.integers(2, 5), dtype=st.sampled_from(DTYPES))
def test_split_k_matches_unsplit(data: st.DataObject, m: int, n: int, k: int, split: int,
                                 dtype: torch.dtype) -> None:
    """Split-K (fp32 partial tiles + reducing epilogue) gives the same product and addmm."""
    a = _matrix(data.draw, m, k, dtype)
    b = _matrix(data.draw, k, n, dtype)
    bias = data.draw(tensors(shape=(n,), dtypes=[dtype])).to(DEV)
    out = torch.empty((m, n), dtype=dtype, device=DEV)
    MM.launch_product(a[None], b[None], out[None], bias.expand(m, n)[None], 0.5, 2.0, split_k=split)
    expected = reference(torch.addmm, bias, a, b, beta=2.0, alpha=0.5)
    assert_close(out, expected, reduce_size=k * 4)


def test_split_k_chosen_for_decode_shapes() -> None:
    """The host splits K (a power of two, at most 16) only for an unbatched small-M, long-K
    product whose narrowest tiles would leave more than half the multiprocessors idle and
    whose weight has at least SPLIT_MIN_WEIGHT elements."""
    split = MM._split_k(1, 1, 512, 16384, 132)
    assert 2 <= split <= 16 and split & (split - 1) == 0
    # a 1024 x 1024 weight: the reduction's launch would cost more host time than it saves
    assert MM._split_k(1, 16, 1024, 1024, 132) == 1
    assert MM._split_k(1, 1, 128, 16384, 132) == 1  # 2M weight elements: under the floor
    assert MM._split_k(1, 16, 4096, 4096, 132) == 1  # 128 tiles of 32 columns fill it
    assert MM._split_k(1, 1, 128, 16384, 1) == 1  # one multiprocessor: nothing to fill
    assert MM._split_k(2, 1, 128, 16384, 132) == 1  # batched
    assert MM._split_k(1, 4, 64, 512, 132) == 1  # short K


def test_split_k_chosen_for_few_output_tiles_over_a_long_k() -> None:
    """A many-row product whose 128x128 output tiles fill at most half the multiprocessors
    over a K of at least 4096 (a GPT-2-width weight gradient) splits K, a power of two up
    to 8, until the tiles times the split reach the multiprocessor count; products that
    fill the device, short ones, and small ones stay whole."""
    assert MM._split_k(1, 768, 768, 8192, 132) == 4  # 36 tiles: 144 programs
    assert MM._split_k(1, 768, 768, 6304, 132) == 4
    assert MM._split_k(1, 512, 512, 16384, 132) == 8  # 16 tiles: capped at 8
    assert MM._split_k(1, 768, 768, 8192, 72) == 2  # a smaller device needs less
    assert MM._split_k(1, 3072, 768, 8192, 132) == 1  # 144 tiles fill it
    assert MM._split_k(1, 768, 768, 8192, 64) == 1  # 36 tiles fill more than half of 64
    assert MM._split_k(1, 2048, 2048, 8192, 132) == 1  # 256 tiles
    assert MM._split_k(1, 768, 768, 2048, 132) == 1  # short K
    assert MM._split_k(1, 256, 256, 4096, 132) == 1  # under SPLIT_MIN_WORK
    assert MM._split_k(1, 768, 768, 4096, 132) == 4  # 1024 of K per split, the least
    assert MM._split_k(2, 768, 768, 8192, 132) == 1  # batched


def test_split_k_sized_for_the_operands_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """mm sizes its K split from the device its operands live on (gemshal.device_of)."""
    seen: list[object] = []
    real = gemshal.device_of

    def spy(x: object) -> gemshal.Device:
        seen.append(x)
        return real(x)

    monkeypatch.setattr(gemshal, "device_of", spy)
    a = torch.randn(2, 3, device=DEV)
    MM.mm(a, torch.randn(3, 4, device=DEV))
    assert any(x is a for x in seen)


@given(data=st.data(), dtype=st.sampled_from(DTYPES), m=SIZES, n=SIZES, k=SIZES,
       out_kind=st.sampled_from(["empty", "wrong", "exact", "transposed"]))
def test_out_variants(data: st.DataObject, dtype: torch.dtype, m: int, n: int, k: int,
                      out_kind: str) -> None:
    """mm.out / addmm.out / bmm.out resize a mis-shaped out and write through any strides."""
    a = _matrix(data.draw, m, k, dtype)
    b = _matrix(data.draw, k, n, dtype)
    shapes = {"empty": (0,), "wrong": (2, 3), "exact": (m, n), "transposed": (n, m)}
    out = torch.empty(shapes[out_kind], dtype=dtype, device=DEV)
    if out_kind == "transposed":
        out = out.t()
    res = implementations()["mm.out"](a, b, out=out)
    assert res is out and out.shape == (m, n)
    assert_close(out, reference(torch.mm, a, b), reduce_size=max(k, 1))
    out2 = torch.empty(0, dtype=dtype, device=DEV)
    implementations()["addmm.out"](out.clone(), a, b, beta=1, alpha=2, out=out2)
    assert_close(out2, reference(lambda s, x, y: s + 2 * x @ y, out, a, b),
                 reduce_size=max(k, 1) * 4)
    out3 = torch.empty(0, dtype=dtype, device=DEV)
    implementations()["bmm.out"](a[None], b[None], out=out3)
    assert_close(out3, reference(torch.mm, a, b)[None], reduce_size=max(k, 1))


def test_linear_forward_and_backward_through_aten() -> None:
    """nn.Linear served by the mm/addmm IMPLS (registered at the device's key) matches torch:
    its backward multiplies transposed views, which the kernels read in place."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(33, 17).to(DEV)
    x = torch.randn(5, 33, device=DEV, requires_grad=True)
    lib = torch.library.Library("aten", "IMPL")
    key = gemshal.current_vendor().dispatch_key
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for name in ("mm", "addmm"):  # torch.library names a default overload by the bare op
            lib.impl(name, implementations()[f"{name}.default"], key)
    try:
        y = layer(x)
        y.backward(torch.ones_like(y))
        got = (y.detach(), x.grad, layer.weight.grad, layer.bias.grad)
    finally:
        lib._destroy()
    ref = torch.nn.Linear(33, 17).double()
    ref.load_state_dict({k: v.double().cpu() for k, v in layer.state_dict().items()})
    xr = x.detach().double().cpu().requires_grad_()
    yr = ref(xr)
    yr.backward(torch.ones_like(yr))
    for actual, expected in zip(got, (yr, xr.grad, ref.weight.grad, ref.bias.grad), strict=True):
        assert_close(actual, expected, reduce_size=33)


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (MM.mm, (torch.ones(2, 2, dtype=torch.complex64), torch.ones(2, 2, dtype=torch.complex64))),
        (MM.mm, (torch.ones(2, 2, dtype=torch.int32), torch.ones(2, 2, dtype=torch.int32))),
        (MM.mm, (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.float16))),
        (MM.mm, (torch.ones(2, 3), torch.ones(2, 3))),
        (MM.bmm, (torch.ones(2, 2), torch.ones(2, 2))),
        (MM.addmm, (torch.ones(3, 3), torch.ones(2, 2), torch.ones(2, 2))),
    ],
)
def test_unsupported_inputs(fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> None:
    """Complex, integer, mixed-dtype and mis-shaped operands go back to torch."""
    with pytest.raises(Unsupported):
        fn(*(a.to(DEV) for a in args))


def test_out_dtype_mismatch_is_unsupported() -> None:
    """An out tensor of another dtype is torch's to reject; no output is touched first."""
    out = torch.zeros(2, 2, dtype=torch.float64, device=DEV)
    with pytest.raises(Unsupported):
        ones = torch.ones(2, 2, device=DEV)
        implementations()["mm.out"](ones, ones, out=out)
    assert bool((out == 0).all())
