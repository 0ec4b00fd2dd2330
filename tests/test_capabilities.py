"""gemshal.Capabilities.supports / refusal: the one place a dtype's support is decided."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gemshal import Capabilities

FLAGGED = {
    torch.float64: "fp64",
    torch.bfloat16: "bf16",
    torch.int64: "int64",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}
ALWAYS = (torch.float16, torch.float32, torch.int8, torch.uint8, torch.int16, torch.int32,
          torch.bool)


@given(fp64=st.booleans(), bf16=st.booleans(), int64=st.booleans(), fp8=st.booleans())
def test_a_dtype_is_refused_exactly_when_its_flag_is_off(fp64: bool, bf16: bool, int64: bool,
                                                         fp8: bool) -> None:
    """Property: supports(dtype) is the flag of the dtype's family (True for dtypes no flag
    governs), and refusal() is None exactly when supports() is True, else names the
    dtype and the missing flag."""
    caps = Capabilities(fp64=fp64, bf16=bf16, int64=int64, fp8=fp8)
    flags = {"fp64": fp64, "bf16": bf16, "int64": int64, "fp8": fp8}
    for dtype, flag in FLAGGED.items():
        assert caps.supports(dtype) is flags[flag]
        reason = caps.refusal(dtype)
        if flags[flag]:
            assert reason is None
        else:
            assert reason is not None
            assert str(dtype).removeprefix("torch.") in reason and flag in reason
    for dtype in ALWAYS:
        assert caps.supports(dtype) and caps.refusal(dtype) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_kernel_hands_back_a_dtype_the_vendor_lacks(dtype: torch.dtype,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """gemsops asks the current vendor's capabilities: without the flag, an op raises
    Unsupported naming the reason (the registry then hands the call to torch)."""
    import attrs

    import gemshal
    from gemsops.errors import Unsupported
    from gemsops.ops import dtypes

    vendor = gemshal.current_vendor()
    flag = FLAGGED[dtype]
    lacking = attrs.evolve(vendor, capabilities=attrs.evolve(vendor.capabilities,
                                                             **{flag: False}))
    monkeypatch.setattr(gemshal, "current_vendor", lambda: lacking)
    with pytest.raises(Unsupported, match=flag):
        dtypes.check_supported(dtype)
    dtypes.check_supported(torch.float32)  # what no flag governs stays supported


def test_arch_features_apply_by_capability_or_tag() -> None:
    """A rule covers capabilities from its minimum up, or the tags it names; the NVIDIA
    record gives Hopper tensor descriptors and Ampere none."""
    from gemshal import Arch, ArchFeatures
    from gemshal.platforms.nvidia import VENDOR

    rule = ArchFeatures(("tensor_descriptors",), min_capability=(9, 0))
    assert rule.applies(Arch.from_capability(9, 0)) and rule.applies(Arch.from_capability(12, 0))
    assert not rule.applies(Arch.from_capability(8, 9)) and not rule.applies(Arch(name="gfx942"))
    by_tag = ArchFeatures(("tensor_descriptors",), archs=("gfx950",))
    assert by_tag.applies(Arch(name="gfx950")) and not by_tag.applies(Arch(name="gfx942"))
    assert VENDOR.features_of(Arch.from_capability(9, 0)) == {"tensor_descriptors"}
    assert VENDOR.features_of(Arch.from_capability(8, 0)) == frozenset()


def test_unknown_feature_names_are_errors_that_list_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A misspelt feature is refused in a rule, in Device.has and in GEMS_DISABLE_FEATURES,
    each message naming the bad name, a close match and the features."""
    import gemshal
    from gemshal import ArchFeatures
    from gemshal.device import disabled_features
    from gemshal.errors import ConfigError

    hint = r"'tensor_descriptor' \(did you mean 'tensor_descriptors'\?\)"
    with pytest.raises(ValueError, match=hint):
        ArchFeatures(("tensor_descriptor",))
    with pytest.raises(ValueError, match="the features are tensor_descriptors"):
        gemshal.current_device().has("tma")
    monkeypatch.setenv("GEMS_DISABLE_FEATURES", "tma")
    with pytest.raises(ConfigError, match="GEMS_DISABLE_FEATURES: unknown feature 'tma'"):
        disabled_features()
    monkeypatch.setenv("GEMS_DISABLE_FEATURES", " tensor_descriptors, ")
    assert disabled_features() == {"tensor_descriptors"}


def test_records_report_features_as_json() -> None:
    """The device record lists its features sorted; a vendor record its rules, JSON-ready."""
    import json

    import gemshal
    from gemshal.platforms.nvidia import VENDOR

    d = gemshal.current_device()
    assert json.loads(json.dumps(d.as_dict()))["features"] == sorted(d.features)
    assert json.loads(json.dumps(VENDOR.as_dict()))["arch_features"] == [
        {"features": ["tensor_descriptors"], "min_capability": [9, 0], "archs": []}
    ]
