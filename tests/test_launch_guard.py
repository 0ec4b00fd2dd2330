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


def _cases() -> dict[str, Callable[[torch.device], Any]]:
    def rand(*shape: int, dev: torch.device) -> torch.Tensor:
        return torch.randn(*shape, device=dev)

    return {
        "add": lambda d: torch.add(rand(8, dev=d), rand(8, dev=d)),
        "gelu": lambda d: F.gelu(rand(8, dev=d)),
        "sum": lambda d: rand(4, 8, dev=d).sum(-1),
        "argmax": lambda d: rand(4, 8, dev=d).argmax(0),
        "cumsum": lambda d: rand(4, 8, dev=d).cumsum(1),
        "softmax": lambda d: torch.softmax(rand(4, 8, dev=d), -1),
        "layer_norm": lambda d: F.layer_norm(rand(4, 8, dev=d), (8,)),
        "mm": lambda d: rand(4, 8, dev=d) @ rand(8, 3, dev=d),
        "embedding": lambda d: F.embedding(torch.tensor([1, 2], device=d), rand(5, 4, dev=d)),
        "nll_loss": lambda d: F.nll_loss(rand(4, 5, dev=d), torch.tensor([0, 1, 2, 3], device=d)),
        "fill": lambda d: torch.empty(4, device=d).fill_(2.0),
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
    with gemsops.use_gems(), gemsops.record() as rec:
        _cases()[name](dev)
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
    torch.manual_seed(0)
    expected = _cases()[name](other)
    torch.manual_seed(0)
    with gemsops.use_gems(), gemsops.record() as rec:
        got = _cases()[name](other)
    assert sum(rec.served.values()) >= 1, rec
    assert got.device == other
    assert module.current_device() == 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
