"""AMD: ROCm builds of torch report device type "cuda"; torch.version.hip tells them apart."""

from __future__ import annotations

import functools

from gemshal.platforms import _probes
from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="amd",
    display_name="AMD",
    device_type="cuda",
    dispatch_key="CUDA",
    triton_backends=("hip",),
    torch_module=None,
    device_module_name="cuda",
    visible_devices_env="HIP_VISIBLE_DEVICES",
    dist_backend="nccl",
    capabilities=Capabilities(fp8=True),
    command_probe=("rocm-smi", "--showproductname"),
    probe=functools.partial(_probes.rocm, hygon=False),
    warp_size=64,
    launch_options=("waves_per_eu", "matrix_instr_nonkdim", "kpack"),
)
