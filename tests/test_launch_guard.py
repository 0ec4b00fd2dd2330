"""The launch wing makes the input's device current, and only when it is not already:
op modules enter no guard of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import gemshal
import gemsops
from gemsops.testing.strategies import target_device


def _cases() -> dict[str, Callable[[torch.device], Callable[[], Any]]]:
    """Per op, a builder: it makes the inputs on a device (with torch's own kernels, outside
    any use_gems block: randn's normal_ is a gemsops op too) and returns the call."""

    def rand(*shape: int, dev: torch.device) -> torch.Tensor:
        return torch.randn(*shape, device=dev)

    def add(d: torch.device) -> Callable[[], Any]:
        a, b = rand(8, dev=d), rand(8, dev=d)
        return lambda: torch.add(a, b)

    def unary(fn: Callable[[torch.Tensor], Any], *shape: int) -> Callable[..., Any]:
        def build(d: torch.device) -> Callable[[], Any]:
            x = rand(*shape, dev=d)
            return lambda: fn(x)
        return build

    def mm(d: torch.device) -> Callable[[], Any]:
        a, b = rand(4, 8, dev=d), rand(8, 3, dev=d)
        return lambda: a @ b

    def embedding(d: torch.device) -> Callable[[], Any]:
        idx, w = torch.tensor([1, 2], device=d), rand(5, 4, dev=d)
        return lambda: F.embedding(idx, w)

    def nll_loss(d: torch.device) -> Callable[[], Any]:
        x, t = rand(4, 5, dev=d), torch.tensor([0, 1, 2, 3], device=d)
        return lambda: F.nll_loss(x, t)

    def fill(d: torch.device) -> Callable[[], Any]:
        return lambda: torch.empty(4, device=d).fill_(2.0)  # a new tensor per call

    return {
        "add": add,
        "gelu": unary(F.gelu, 8),
        "sum": unary(lambda x: x.sum(-1), 4, 8),
        "argmax": unary(lambda x: x.argmax(0), 4, 8),
        "cumsum": unary(lambda x: x.cumsum(1), 4, 8),
        "softmax": unary(lambda x: torch.softmax(x, -1), 4, 8),
        "layer_norm": unary(lambda x: F.layer_norm(x, (8,)), 4, 8),
        "mm": mm,
        "embedding": embedding,
        "nll_loss": nll_loss,
        "fill": fill,
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_ops_on_the_current_device_enter_no_guard(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served through aten with its inputs on the current device, an op enters no
    device_guard: the launch wing checks the device once per launch and guards only a
    tensor on another device (the next test and test_kernel.py cover that case)."""
    seen: list[Any] = []
    real = gemshal.device_guard

    def recording_guard(device: Any) -> gemshal.DeviceGuard:
        seen.append(device)
        return real(device)

    monkeypatch.setattr(gemshal, "device_guard", recording_guard)
    monkeypatch.setattr(gemshal.device, "device_guard", recording_guard)
    dev = target_device()
    call = _cases()[name](dev)
    with gemsops.use_gems(), gemsops.record() as rec:
        call()
    assert sum(rec.served.values()) >= 1, rec
    assert seen == []


def _two_devices() -> bool:
    vendor = gemshal.current_vendor()
    return not vendor.is_cpu and gemshal.current_device().count >= 2


@pytest.mark.skipif(not _two_devices(), reason="needs two devices of one vendor")
@pytest.mark.parametrize("name", sorted(_cases()))
def test_op_on_a_device_that_is_not_current(name: str) -> None:
    """With device 0 current, the op on device 1's tensors runs there, gives torch's
    answer, and leaves device 0 current."""
    module = gemshal.device_module()
    module.set_device(0)
    other = torch.device(gemshal.current_vendor().device_type, 1)
    call = _cases()[name](other)
    expected = call()
    with gemsops.use_gems(), gemsops.record() as rec:
        got = call()
    assert sum(rec.served.values()) >= 1, rec
    assert got.device == other
    assert module.current_device() == 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
