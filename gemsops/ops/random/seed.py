"""Philox keys for the random kernels, drawn from torch's generators.

Every random kernel in gemsops is counter-based: element ``i`` of a call gets the
Philox output for counter ``i`` under a 64-bit key, so the numbers do not depend on the
launch grid, the tile sizes or the number of programs. Each call draws a fresh key:

* from the generator the caller passed (``bernoulli_(p, generator=g)``), or else from
  the **default generator of the tensor's device**: ``torch.manual_seed`` seeds it
  (torch seeds every device's default generator), and so do the per-device seeding and
  state save/restore calls that activation checkpointing and ``torch.random.fork_rng``
  make, so recomputed dropout masks come out the same;
* as one int64 drawn by torch's own ``random_`` over the full 64-bit range **into a
  one-element tensor on the device**; the kernel reads its key from there. The host
  never reads the value, so there is no device synchronisation; the cost is one small
  launch of torch's random kernel per call.

The counter starts at 0 for every call: two calls differ by their keys, not by an
offset into one stream (Philox streams under distinct keys are independent, and 2**64
keys make a repeat negligible). Because the key is drawn by torch's kernel, which reads
its generator's state on the device while a graph is captured, the key changes on every
replay of a captured graph; capture of these ops is nevertheless untested and not
claimed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gemsops.errors import Unsupported

__all__ = ["philox_key"]

_LOW = -(2**63)


def philox_key(device: torch.device, generator: torch.Generator | None = None, *,
               shape: tuple[int, ...] = ()) -> Tensor:
    """A fresh 64-bit Philox key, as a 0-dim int64 tensor on ``device`` (or a tensor of
    ``shape`` holding independent 64-bit values, drawn in one call: attention's key and
    counter offset).

    Args:
        device: The device of the tensor the kernel fills; the key lives there.
        generator: The generator to draw from; the device's default generator when None.
        shape: The shape of the returned tensor; 0-dim by default.

    Raises:
        Unsupported: ``generator`` belongs to another device (torch raises).
    """
    if generator is not None and generator.device != device:
        raise Unsupported(f"generator of {generator.device} for a tensor on {device}")
    key = torch.empty(shape, dtype=torch.int64, device=device)
    return key.random_(_LOW, None, generator=generator)
