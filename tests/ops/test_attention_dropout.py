"""Property tests of attention dropout (gemsops.ops.attention): a counter-based Philox mask
the backward regenerates from the forward's Philox state.

Exactness, not statistics: every output and gradient is compared with a float64
reference that applies the kernels' own mask, materialised from the same Philox state
by ``dropout.dropout_mask`` (the same RNG function the kernels call). The statistics of
the mask are checked once, over a large tensor with a fixed key and a bound many sigma
wide. Shapes stay small: the CPU runs the kernels on Triton's interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import gemshal
import gemsops
from gemsops.errors import GemsopsError, Unsupported
from gemsops.ops.attention import sdpa as A
from gemsops.ops.attention.dropout import dropout_mask
from gemsops.ops.random.seed import philox_key
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device
aten = torch.ops.aten

FLASH = "_scaled_dot_product_flash_attention.default"
FLASH_BACKWARD = "_scaled_dot_product_flash_attention_backward.default"
OVERLOADS = ("flash", "efficient", "cudnn", "public")

# The interpreter evaluates masked lanes too (-inf - -inf) in numpy, which warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


@st.composite
def problems(draw: st.DrawFn) -> dict[str, Any]:
    """One dropout attention problem: an overload, q, k, v, mask, causal, scale, p."""
    via = draw(st.sampled_from(OVERLOADS))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    B = draw(st.sampled_from([1, 2]))
    Hkv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 2)) if via == "public" else 1
    Hq = Hkv * group
    Lq = draw(st.integers(1, 37))
    Lk = draw(st.integers(1, 37))
    D = draw(st.sampled_from([16, 32]))
    q = draw(tensors(shape=(B, Hq, Lq, D), dtypes=(dtype,)))
    k = draw(tensors(shape=(B, Hkv, Lk, D), dtypes=(dtype,)))
    v = draw(tensors(shape=(B, Hkv, Lk, D), dtypes=(dtype,)))
    kinds = ["none", "causal"] + ([] if via == "flash" else ["additive"])
    kind = draw(st.sampled_from(kinds))
    mask = None
    if kind == "additive":
        mask = draw(tensors(shape=(Lq, Lk), dtypes=(dtype,))).expand(B, Hq, Lq, Lk)
    return {"via": via, "q": q, "k": k, "v": v, "mask": mask, "causal": kind == "causal",
            "scale": draw(st.sampled_from([None, 0.5])),
            "p": draw(st.sampled_from([0.1, 0.5, 0.9])), "seed": draw(st.integers(0, 2**31))}


def _state(t: Tensor) -> tuple[Tensor, Tensor]:
    """(key, offset) of a Philox state tensor: [2] (flash, public) as two 0-dim views."""
    flat = t.view(torch.int64)
    return flat[0], flat[1]


def _forward(pr: dict[str, Any], q: Tensor, k: Tensor, v: Tensor,
             mask: Tensor | None) -> tuple[Tensor, Callable[[Tensor], tuple[Tensor, ...]],
                                           tuple[Tensor, Tensor]]:
    """(output, backward(grad) -> (dq, dk, dv), (key, offset)) through ``pr["via"]``,
    drawing the Philox state after ``torch.manual_seed(pr["seed"])``."""
    torch.manual_seed(pr["seed"])
    via, p, causal, scale = pr["via"], pr["p"], pr["causal"], pr["scale"]
    Lq, Lk = q.shape[2], k.shape[2]
    if via == "flash":
        res = A.flash_attention(q, k, v, p, causal, scale=scale)
        return res[0], lambda g: A.flash_attention_backward(
            g, q, k, v, res[0], res[1], None, None, Lq, Lk, p, causal, res[6], res[7],
            scale=scale), _state(res[6])
    if via == "efficient":
        out, lse, seed, offset = A.efficient_attention(q, k, v, mask, True, p, causal,
                                                       scale=scale)
        return out, lambda g: A.efficient_attention_backward(
            g, q, k, v, mask, out, lse, seed, offset, p, [True, True, True, False], causal,
            scale=scale)[:3], (seed, offset)
    if via == "cudnn":
        res = A.cudnn_attention(q, k, v, mask, True, p, causal, scale=scale)
        return res[0], lambda g: A.cudnn_attention_backward(
            g, q, k, v, res[0], res[1], res[6], res[7], mask, None, None, Lq, Lk, p, causal,
            scale=scale), (res[6], res[7])
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = gemsops.scaled_dot_product_attention(*leaves, attn_mask=mask, dropout_p=p,
                                               is_causal=causal, scale=scale,
                                               enable_gqa=q.shape[1] != k.shape[1])
    # The public function draws its state as the overloads do: redraw it to read it.
    torch.manual_seed(pr["seed"])
    state = philox_key(q.device, shape=(2,))
    return out, lambda g: torch.autograd.grad(out, leaves, g), _state(state)


def _math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
          scale: float | None, keep: Tensor, p: float) -> Tensor:
    """softmax(q k^T * scale [+ mask], causal) with ``keep`` applied, then @ v (float64)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s + mask
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.softmax(s, -1)
    return (attn * keep.to(attn.dtype) / (1 - p)) @ v


