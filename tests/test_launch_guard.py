"""Every gemsops launch path makes the input's device current through gemshal.device_guard."""

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
def test_launch_path_guards_the_input_device(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served through aten, the op enters device_guard for the device its input lives on."""
    seen: list[str] = []
    real = gemshal.device_guard

    def recording_guard(device: Any) -> gemshal.DeviceGuard:
        seen.append(str(device.device if isinstance(device, torch.Tensor) else device))
        return real(device)

    monkeypatch.setattr(gemshal, "device_guard", recording_guard)
    dev = target_device()
    with gemsops.use_gems(), gemsops.record() as rec:
        _cases()[name](dev)
    assert sum(rec.served.values()) >= 1, rec
    assert seen, "no launch went through gemshal.device_guard"
    assert all(torch.device(s).type == dev.type for s in seen)
