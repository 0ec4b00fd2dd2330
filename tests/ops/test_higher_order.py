"""Double backward through every served autograd function: torch's answer, never a
silently detached gradient (gemsops.ops.higher_order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import gemshal
from gemsops import registry

DEV = gemshal.current_device().torch_device


def _t(*shape: int, grad: bool = True, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEV).requires_grad_(grad)


TARGET = torch.tensor([1, 0, 4], device=DEV)
IDS = torch.tensor([[0, 2], [3, 2]], device=DEV)

# name -> (function of the differentiable inputs, the inputs, the served overload)
CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...], str]] = {
    "cross_entropy": (lambda x: F.cross_entropy(x, TARGET), (_t(3, 5),),
                      "cross_entropy_loss.default"),
    "cross_entropy none, smoothed": (
        lambda x: F.cross_entropy(x, TARGET, reduction="none", label_smoothing=0.1),
        (_t(3, 5),), "cross_entropy_loss.default"),
    "nll_loss": (lambda x: F.nll_loss(x, TARGET), (_t(3, 5),), "nll_loss_forward.default"),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b), (_t(3, 4), _t(4, seed=1),
                                                                  _t(4, seed=2)),
                   "native_layer_norm.default"),
    "rms_norm": (lambda x, w: F.rms_norm(x, (4,), w), (_t(3, 4), _t(4, seed=1)),
                 "_fused_rms_norm.default"),
    "embedding": (lambda w: F.embedding(IDS, w) ** 2, (_t(5, 3),), "embedding.default"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradgradcheck_through_served_autograd_functions(name: str) -> None:
    """Property: the second derivative of each served autograd function (float64, through
    gradgradcheck's finite differences) matches, and the forward was served by gemsops."""
    fn, inputs, overload = CASES[name]
    with registry.use_gems(), registry.record() as rec:
        assert torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert rec.served[overload] >= 1, rec.summary()


def test_a_gradient_penalty_through_cross_entropy_matches_torch() -> None:
    """The issue's case: the weight gradient of ``l + |dl/dx|^2`` for ``l =
    cross_entropy(x @ w.t(), t)`` equals torch's (it was off by 0.22, silently)."""
    x, w = _t(3, 4), _t(5, 4, seed=1)
    t = TARGET

    def penalty_grad() -> torch.Tensor:
        loss = F.cross_entropy(x @ w.t(), t)
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        (gw,) = torch.autograd.grad(loss + g.pow(2).sum(), w)
        return gw

    expected = penalty_grad()
    with registry.use_gems(), registry.record() as rec:
        got = penalty_grad()
    assert rec.served["cross_entropy_loss.default"] >= 1
    torch.testing.assert_close(got, expected)


def test_a_leaf_logits_second_gradient_does_not_raise() -> None:
    """With the logits as the leaf, a second gradient through the first is torch's (it
    raised "element 0 of tensors does not require grad")."""
    logits = _t(3, 5)

    def second() -> torch.Tensor:
        (g,) = torch.autograd.grad(F.cross_entropy(logits, TARGET), logits, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), logits)
        return h

    expected = second()
    with registry.use_gems():
        got = second()
    torch.testing.assert_close(got, expected)


def test_first_order_backward_still_uses_gemsops_kernels() -> None:
    """Without create_graph the backward is gemsops' own (served, not torch's recompute)."""
    x = _t(3, 4)
    with registry.use_gems(), registry.record() as rec:
        F.rms_norm(x, (4,)).sum().backward()
    assert rec.served["_fused_rms_norm.default"] >= 1
    assert x.grad is not None


def test_gemsops_attention_double_backward_matches_torch_math_attention() -> None:
    """gemsops' attention function (its own autograd function; float32, which its kernels
    take) gives the gradient of a gradient penalty that torch's math attention gives."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gemsops

    def penalty(attend: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, ...]:
        q, k, v = (_t(1, 2, 8, 16, seed=s).float().detach().requires_grad_() for s in range(3))
        out = attend(q, k, v, is_causal=True)
        (gq,) = torch.autograd.grad((out * out).sum(), q, create_graph=True)
        return torch.autograd.grad(gq.pow(2).sum(), (q, k, v))

    with sdpa_kernel([SDPBackend.MATH]):
        expected = penalty(F.scaled_dot_product_attention)
    got = penalty(gemsops.scaled_dot_product_attention)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=2e-4, rtol=2e-3)
