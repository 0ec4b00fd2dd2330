"""Moore Threads: Moore Threads GPUs through the torch_musa extension (PrivateUse1 dispatch key)."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="mthreads",
    display_name="Moore Threads",
    device_type="musa",
    dispatch_key="PrivateUse1",
    triton_backends=("musa",),
    torch_module="torch_musa",
    device_module_name="musa",
    visible_devices_env="MUSA_VISIBLE_DEVICES",
    dist_backend="mccl",
    capabilities=Capabilities(fp64=False),
    command_probe=("mthreads-gmi",),
    probe=functools.partial(_probes.extension_module, module="torch_musa"),
    warp_size=32,
)
