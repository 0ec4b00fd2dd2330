"""Gradients that must themselves be differentiable: torch's own kernels serve them.

gemsops' backward kernels are not differentiable. A backward that runs with grad mode
on is one whose result autograd will differentiate again (``create_graph=True``: a
gradient penalty, a Hessian-vector product, double backward). There every gemsops
autograd function recomputes its forward with torch's own kernels on the saved inputs
and returns that graph's gradients, taken with ``create_graph=True``: the answer and its
derivatives are torch's, never a silently detached gradient. First-order backward
(grad mode off, the training-step case) keeps gemsops' kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from gemsops.registry import running

__all__ = ["higher_order", "torch_gradients"]


def higher_order() -> bool:
    """Whether the backward running now must be differentiable (``create_graph=True``)."""
    return torch.is_grad_enabled()


def torch_gradients(
    forward: Callable[[], Tensor], inputs: Sequence[Tensor | None], grad: Tensor
) -> tuple[Tensor | None, ...]:
    """``grad``-weighted gradients of ``forward()`` with respect to ``inputs``, through
    torch's own kernels and differentiable; None for an input that is None or needs no
    gradient.

    ``forward`` recomputes the op from saved tensors (which keep their autograd history
    in a ``create_graph`` backward); it runs inside :func:`gemsops.registry.running`, so
    its aten calls reach torch's kernels.
    """
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    if not wanted:
        return tuple(None for _ in inputs)
    with running(), torch.enable_grad():
        out = forward()
        got = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
    return tuple(next(got) if t is not None and t.requires_grad else None for t in inputs)
