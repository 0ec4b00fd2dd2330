"""The vendor registry: built-ins, singletons, plugins and errors."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gemshal
from gemshal import GemshalError, UnknownVendorError, VendorInfo

BUILTIN = (
    "nvidia", "amd", "intel", "ascend", "cambricon", "mthreads",
    "metax", "iluvatar", "kunlunxin", "hygon", "cpu",
)  # fmt: skip


def test_every_builtin_vendor_is_registered() -> None:
    """The eleven built-in vendors are all present, each under its own name."""
    assert set(BUILTIN) <= set(gemshal.vendor_names())


@given(st.sampled_from(BUILTIN))
def test_vendor_round_trips_by_name(name: str) -> None:
    """Property: every registered vendor is found by its name, as the same object."""
    info = gemshal.vendor(name)
    assert info.name == name
    assert gemshal.vendor(info.name) is info


def test_vendor_records_are_frozen() -> None:
    """A VendorInfo cannot be mutated; changes go through attrs.evolve into a new record."""
    info = gemshal.vendor("nvidia")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        info.name = "x"  # type: ignore[misc]
    copy = attrs.evolve(info, name="nvidia2")
    assert copy.name == "nvidia2" and copy is not info and copy != info


def test_vendor_fields_match_their_runtimes() -> None:
    """Each vendor reports its torch device type, dispatch key and distributed backend."""
    expect = {
        "nvidia": ("cuda", "CUDA", "nccl"),
        "amd": ("cuda", "CUDA", "nccl"),
        "intel": ("xpu", "XPU", "xccl"),
        "ascend": ("npu", "PrivateUse1", "hccl"),
        "cambricon": ("mlu", "PrivateUse1", "cncl"),
        "mthreads": ("musa", "PrivateUse1", "mccl"),
        "cpu": ("cpu", "CPU", "gloo"),
    }
    for name, (device_type, key, dist) in expect.items():
        info = gemshal.vendor(name)
        assert (info.device_type, info.dispatch_key, info.dist_backend) == (device_type, key, dist)


def test_unknown_vendor_lists_known_names() -> None:
    """An unknown name raises UnknownVendorError, a LookupError, naming the valid vendors."""
    with pytest.raises(LookupError) as caught:
        gemshal.vendor("nvidai")
    assert isinstance(caught.value, UnknownVendorError)
    message = str(caught.value)
    assert "'nvidai'" in message and "nvidia" in message and "ascend" in message
    assert "Did you mean 'nvidia'" in message


def test_vendor_record_validates_fields() -> None:
    """Bad field values are rejected when the record is built, naming the field."""
    with pytest.raises(ValueError, match="name"):
        VendorInfo(
            name="Bad Name", display_name="x", device_type="x", dispatch_key="X",
            triton_backends=("x",),
        )  # fmt: skip
    with pytest.raises(ValueError, match="triton_backends"):
        VendorInfo(
            name="ok", display_name="x", device_type="x", dispatch_key="X", triton_backends=()
        )
    with pytest.raises(ValueError):
        VendorInfo(
            name="ok", display_name="x", device_type="x", dispatch_key="X",
            triton_backends=("x",), dist_backend="mpi-ish",
        )  # fmt: skip


def test_duplicate_vendor_name_is_an_error(isolated: None) -> None:
    """Registering a second vendor under an existing name fails, naming both sources."""
    clash = attrs.evolve(gemshal.vendor("nvidia"))
    with pytest.raises(GemshalError, match="already registered by gemshal"):
        gemshal.register_vendor(clash)


def test_working_plugin_is_loaded_from_its_entry_point(plugins: Path) -> None:
    """A plugin package's entry point adds its vendor after the built-ins."""
    demo = gemshal.vendor("demo")
    assert demo.display_name == "Demo Accelerator"
    assert gemshal.vendor_names()[-1] == "demo"
    from gemshal.registry import vendor_source

    assert vendor_source("demo") == "plugin gemshal_demo_vendor:VENDOR"


def test_broken_plugin_never_breaks_the_registry(plugins: Path) -> None:
    """A plugin whose import fails is recorded, and selecting it re-raises its error."""
    failures = {f.name: f for f in gemshal.plugin_failures()}
    assert "broken" in failures
    assert isinstance(failures["broken"].error, ImportError)
    assert "broken_runtime" in failures["broken"].describe()
    assert "nvidia" in gemshal.vendor_names()
    with pytest.raises(ImportError, match="broken_runtime"):
        gemshal.vendor("broken")


def test_broken_plugin_shows_in_the_detection_trace(plugins: Path) -> None:
    """Detection reports the failed plugin as an error line of its trace."""
    found = gemshal.detect.detect(facts=gemshal.StaticFacts(), env={})
    errors = [s for s in found.trace if s.verdict == "error"]
    assert any(s.vendor == "broken" and "broken_runtime" in s.detail for s in errors)


def test_plugin_probe_can_claim_the_machine(plugins: Path) -> None:
    """A plugin's own probe takes part in detection like a built-in's."""
    facts = gemshal.StaticFacts(modules={"demo_runtime"})
    found = gemshal.detect.detect(facts=facts, env={})
    assert found.vendor is gemshal.vendor("demo")
    assert found.stage == "probe"
