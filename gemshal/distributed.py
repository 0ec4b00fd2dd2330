"""Scale-out through the HAL: pick this rank's device and the vendor's process-group backend.

A ``torchrun`` job calls :func:`bind_local_rank` once, then
``torch.distributed.init_process_group(backend=setup.backend)``: no vendor name
appears in the job. gemshal writes no communication code; torch.distributed does it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from gemshal import device as _device
from gemshal.errors import ConfigError

__all__ = ["RankSetup", "bind_local_rank", "dist_backend", "local_rank"]


@attrs.frozen
class RankSetup:
    """What one process of a distributed job runs on.

    Attributes:
        rank: Global rank (``RANK``), 0 when unset.
        local_rank: Rank on this host (``LOCAL_RANK``), 0 when unset.
        world_size: Number of processes (``WORLD_SIZE``), 1 when unset.
        device: The device this rank was bound to.
        backend: The torch.distributed backend for the vendor (``nccl``, ``gloo``...).
    """

    rank: int
    local_rank: int
    world_size: int
    device: _device.Device
    backend: str


def _int_var(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a non-negative integer; got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be a non-negative integer; got {raw!r}")
    return value


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's ``LOCAL_RANK`` (0 when unset).

    Raises:
        ConfigError: the variable is not a non-negative integer.
    """
    return _int_var(os.environ if env is None else env, "LOCAL_RANK", 0)


def dist_backend() -> str:
    """The torch.distributed backend of the current vendor (``gloo`` on the CPU)."""
    return _device.current_vendor().dist_backend


def bind_local_rank(env: Mapping[str, str] | None = None) -> RankSetup:
    """Make device ``LOCAL_RANK`` current for this process and describe the rank.

    Ranks beyond the device count share devices round-robin. On the CPU every rank
    uses the CPU.

    Raises:
        ConfigError: ``RANK``, ``LOCAL_RANK`` or ``WORLD_SIZE`` is malformed.
    """
    values = os.environ if env is None else env
    local = local_rank(values)
    rank = _int_var(values, "RANK", 0)
    world = _int_var(values, "WORLD_SIZE", 1)
    info = _device.current_vendor()
    if info.is_cpu:
        dev = _device.get_device(0)
    else:
        dev = _device.get_device(local % _device.get_device(0).count)
        _device.device_module().set_device(dev.index)
    return RankSetup(
        rank=rank, local_rank=local, world_size=world, device=dev, backend=info.dist_backend
    )
