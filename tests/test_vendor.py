"""VendorInfo, Capabilities, ArchFeatures and Arch validate every field when built."""

from __future__ import annotations

from typing import Any

import pytest

from gemshal import Arch, ArchFeatures, Capabilities, VendorInfo

GOOD: dict[str, Any] = {
    "name": "acme", "display_name": "Acme", "device_type": "cpu", "dispatch_key": "CPU",
    "triton_backends": ("acme",),
}

# (field, a wrong value, text the error must contain): one row per VendorInfo field.
WRONG_VENDOR = [
    ("name", 3, "name must be a string"),
    ("name", "Acme", "lower-case"),
    ("display_name", None, "display_name must be a string"),
    ("display_name", "", "non-empty"),
    ("device_type", b"cpu", "device_type must be a string"),
    ("dispatch_key", 1, "dispatch_key must be a string"),
    ("triton_backends", "acme", "the string 'acme'"),
    ("triton_backends", (), "non-empty tuple"),
    ("torch_module", 5, "torch_module must be a non-empty string or None"),
    ("device_module_name", None, "device_module_name must be a string"),
    ("visible_devices_env", ["X"], "visible_devices_env must be a non-empty string or None"),
    ("dist_backend", "mpi", "dist_backend"),
    ("capabilities", {"fp64": False}, "Capabilities(fp64=False)"),
    ("command_probe", "qastr-smi", "the string 'qastr-smi'"),
    ("probe", "not callable", "callable"),
    ("tune_dirs", "/tmp/x/tune", "the string '/tmp/x/tune'"),
    ("tune_dirs", ("/ok", 3), "tuple of non-empty strings"),
    ("warp_size", True, "warp_size must be an integer"),
    ("warp_size", 0, "warp_size"),
    ("launch_options", "kpack", "the string 'kpack'"),
    ("launch_options", ("nope",), "nope"),
    ("arch_features", ArchFeatures(("tensor_descriptors",)), "write (rule,)"),
    ("arch_features", ("x",), "ArchFeatures"),
    ("native_launch", "hip", "cuda-driver"),
]


def test_every_vendor_field_is_covered_by_a_wrong_value() -> None:
    """The table below names every field of VendorInfo (so a new field needs a row)."""
    import attrs

    assert {f.name for f in attrs.fields(VendorInfo)} == {row[0] for row in WRONG_VENDOR}


@pytest.mark.parametrize(("field", "value", "text"), WRONG_VENDOR)
def test_a_wrong_vendor_field_is_refused_naming_it(field: str, value: Any, text: str) -> None:
    """Building a VendorInfo with a wrong value in one field raises, naming the field or
    the value."""
    with pytest.raises((TypeError, ValueError)) as info:
        VendorInfo(**{**GOOD, field: value})
    assert text in str(info.value)


@pytest.mark.parametrize("field", ["fp64", "bf16", "int64", "fp8"])
@pytest.mark.parametrize("value", [0, 1, "yes", None])
def test_capability_flags_must_be_booleans(field: str, value: Any) -> None:
    """Each Capabilities flag takes True or False only (1 and "yes" are not flags)."""
    with pytest.raises(TypeError, match=f"{field} must be True or False"):
        Capabilities(**{field: value})


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"features": "tensor_descriptors"}, "the string"),
        ({"features": ("warp_magic",)}, "unknown feature"),
        ({"features": (), "min_capability": (9,)}, "(major, minor)"),
        ({"features": (), "min_capability": (9, "0")}, "(major, minor)"),
        ({"features": (), "archs": "gfx950"}, "the string 'gfx950'"),
    ],
)
def test_arch_feature_rules_validate_their_fields(kwargs: dict[str, Any], text: str) -> None:
    """ArchFeatures refuses a string for a tuple, an unknown feature, and a capability
    that is not two integers."""
    with pytest.raises((TypeError, ValueError)) as info:
        ArchFeatures(**kwargs)
    assert text in str(info.value)


def test_arch_validates_name_and_capability() -> None:
    """Arch takes a string name and a (major, minor) capability of two integers or None."""
    assert Arch.from_capability(9, 0).tag == "sm90"
    with pytest.raises(TypeError, match="name must be a string"):
        Arch(name=90)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capability must be"):
        Arch(name="sm90", capability=(9.0, 0))  # type: ignore[arg-type]
