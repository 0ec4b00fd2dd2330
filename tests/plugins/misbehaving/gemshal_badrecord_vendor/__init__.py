"""Plugins whose VendorInfo has a wrong type in a field: a string where a tuple of strings
belongs, and a dict where a Capabilities record belongs."""

from gemshal import Capabilities, VendorInfo


def _record(name: str, **fields: object) -> VendorInfo:
    return VendorInfo(name=name, display_name="QA", device_type="cpu", dispatch_key="CPU",
                      triton_backends=(name,), **fields)  # type: ignore[arg-type]


def string_tune_dirs() -> VendorInfo:
    """``tune_dirs="/tmp/x/tune"``: iterated, it would be one directory per letter."""
    return _record("qastr", tune_dirs="/tmp/x/tune")


def dict_capabilities() -> VendorInfo:
    """``capabilities={"fp64": False}`` instead of ``Capabilities(fp64=False)``."""
    assert Capabilities(fp64=False)  # the right spelling builds
    return _record("qacaps", capabilities={"fp64": False})
