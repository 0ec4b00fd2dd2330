"""Intel: Intel GPUs through torch"s built-in XPU device type."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="intel",
    display_name="Intel",
    device_type="xpu",
    dispatch_key="XPU",
    triton_backends=("xpu",),
    torch_module=None,
    device_module_name="xpu",
    visible_devices_env="ZE_AFFINITY_MASK",
    dist_backend="xccl",
    capabilities=Capabilities(fp64=False),
    command_probe=("xpu-smi", "discovery"),
    probe=functools.partial(_probes.torch_backend, backend="xpu"),
    warp_size=16,
)
