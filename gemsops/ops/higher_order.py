"""Gradients that must themselves be differentiable: torch's own kernels serve them.

gemsops' backward kernels are not differentiable. A backward that runs with grad mode
on is one whose result autograd will differentiate again (``create_graph=True``: a
gradient penalty, a Hessian-vector product, double backward). There every gemsops
autograd function recomputes its forward with torch's own kernels on the saved inputs
and returns that graph's gradients, taken with ``create_graph=True``: the answer and its
derivatives are torch's, never a silently detached gradient. First-order backward
(grad mode off, the training-step case) keeps gemsops' kernels, except while one of
them compiles in the background (:mod:`gemshal.kernel.compile`): that backward takes
torch's gradients the same way, without building a graph of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from gemshal.kernel.compile import KernelCompiling, deferring
from gemsops.call_record import COMPILING, note_handed_back, running

__all__ = ["gems_backward", "higher_order", "torch_gradients"]

T = TypeVar("T")


def higher_order() -> bool:
    """Whether the backward running now must be differentiable (``create_graph=True``)."""
    return torch.is_grad_enabled()


def gems_backward(name: str, run: Callable[[], T]) -> T | None:
    """``run()`` (a first-order backward on gemsops' kernels), or None when a kernel it
    launches is compiling in the background: the caller then returns torch's gradients
    (:func:`torch_gradients`). Such a backward is counted in ``record()`` as handed back,
    under ``name``."""
    try:
        with running(), deferring():
            return run()
    except KernelCompiling:
        note_handed_back(name, COMPILING)
        return None


def torch_gradients(
    forward: Callable[[], Tensor],
    inputs: Sequence[Tensor | None],
    grad: Tensor,
    *,
    create_graph: bool = True,
) -> tuple[Tensor | None, ...]:
    """``grad``-weighted gradients of ``forward()`` with respect to ``inputs``, through
    torch's own kernels (differentiable with ``create_graph``, the default); None for an
    input that is None or needs no gradient.

    ``forward`` recomputes the op from saved tensors (which keep their autograd history
    in a ``create_graph`` backward); it runs inside :func:`gemsops.registry.running`, so
    its aten calls reach torch's kernels.
    """
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    if not wanted:
        return tuple(None for _ in inputs)
    with running(), torch.enable_grad():
        out = forward()
        got = iter(
            torch.autograd.grad(out, wanted, grad, create_graph=create_graph, allow_unused=True)
        )
    return tuple(next(got) if t is not None and t.requires_grad else None for t in inputs)
