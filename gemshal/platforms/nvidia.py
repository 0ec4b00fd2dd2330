"""NVIDIA.

Uses torch"s built-in CUDA runtime; the probe reads torch.cuda but starts no subprocess.
"""

from __future__ import annotations

from gemshal.platforms import _probes
from gemshal.vendor import ArchFeatures, Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="nvidia",
    native_launch="cuda-driver",
    display_name="NVIDIA",
    device_type="cuda",
    dispatch_key="CUDA",
    triton_backends=("cuda",),
    torch_module=None,
    device_module_name="cuda",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    dist_backend="nccl",
    capabilities=Capabilities(fp8=True),
    command_probe=("nvidia-smi", "-L"),
    probe=_probes.nvidia,
    warp_size=32,
    # Hopper (sm90) and later move tiles with the tensor memory accelerator (TMA).
    arch_features=(ArchFeatures(("tensor_descriptors",), min_capability=(9, 0)),),
)
