"""Huawei Ascend: Ascend NPUs through the torch_npu extension (PrivateUse1 dispatch key)."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="ascend",
    display_name="Huawei Ascend",
    device_type="npu",
    dispatch_key="PrivateUse1",
    triton_backends=("npu",),
    torch_module="torch_npu",
    device_module_name="npu",
    visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
    dist_backend="hccl",
    capabilities=Capabilities(fp64=False),
    command_probe=("npu-smi", "info"),
    probe=functools.partial(_probes.extension_module, module="torch_npu"),
    warp_size=32,
)
