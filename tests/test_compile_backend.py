"""torch.compile(backend="gemsops"): Inductor with gemsops' kernels for the kept ops.

These compile with Inductor, which on the CPU builds C++ (a few seconds a graph); the
kept ops run gemsops' kernels (on the CPU, through the Triton interpreter).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import gemsops
from gemsops import compiler
from gemsops.errors import GemsopsError, UnknownOpError
from gemsops.testing.strategies import target_device

KEEP = ["mm", "_softmax", "_softmax_backward_data"]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    gemsops.disable()
    yield
    torch._dynamo.reset()


def _f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(x @ w, -1) * 3.0 + 1.0).sum()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    dev = target_device()
    x = torch.randn(8, 16, generator=g).to(dev).requires_grad_()
    w = torch.randn(16, 32, generator=g).to(dev).requires_grad_()
    return x, w


def test_backend_is_registered_with_dynamo() -> None:
    """backend="gemsops" resolves, through the torch_dynamo_backends entry point, to ours."""
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("gemsops") is compiler.compile_backend
    assert gemsops.compile_backend is compiler.compile_backend


def test_kept_ops_run_gemsops_kernels_with_torchs_values_and_gradients() -> None:
    """A compiled step with kept mm and softmax gives eager torch's loss and gradients; the
    record counts the kept ops' calls as served and the graph reports say where they are."""
    x, w = _inputs()
    before = len(compiler.graphs())
    step = torch.compile(_f, backend="gemsops", options={"keep": KEEP})
    with gemsops.record() as rec:
        loss = step(x, w)
        loss.backward()
    x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
    expected = _f(x2, w2)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert rec.served["mm.default"] == 3  # x @ w forward; two mms in its backward
    assert rec.served["_softmax.default"] == 1
    assert rec.served["_softmax_backward_data.default"] == 1
    new = compiler.graphs()[before:]
    assert [g.name for g in new] == ["forward", "backward"]
    assert new[0].kept == {"_softmax.default": 1, "mm.default": 1}
    assert new[1].kept == {"_softmax_backward_data.default": 1, "mm.default": 2}
    assert "mm.default" not in new[0].left and "mul.Tensor" in new[0].left


def test_ops_not_kept_stay_with_inductor() -> None:
    """With keep=[] nothing in the graph calls gemsops, and no gemsops kernel runs, also
    right after the same function was compiled with kept ops (no cache hands that back)."""
    x, w = _inputs()
    torch.compile(_f, backend="gemsops", options={"keep": KEEP})(x, w)
    torch._dynamo.reset()
    before = len(compiler.graphs())
    with gemsops.record() as rec:
        loss = torch.compile(_f, backend="gemsops", options={"keep": []})(x, w)
    torch.testing.assert_close(loss, _f(x.detach(), w.detach()))
    assert not rec.served
    (graph,) = compiler.graphs()[before:]
    assert graph.kept == {} and graph.left["mm.default"] == 1


def test_reduce_overhead_mode_compiles_and_matches() -> None:
    """mode="reduce-overhead" (CUDA graphs where the device has them) gives torch's values."""
    x, w = _inputs()
    with_keep = torch.compile(_f, backend="gemsops",
                              options={"keep": KEEP, "mode": "reduce-overhead"})
    default_keep = torch.compile(_f, backend="gemsops", mode="reduce-overhead")
    with torch.no_grad(), gemsops.record() as rec:
        for _ in range(3):  # cudagraph trees record on a later call than the first
            kept = with_keep(x, w)
            default = default_keep(x, w)
    torch.testing.assert_close(kept, _f(x, w))
    torch.testing.assert_close(default, _f(x, w))
    if x.device.type == "cpu":  # no graphs on the CPU: every call runs the kept kernels
        assert rec.served["mm.default"] == 3
    with pytest.raises(Exception, match="give the mode once"):
        compiler.compile_backend(torch.fx.symbolic_trace(_f), [x, w], mode="reduce-overhead",
                                 options={"mode": "default"})


def test_keep_refuses_what_cannot_stand_in_a_graph() -> None:
    """An exact overload that writes an argument, and an unknown name, are refused with
    errors naming them; an op name keeps only its overloads that can stand in a graph."""
    with pytest.raises(GemsopsError, match=r"aten::mm\.out .*writes an argument"):
        compiler.kept_op("mm.out")
    with pytest.raises(GemsopsError, match="not the op name 'mm'"):
        compiler.kept_op("mm")
    with pytest.raises(UnknownOpError, match="matmull"):
        compiler.kept_op("matmull")
    x, w = _inputs()
    with pytest.raises(Exception, match=r"aten::mm\.out .*writes an argument"):
        torch.compile(_f, backend="gemsops", options={"keep": ["mm.out"]})(x, w)
    kept = compiler._resolve_keep(["mm"])
    assert sorted(kept.values()) == ["mm.default"]


def test_kept_op_hands_inputs_it_cannot_take_to_torch() -> None:
    """A kept op given an input gemsops refuses is served by torch's kernel, with a reason."""
    op = compiler.kept_op("mm.default")
    a = torch.randn(2, 3, dtype=torch.complex64, device=target_device())
    with gemsops.record() as rec:
        got = op(a, a.t())
    torch.testing.assert_close(got, a @ a.t())
    assert not rec.served
    assert dict(rec.fallbacks) == {("mm.default", "matmul of torch.complex64"): 1}
