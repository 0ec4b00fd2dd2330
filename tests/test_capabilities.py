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
