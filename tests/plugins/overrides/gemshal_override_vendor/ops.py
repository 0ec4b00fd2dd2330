"""The overrides: neg on every arch of the vendor, abs on an arch no machine has."""

import torch

import gemsops

CALLS: list[str] = []


@gemsops.op("neg.default", vendor="overrider")
def neg(self: torch.Tensor) -> torch.Tensor:
    if self.dtype == torch.float64:
        raise gemsops.Unsupported("overrider neg takes no float64")
    CALLS.append("neg")
    return torch.mul(self, -1)  # inside a served call: torch's kernel computes it


@gemsops.op("abs.default", vendor="overrider", arch="no_such_arch")
def abs_(self: torch.Tensor) -> torch.Tensor:
    CALLS.append("abs")
    return torch.abs(self)
