"""MetaX: MetaX GPUs report device type "cuda"; the device name tells them apart from NVIDIA."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="metax",
    display_name="MetaX",
    device_type="cuda",
    dispatch_key="CUDA",
    triton_backends=("maca",),
    torch_module=None,
    device_module_name="cuda",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    dist_backend="nccl",
    capabilities=Capabilities(),
    command_probe=("mx-smi",),
    probe=functools.partial(_probes.cuda_lookalike, markers=_probes.METAX_MARKERS),
    warp_size=64,
)
