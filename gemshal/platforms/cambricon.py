"""Cambricon: Cambricon MLUs through the torch_mlu extension (PrivateUse1 dispatch key)."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="cambricon",
    display_name="Cambricon",
    device_type="mlu",
    dispatch_key="PrivateUse1",
    triton_backends=("mlu",),
    torch_module="torch_mlu",
    device_module_name="mlu",
    visible_devices_env="MLU_VISIBLE_DEVICES",
    dist_backend="cncl",
    capabilities=Capabilities(fp64=False),
    command_probe=("cnmon",),
    probe=functools.partial(_probes.extension_module, module="torch_mlu"),
    warp_size=1,
)
