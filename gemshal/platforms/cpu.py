"""CPU (Triton interpreter).

The fallback: kernels run on CPU tensors through the Triton interpreter. Never probed;
chosen explicitly or when nothing else claims the machine.
"""

from __future__ import annotations

from gemshal.vendor import Capabilities, VendorInfo

VENDOR = VendorInfo(
    name="cpu",
    display_name="CPU (Triton interpreter)",
    device_type="cpu",
    dispatch_key="CPU",
    triton_backends=("interpreter",),
    torch_module=None,
    device_module_name="cpu",
    visible_devices_env=None,
    dist_backend="gloo",
    capabilities=Capabilities(),
    command_probe=(),
    probe=None,
    warp_size=1,
)
