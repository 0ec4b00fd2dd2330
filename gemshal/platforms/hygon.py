"""Hygon.

Hygon DCUs run a ROCm torch (torch.version.hip set); the device name tells them apart from
AMD.
"""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="hygon",
    display_name="Hygon",
    device_type="cuda",
    dispatch_key="CUDA",
    triton_backends=("dcu",),
    torch_module=None,
    device_module_name="cuda",
    visible_devices_env="HIP_VISIBLE_DEVICES",
    dist_backend="nccl",
    capabilities=Capabilities(),
    command_probe=("hy-smi",),
    probe=functools.partial(_probes.rocm, hygon=True),
    warp_size=64,
)
