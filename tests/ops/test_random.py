"""Property tests of dropout (native_dropout and its backward) and in-place bernoulli_.

The masks come from counter-based Philox numbers keyed by torch's generators, so the
properties are statistical (the kept fraction is within a binomial bound), about
reproducibility (torch.manual_seed fixes the mask, another seed changes it) and exact
about the arithmetic: given its mask, dropout's output is what torch's own kernel
computes for ``input * mask * (1 / (1 - p))``, bit for bit.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.ops.random import dropout as D
from gemsops.testing.strategies import FLOAT_DTYPES, target_device, tensors
from gemsops.testing.tolerance import assert_close

DEV = target_device()
PROBABILITIES = st.one_of(st.sampled_from([0.1, 0.5, 0.9]),
                          st.floats(0.01, 0.99, allow_nan=False))
# A dropped inf is inf * 0 = nan, as in torch; the interpreter's numpy warns about it.
INF_TIMES_ZERO = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _torch_scaled(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """torch's own ``x * mask * scale`` for a bool mask (its dropout backward kernel, the
    arithmetic its dropout forward applies to the mask it draws)."""
    assert not gemsops.registered_ops()
    return torch.ops.aten.native_dropout_backward(x, mask, scale)


def _exactly(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _binomial_ok(kept: int, n: int, keep: float) -> bool:
    """``kept`` within 6 standard deviations (plus one) of Binomial(n, keep)'s mean."""
    return abs(kept - n * keep) <= 6 * math.sqrt(n * keep * (1 - keep)) + 1


@INF_TIMES_ZERO
@given(x=tensors(dtypes=FLOAT_DTYPES, specials=True), p=PROBABILITIES,
       seed=st.integers(0, 2**31 - 1))
def test_dropout_output_is_input_times_mask_times_scale(x: torch.Tensor, p: float,
                                                        seed: int) -> None:
    """Property: native_dropout returns a bool mask of the input's shape and the output
    ``input * mask / (1 - p)`` in the input dtype exactly as torch computes it (float32
    product with the scale ``1 / (1 - p)``, one rounding; dropped inf/nan give nan), for
    any shape, layout (transposed, sliced) and fp16/bf16/fp32."""
    torch.manual_seed(seed)
    out, mask = D.native_dropout(x, p, True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    assert out.dtype == x.dtype and out.shape == x.shape
    _exactly(out, _torch_scaled(x, mask, 1.0 / (1.0 - p)))
    finite = torch.isfinite(x)
    expected = x.double() * mask.double() / (1.0 - p)
    assert_close(out[finite], expected[finite])


@settings(max_examples=10)
@given(p=PROBABILITIES, dtype=st.sampled_from(FLOAT_DTYPES), seed=st.integers(0, 2**31 - 1),
       n=st.integers(5000, 20000))
def test_kept_fraction_is_binomial(p: float, dtype: torch.dtype, seed: int, n: int) -> None:
    """Property: over n elements the number kept is within a binomial bound of n (1 - p),
    and so is the number kept in each half (the four Philox lanes and the programs are
    not correlated into a pattern)."""
    torch.manual_seed(seed)
    _, mask = D.native_dropout(torch.ones(n, dtype=dtype, device=DEV), p, True)
    assert _binomial_ok(int(mask.sum()), n, 1 - p)
    half = n // 2
    assert _binomial_ok(int(mask[:half].sum()), half, 1 - p)
    assert _binomial_ok(int(mask[half:].sum()), n - half, 1 - p)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), other=st.integers(0, 2**31 - 1),
       p=PROBABILITIES, shape=st.sampled_from([(4097,), (33, 65), (2, 3, 300)]))
def test_seed_decides_the_mask(seed: int, other: int, p: float,
                               shape: tuple[int, ...]) -> None:
    """Property: torch.manual_seed(s) before dropout gives the same mask every time; a
    different seed, or the next call (the generator moved on), gives a different one."""
    x = torch.randn(shape, device=DEV)
    torch.manual_seed(seed)
    first, mask = D.native_dropout(x, p, True)
    _, following = D.native_dropout(x, p, True)
    torch.manual_seed(seed)
    again, same = D.native_dropout(x, p, True)
    assert torch.equal(mask, same) and torch.equal(first, again)
    assert not torch.equal(mask, following)
    if other != seed:
        torch.manual_seed(other)
        assert not torch.equal(mask, D.native_dropout(x, p, True)[1])


