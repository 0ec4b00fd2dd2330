"""Kunlunxin: Kunlunxin XPUs report device type "cuda"; the device name tells them apart."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="kunlunxin",
    display_name="Kunlunxin",
    device_type="cuda",
    dispatch_key="CUDA",
    triton_backends=("kunlunxin",),
    torch_module=None,
    device_module_name="cuda",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    dist_backend="bkcl",
    capabilities=Capabilities(fp64=False),
    command_probe=("xpu-smi",),
    probe=functools.partial(_probes.cuda_lookalike, markers=_probes.KUNLUNXIN_MARKERS),
    warp_size=64,
)