def _keep(pr: dict[str, Any], key: Tensor, offset: Tensor) -> Tensor:
    B, Hq, Lq, _ = pr["q"].shape
    return dropout_mask(key, offset, (B, Hq, Lq, pr["k"].shape[2]), pr["p"]).cpu()


@settings(max_examples=14)
@given(pr=problems())
def test_forward_equals_the_reference_with_its_own_mask(pr: dict[str, Any]) -> None:
    """Every dropout forward (flash, efficient, cuDNN overloads and the public function)
    equals softmax(q k^T * scale [+ mask]) * keep / (1 - p) @ v in float64, with the mask
    materialised from the Philox state the forward returned."""
    out, _, (key, offset) = _forward(pr, pr["q"], pr["k"], pr["v"], pr["mask"])
    keep = _keep(pr, key, offset)
    expected = reference(lambda q, k, v, m: _math(q, k, v, m, pr["causal"], pr["scale"],
                                                  keep, pr["p"]),
                         pr["q"], pr["k"], pr["v"], pr["mask"])
    assert out.dtype == pr["q"].dtype
    assert_close(out, expected, reduce_size=pr["k"].shape[2])


@settings(max_examples=12)
@given(pr=problems(), data=st.data())
def test_gradients_equal_autograd_through_the_reference(pr: dict[str, Any],
                                                        data: st.DataObject) -> None:
    """dq, dk, dv of every dropout backward (the mask regenerated from the Philox state,
    never stored) equal autograd through the float64 reference with the same mask."""
    out, backward, (key, offset) = _forward(pr, pr["q"], pr["k"], pr["v"], pr["mask"])
    grad = data.draw(tensors(shape=out.shape, dtypes=(pr["q"].dtype,)))
    got = backward(grad)
    keep = _keep(pr, key, offset)

    def ref(q: Tensor, k: Tensor, v: Tensor, m: Tensor | None, g: Tensor) -> Any:
        ins = [t.requires_grad_() for t in (q, k, v)]
        return torch.autograd.grad(_math(*ins, m, pr["causal"], pr["scale"], keep, pr["p"]),
                                   ins, g)

    expected = reference(ref, pr["q"], pr["k"], pr["v"], pr["mask"], grad)
    lq, lk = pr["q"].shape[2], pr["k"].shape[2]
    # The kept probabilities are 1 / (1 - p) times larger, and so is the rounding error of
    # the half-precision output the backward reads back (in delta = rowsum(dO * O), as
    # flash attention computes it): widen the tolerance by that factor.
    size = (lk + lq * pr["q"].shape[1] // pr["k"].shape[1]) / (1 - pr["p"]) ** 2
    for actual, want in zip(got, expected, strict=True):
        assert_close(actual, want, reduce_size=size)


@settings(max_examples=4)
@given(seed=st.integers(0, 2**31), via=st.sampled_from(OVERLOADS))
def test_same_seed_same_output_other_seed_other_mask(seed: int, via: str) -> None:
    """Under one ``torch.manual_seed`` a dropout forward and backward give identical
    results; another seed, or the next call without reseeding (the generator advanced),
    gives another mask."""
    gen = torch.Generator().manual_seed(7)
    q, k, v, g = (torch.randn(1, 2, 24, 16, generator=gen).to(DEVICE) for _ in range(4))
    pr = {"via": via, "p": 0.5, "causal": False, "scale": None, "seed": seed}
    out1, bwd1, state1 = _forward(pr, q, k, v, None)
    out2, bwd2, state2 = _forward(pr, q, k, v, None)
    assert torch.equal(out1, out2)
    for a, b in zip(bwd1(g), bwd2(g), strict=True):
        assert torch.equal(a, b)
    shape = {"q": q, "k": k, "p": 0.5}
    other = _forward({**pr, "seed": seed + 1}, q, k, v, None)
    assert not torch.equal(_keep(shape, *state1), _keep(shape, *other[2]))
    assert not torch.equal(out1, other[0])
    if via != "public":
        torch.manual_seed(seed)
        first = A.flash_attention(q, k, v, 0.5)
        second = A.flash_attention(q, k, v, 0.5)
        assert not torch.equal(first[0], second[0])
        assert not torch.equal(_keep(shape, *_state(first[6])), _keep(shape, *_state(second[6])))
    assert torch.equal(_keep(shape, *state1), _keep(shape, *state2))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_kept_fraction_is_one_minus_p(p: float) -> None:
    """Over 2**18 elements of one fixed key the kept fraction is within 6 sigma of 1 - p,
    and so is each of the eight 16-bit lanes of a Philox output (key ``j % 8``: a word's
    low and high halves), each head and the first and last rows: the counters cover the
    whole [B, H, Lq, Lk] tile without reuse."""
    key = torch.tensor(0x5DEECE66D, dtype=torch.int64, device=DEVICE)
    offset = torch.tensor(-(2**40), dtype=torch.int64, device=DEVICE)
    keep = dropout_mask(key, offset, (2, 2, 256, 256), p).cpu().double()

    def near(part: Tensor) -> None:
        n = part.numel()
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(part.mean().item() - (1 - p)) < 6 * sigma, (part.mean().item(), 1 - p)

    near(keep)
    for lane in range(8):
        near(keep[..., lane::8])
    for b in range(2):
        for h in range(2):
            near(keep[b, h])
    near(keep[:, :, :8])
    near(keep[:, :, -8:])
    # Rows and heads draw different numbers (no counter is reused).
    assert not torch.equal(keep[0, 0, 0], keep[0, 0, 1])
    assert not torch.equal(keep[0, 0], keep[0, 1])
    assert not torch.equal(keep[0], keep[1])


def test_record_shows_dropout_served_and_p0_unchanged() -> None:
    """Under use_gems(), aten's flash attention with dropout_p > 0 and its backward are
    served by gemsops (none handed back), twice in a row (not replayed: each call draws a
    new mask); dropout_p = 0 is served as before and equals the no-dropout reference."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 21, 16, generator=gen).to(DEVICE).requires_grad_()
               for _ in range(3))
    outs = []
    with gemsops.use_gems(), gemsops.record() as rec:
        for _ in range(2):
            out = aten._scaled_dot_product_flash_attention(q, k, v, 0.25)[0]
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            outs.append(out.detach())
        plain = aten._scaled_dot_product_flash_attention(q, k, v, 0.0)[0]
        torch.autograd.grad(plain, (q, k, v), torch.ones_like(plain))
    assert not rec.fallbacks, rec.summary()
    assert rec.served[FLASH] == 3 and rec.served[FLASH_BACKWARD] == 3
    assert not torch.equal(outs[0], outs[1])
    expected = reference(torch.nn.functional.scaled_dot_product_attention, q, k, v)
    assert_close(plain, expected, reduce_size=21)


def test_p_one_gives_zeros() -> None:
    """dropout_p = 1 drops everything: zero output and zero gradients, as torch's math
    attention gives."""
    x = torch.randn(1, 2, 9, 16, device=DEVICE)
    res = A.flash_attention(x, x, x, 1.0)
    assert (res[0] == 0).all()
    grads = A.flash_attention_backward(torch.ones_like(x), x, x, x, res[0], res[1], None, None,
                                       9, 9, 1.0, False, res[6], res[7])
    assert all((g == 0).all() for g in grads)


def test_deterministic_algorithms() -> None:
    """Under torch.use_deterministic_algorithms(True) dropout attention is served and
    bitwise reproducible: the mask is a function of its counters, and the backward sums
    without atomics."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, g = (torch.randn(2, 2, 18, 32, generator=gen).to(DEVICE) for _ in range(4))
    pr = {"via": "efficient", "p": 0.3, "causal": True, "scale": None, "seed": 11}
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            out, backward, _ = _forward(pr, q, k, v, None)
            runs.append((out, *backward(g)))
    finally:
        torch.use_deterministic_algorithms(before)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_the_halves_are_served_together() -> None:
    """A dropout forward is handed back when its backward is not registered, and a
    dropout backward hands back a Philox state that no gemsops forward drew (torch's
    forward draws its mask from torch's RNG): a mask is never regenerated by the other
    side's RNG."""
    x = torch.randn(1, 2, 5, 16, device=DEVICE)
    with gemsops.use_gems(include=[FLASH]), gemsops.record() as rec:
        try:
            aten._scaled_dot_product_flash_attention(x, x, x, 0.5)
        except GemsopsError as error:  # handed back, but torch has no kernel here (the CPU)
            assert "no CPU kernel" in str(error)
        else:
            assert any("dropout without" in reason for _, reason in rec.fallbacks)
    assert not rec.served
    foreign = torch.zeros(2, dtype=torch.uint64, device=DEVICE)
    lse = torch.zeros(1, 2, 5, device=DEVICE)
    with pytest.raises(Unsupported, match="Philox state"):
        A.flash_attention_backward(x, x, x, x, x, lse, None, None, 5, 5, 0.5, False, foreign,
                                   foreign[0])
    seed, offset = torch.zeros((), dtype=torch.int64, device=DEVICE), torch.zeros(
        (), dtype=torch.int64)
    with pytest.raises(Unsupported, match="Philox state"):
        A.efficient_attention_backward(x, x, x, x, None, x, lse, seed, offset, 0.5,
                                       [True] * 4)


def test_create_graph_backward_is_differentiable_with_the_same_mask() -> None:
    """A create_graph backward of the public function with dropout recomputes through
    composite ops with the kernels' own mask: its gradients equal the first-order ones
    and can be differentiated again."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, g = (torch.randn(1, 2, 11, 16, generator=gen).to(DEVICE) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(3)
    out = gemsops.scaled_dot_product_attention(*leaves, dropout_p=0.4, is_causal=True)
    first = torch.autograd.grad(out, leaves, g, retain_graph=True)
    second = torch.autograd.grad(out, leaves, g, create_graph=True)
    for a, b in zip(first, second, strict=True):
        assert_close(a, b.detach().double(), reduce_size=22)
    (second[0] * second[2]).sum().backward()
    assert all(t.grad is not None for t in leaves)