@INF_TIMES_ZERO
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES),
       layout=st.sampled_from(["contiguous", "transposed", "channels_last", "mixed"]),
       scale=st.sampled_from([1.0, 2.0, 1 / 0.9, 1 / 0.3, 10.0]))
def test_backward_is_grad_times_mask_times_scale(data: st.DataObject, dtype: torch.dtype,
                                                 layout: str, scale: float) -> None:
    """Property: native_dropout_backward(grad, mask, scale) is ``grad * mask * scale``
    exactly as torch computes it, for grad and mask in the same or different layouts."""
    shape = data.draw(st.sampled_from([(2, 3, 5, 7), (1, 4, 1, 9), (3, 1, 2, 2)]))
    grad = data.draw(tensors(shape=shape, dtypes=[dtype], specials=True, layouts=False))
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(7)).to(DEV) < 0.6
    if layout == "transposed":
        grad, mask = grad.transpose(1, 3), mask.transpose(1, 3)
    elif layout == "channels_last":
        grad = grad.contiguous(memory_format=torch.channels_last)
        mask = mask.contiguous(memory_format=torch.channels_last)
    elif layout == "mixed":
        mask = mask.contiguous(memory_format=torch.channels_last)
    out = D.native_dropout_backward(grad, mask, scale)
    assert out.dtype == dtype and out.shape == grad.shape
    _exactly(out, _torch_scaled(grad, mask, scale))


def test_evaluation_and_edge_probabilities() -> None:
    """train=False and p == 0 copy the input with an all-true mask; p == 1 gives zeros
    and an all-false mask; an empty input gives empty results."""
    x = torch.randn(5, 7, device=DEV)
    for out, mask in (D.native_dropout(x, 0.5, False), D.native_dropout(x, 0.0, True)):
        assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
        assert mask.dtype == torch.bool and bool(mask.all())
    out, mask = D.native_dropout(x, 1.0, True)
    assert bool((out == 0).all()) and not bool(mask.any()) and mask.dtype == torch.bool
    out, mask = D.native_dropout(torch.empty(0, 3, device=DEV), 0.5, None)
    assert out.shape == mask.shape == (0, 3) and mask.dtype == torch.bool


@settings(max_examples=10)
@given(dtype=st.sampled_from([*FLOAT_DTYPES, torch.bool, torch.int32, torch.uint8]),
       p=st.one_of(st.sampled_from([0.0, 1.0]), PROBABILITIES),
       seed=st.integers(0, 2**31 - 1), sliced=st.booleans())
def test_bernoulli_fills_zeros_and_ones(dtype: torch.dtype, p: float, seed: int,
                                        sliced: bool) -> None:
    """Property: bernoulli_(p) writes only 0s and 1s, in self's dtype, a binomial share of
    them 1s; a sliced self is written through its strides and nothing else is touched; an
    explicit generator seeded alike gives the same samples."""
    n = 6000
    base = torch.full((n, 2) if sliced else (n,), 7, dtype=dtype, device=DEV)
    self = base[:, 0] if sliced else base
    result = D.bernoulli(self, p, generator=torch.Generator(DEV).manual_seed(seed), out=self,
                         inplace=True)
    assert result is self and self.dtype == dtype
    values = self.double()
    assert bool(((values == 0) | (values == 1)).all())
    assert _binomial_ok(int(values.sum()), n, p)
    if sliced:
        assert torch.equal(base[:, 1], torch.full((n,), 7, dtype=dtype, device=DEV))
    again = D.bernoulli(torch.empty(n, dtype=dtype, device=DEV), p,
                        generator=torch.Generator(DEV).manual_seed(seed))
    assert torch.equal(again, self.contiguous())


