"""Ops served by gemsops are captured into CUDA graphs and replay like torch's eager ops.

The pattern under test is the one docs/eager.md describes: warm up inside
``gemsops.use_gems()`` (so every kernel is compiled and tuned, on a side stream), then
capture inside it too, then replay with new data copied into the static inputs.
Only this test file may use the CUDA API by name; gemsops' own modules may not.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import gemsops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"),
]

DEV = "cuda"


def _forward(x: torch.Tensor, w: torch.Tensor, norm_w: torch.Tensor) -> torch.Tensor:
    h = F.rms_norm(x @ w, (w.shape[-1],), norm_w, 1e-6)
    return torch.softmax(F.silu(h) + x, dim=-1)


def test_forward_captured_under_gemsops_replays_new_inputs_like_eager_torch() -> None:
    """A forward served by gemsops (mm, rms_norm, silu, add, softmax), captured after a
    warm-up under use_gems, replays new input data with eager torch's results."""
    torch.manual_seed(0)
    n = 256
    w = torch.randn(n, n, device=DEV) / n**0.5
    norm_w = torch.randn(n, device=DEV)
    static_x = torch.randn(64, n, device=DEV)
    with gemsops.use_gems():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), gemsops.record() as rec:
            for _ in range(3):  # compiles and tunes every kernel before capture
                _forward(static_x, w, norm_w)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = _forward(static_x, w, norm_w)
    for op in ("mm.default", "_fused_rms_norm.default", "silu.default", "add.Tensor",
               "_softmax.default"):  # fmt: skip
        assert rec.served[op] >= 3, (op, rec.served)
    assert not rec.fallbacks
    for _ in range(2):
        x = torch.randn(64, n, device=DEV)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        expected = _forward(x, w, norm_w)  # torch's own kernels: use_gems has ended
        torch.testing.assert_close(static_out, expected, atol=1e-5, rtol=1e-4)


class _Block(nn.Module):
    def __init__(self, n: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(n, eps=1e-6)
        self.up = nn.Linear(n, hidden)
        self.down = nn.Linear(hidden, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x + self.down(F.silu(self.up(self.norm(x)))), dim=-1)


def test_graphed_callable_under_gemsops_gives_torchs_outputs_and_gradients() -> None:
    """A module graphed by make_graphed_callables under use_gems replays forward and
    backward on new inputs with torch's outputs and input and parameter gradients."""
    torch.manual_seed(0)
    ref = _Block(128, 256).to(DEV)
    ours = copy.deepcopy(ref)
    sample = torch.randn(32, 128, device=DEV, requires_grad=True)
    with gemsops.use_gems(), gemsops.record() as rec:
        # Warms up (forward and backward, on a side stream), then captures both.
        graphed = torch.cuda.make_graphed_callables(ours, (sample,))
    for op in ("addmm.default", "mm.default", "silu.default", "silu_backward.default",
               "_softmax.default", "_softmax_backward_data.default"):  # fmt: skip
        assert rec.served[op] > 0, (op, rec.served)
    assert not rec.fallbacks
    for _ in range(2):
        x = torch.randn(32, 128, device=DEV)
        weight = torch.randn(32, 128, device=DEV)
        x_ours = x.clone().requires_grad_()
        x_ref = x.clone().requires_grad_()
        ours.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out = graphed(x_ours)
        (out * weight).sum().backward()
        expected = ref(x_ref)
        (expected * weight).sum().backward()
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
        assert x_ours.grad is not None and x_ref.grad is not None
        torch.testing.assert_close(x_ours.grad, x_ref.grad, atol=1e-4, rtol=1e-4)
        for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
