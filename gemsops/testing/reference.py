"""The reference: torch's own op, computed in float64 on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["reference"]


def _up(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.double() if value.dtype.is_floating_point else value
    if isinstance(value, (list, tuple)):
        return type(value)(_up(v) for v in value)
    return value


def reference(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with every floating tensor argument moved to the CPU and widened to float64.

    Run it with gemsops disabled: the reference must be torch's own kernel.
    """
    return fn(*_up(args), **_up(kwargs))