def test_dropout_under_use_gems_trains_with_autograd() -> None:
    """F.dropout in training under use_gems: on the CPU it reaches bernoulli_ (then torch's
    div and mul), on accelerators native_dropout; either way the output is the input
    times kept / (1 - p) and autograd's gradient is grad times the same factor."""
    p = 0.3
    for dtype in FLOAT_DTYPES:
        x = (torch.rand(64, 33, device=DEV) + 0.5).to(dtype).requires_grad_()
        grad = torch.randn(64, 33, device=DEV).to(dtype)
        torch.manual_seed(3)
        with gemsops.use_gems(), gemsops.record() as rec:
            y = F.dropout(x, p, training=True)
            y.backward(grad)
        if DEV.type == "cpu":
            assert rec.served["bernoulli_.float"] == 1
        else:
            assert rec.served["native_dropout.default"] == 1
            assert rec.served["native_dropout_backward.default"] == 1
        kept = y.detach() != 0
        assert_close(y.detach(), x.detach().double() * kept / (1 - p))
        assert_close(x.grad, grad.double() * kept / (1 - p))
        kept_fraction = float(kept.double().mean())
        assert _binomial_ok(int(kept.sum()), kept.numel(), 1 - p), kept_fraction
        torch.manual_seed(3)
        with gemsops.use_gems():
            assert torch.equal(F.dropout(x.detach(), p, training=True), y.detach())


def test_native_dropout_autograd_under_use_gems() -> None:
    """Under use_gems native_dropout and autograd's native_dropout_backward are both
    served, and the gradient is grad * mask / (1 - p) as torch computes it."""
    p = 0.25
    x = torch.randn(3, 50, device=DEV, requires_grad=True)
    grad = torch.randn(3, 50, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        out, mask = torch.ops.aten.native_dropout(x, p, True)
        out.backward(grad)
    assert rec.served["native_dropout.default"] == 1
    assert rec.served["native_dropout_backward.default"] == 1
    _exactly(x.grad, _torch_scaled(grad, mask, 1 / (1 - p)))
    _exactly(out.detach(), _torch_scaled(x.detach(), mask, 1 / (1 - p)))


@pytest.mark.parametrize("case", ["float64", "p_out_of_range", "int_mask"])
def test_other_inputs_are_handed_to_torch(case: str) -> None:
    """float64 dropout, probabilities outside [0, 1] and non-bool masks go to torch."""
    with gemsops.use_gems(), gemsops.record() as rec:
        if case == "float64":
            torch.ops.aten.native_dropout(torch.randn(8, dtype=torch.float64, device=DEV), 0.5,
                                          True)
            assert "native_dropout.default" in rec.fallback_ops()
        elif case == "p_out_of_range":
            with pytest.raises(RuntimeError):
                torch.empty(8, device=DEV).bernoulli_(1.5)
            assert "bernoulli_.float" in rec.fallback_ops()
        else:
            # torch's CPU kernel takes a float mask; its accelerator kernels raise.
            with contextlib.suppress(RuntimeError):
                torch.ops.aten.native_dropout_backward(torch.randn(8, device=DEV),
                                                       torch.ones(8, device=DEV), 2.0)
            assert "native_dropout_backward.default" in rec.fallback_ops()


def test_out_overloads_and_functional_bernoulli_under_use_gems() -> None:
    """native_dropout.out and native_dropout_backward.out write into the given tensors, and
    torch.bernoulli(x, p) (composite in torch) reaches the served bernoulli_."""
    x = torch.randn(10, 20, device=DEV)
    out0 = torch.empty(0, device=DEV)
    out1 = torch.empty(0, dtype=torch.bool, device=DEV)
    grad = torch.empty(10, 20, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        torch.ops.aten.native_dropout.out(x, 0.5, True, out0=out0, out1=out1)
        torch.ops.aten.native_dropout_backward.out(x, out1, 2.0, out=grad)
        samples = torch.bernoulli(x, 0.3)
    for overload in ("native_dropout.out", "native_dropout_backward.out", "bernoulli_.float"):
        assert rec.served[overload] == 1, rec.summary()
    assert out0.shape == out1.shape == x.shape and out1.dtype == torch.bool
    _exactly(out0, _torch_scaled(x, out1, 2.0))
    _exactly(grad, out0)
    assert bool(((samples == 0) | (samples == 1)).all())
