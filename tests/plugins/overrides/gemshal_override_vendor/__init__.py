"""A vendor plugin that overrides gemsops kernels: runs on the Triton interpreter."""

from gemshal import VendorInfo

VENDOR = VendorInfo(
    name="overrider",
    display_name="Overrider (tests)",
    device_type="cpu",
    dispatch_key="CPU",
    triton_backends=("overrider",),
    probe=None,
)
