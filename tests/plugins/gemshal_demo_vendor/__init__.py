"""An out-of-tree vendor, packaged the way a real plugin is: an entry point names it."""

from gemshal import Claim, Facts, VendorInfo


def _probe(facts: Facts) -> Claim | None:
    if facts.has_module("demo_runtime"):
        return Claim("the demo_runtime module is installed")
    return None


VENDOR = VendorInfo(
    name="demo",
    display_name="Demo Accelerator",
    device_type="meta",
    dispatch_key="Meta",
    triton_backends=("demo",),
    dist_backend="gloo",
    probe=_probe,
)
