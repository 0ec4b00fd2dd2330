"""current_device(), select() and device_guard(), on the CPU and on a fake accelerator."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gemshal
from gemshal import DeviceGuardError, DeviceNotFoundError
from gemshal import detect as detect_module
from gemshal import device as device_module
from gemshal.testing import fake_vendor

ON_CPU = gemshal.current_vendor().is_cpu
cpu_only = pytest.mark.skipif(not ON_CPU, reason="describes a machine without accelerators")


@cpu_only
def test_cpu_device_record_describes_the_interpreter(isolated: None) -> None:
    """On a machine without accelerators the device is the CPU, run by the interpreter."""
    with pytest.warns(RuntimeWarning, match="interpreter"):
        dev = gemshal.current_device()
    assert dev.vendor is gemshal.vendor("cpu")
    assert dev.torch_device == torch.device("cpu")
    assert dev.interpreter and dev.count == 1 and dev.multiprocessor_count >= 1
    assert gemshal.current_device() is dev


@cpu_only
def test_cpu_fallback_switches_triton_to_its_interpreter(isolated: None) -> None:
    """Choosing the cpu vendor turns on Triton's interpreter before kernels are decorated."""
    import triton

    gemshal.select("cpu")
    assert triton.knobs.runtime.interpret is True


def test_first_resolution_from_many_threads_happens_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen threads asking at once trigger exactly one detection."""
    name = gemshal.current_vendor().name
    monkeypatch.setattr(device_module, "_STATE", None)
    monkeypatch.setattr(device_module, "_EXPLICIT", None)
    calls = []
    real = detect_module.detect
    barrier = threading.Barrier(16)

    def counting_detect(**kwargs: object) -> detect_module.Detection:
        calls.append(1)
        return real(facts=gemshal.StaticFacts(), env={}, explicit=name)

    monkeypatch.setattr(device_module, "detect", counting_detect)
    seen: list[gemshal.Device] = []

    def worker() -> None:
        barrier.wait()
        seen.append(gemshal.current_device())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(seen) == 16 and all(d is seen[0] for d in seen)


def test_select_unknown_vendor_names_the_valid_ones(isolated: None) -> None:
    """select() with a typo raises UnknownVendorError listing the vendors."""
    with pytest.raises(gemshal.UnknownVendorError, match="nvidia"):
        gemshal.select("nvdia")


def test_guard_on_cpu_is_a_no_op() -> None:
    """Guarding a CPU device, tensor or string changes nothing and returns the shared guard."""
    # An int names an index of the current vendor's devices: the CPU only where it is current.
    cpu_values = (torch.device("cpu"), torch.zeros(1), "cpu", *((0,) if ON_CPU else ()))
    guards = {id(gemshal.device_guard(x)) for x in cpu_values}
    assert len(guards) == 1


def test_guard_switches_and_restores_a_fake_device() -> None:
    """A guard sets the requested index and restores the previous one on exit."""
    with fake_vendor(count=4) as mod:
        with gemshal.device_guard(2):
            assert mod.current == 2
        assert mod.current == 0
        assert mod.switches == [2, 0]


def test_guard_restores_on_exception() -> None:
    """An exception inside the block still restores the previous device."""
    with fake_vendor(count=4) as mod:
        with pytest.raises(KeyError), gemshal.device_guard(torch.device("meta", 3)):
            assert mod.current == 3
            raise KeyError("boom")
        assert mod.current == 0


def test_guard_for_the_current_index_does_not_switch() -> None:
    """Guarding the device that is already current makes no set_device call."""
    with fake_vendor(count=2) as mod:
        with gemshal.device_guard("meta:0"):
            pass
        assert mod.switches == []


@given(st.lists(st.integers(0, 3), max_size=6), st.integers(0, 3))
def test_any_nesting_of_guards_restores_the_start(path: list[int], start: int) -> None:
    """Property: any nesting of guards leaves the starting index current, level by level."""
    with fake_vendor(count=4) as mod:
        mod.current = start

        def nest(level: int) -> None:
            if level == len(path):
                return
            before = mod.current
            with gemshal.device_guard(path[level]):
                assert mod.current == path[level]
                nest(level + 1)
                assert mod.current == path[level]
            assert mod.current == before

        nest(0)
        assert mod.current == start


def test_guard_rejects_bad_values_naming_them() -> None:
    """Foreign device types, negative or out-of-range indices and odd types are errors."""
    with fake_vendor(count=2):
        with pytest.raises(DeviceGuardError, match=r"'cuda:0'.*not a fakegpu device"):
            gemshal.device_guard("cuda:0")
        with pytest.raises(DeviceGuardError, match=r"valid indices are 0\.\.1"):
            gemshal.device_guard(5)
        with pytest.raises(DeviceGuardError, match=">= 0"):
            gemshal.device_guard(-1)
        with pytest.raises(DeviceGuardError, match="float"):
            gemshal.device_guard(1.5)  # type: ignore[arg-type]
        with pytest.raises(DeviceGuardError, match="not a device"):
            gemshal.device_guard("gpu-one")


def test_device_records_out_of_range_is_an_error() -> None:
    """get_device with a bad index names the valid range."""
    with fake_vendor(count=2), pytest.raises(DeviceNotFoundError, match=r"0\.\.1"):
        gemshal.get_device(7)


def test_device_module_is_the_vendors_module() -> None:
    """device_module() hands out the vendor's runtime module (a fake one here)."""
    before = gemshal.device_module()
    with fake_vendor(count=3) as mod:
        assert gemshal.device_module() is mod
    assert gemshal.device_module() is before is not mod
    expected = torch.cpu if ON_CPU else getattr(torch, gemshal.current_vendor().device_module_name)
    assert before is expected


def test_device_of_names_the_operands_device_not_the_current_one() -> None:
    """device_of() gives the record of the device a value names, whichever device is current;
    the CPU and an index-less device give the current one; a foreign device is an error."""
    with fake_vendor(count=3) as mod:
        assert gemshal.device_of(torch.device("meta", 2)).index == 2
        assert gemshal.device_of("meta:1") is gemshal.get_device(1)
        assert mod.current == 0 and mod.switches == []
        mod.current = 1
        assert gemshal.device_of(torch.zeros(1)) is gemshal.get_device(1)
        assert gemshal.device_of("meta").index == 1
        with pytest.raises(DeviceGuardError, match=r"'cuda:0'.*not a fakegpu device"):
            gemshal.device_of("cuda:0")


def test_guard_with_a_single_device_switches_nothing() -> None:
    """With one device, guarding it is the shared no-op guard: no runtime call per launch."""
    with fake_vendor(count=1) as mod:
        assert gemshal.device_guard(0) is gemshal.device_guard("meta:0")
        assert gemshal.device_guard(0) is gemshal.device_guard("cpu")
        with gemshal.device_guard(torch.device("meta", 0)):
            pass
        assert mod.switches == []
        with pytest.raises(DeviceGuardError, match=r"valid indices are 0\.\.0"):
            gemshal.device_guard(1)


def test_scratch_allocator_is_installed_once_and_keeps_a_users() -> None:
    """ensure_scratch_allocator installs gemshal's allocator where Triton has none (it
    hands out device memory of the asked size) and leaves a user's allocator in place."""
    import contextvars

    import triton
    from triton.runtime import _allocation

    def fresh() -> None:
        _allocation._allocator.set(_allocation.NullAllocator())
        gemshal.ensure_scratch_allocator()
        installed = _allocation._allocator.get()
        buf = installed(256, 128, None)
        assert buf.numel() == 256 and buf.device == gemshal.current_device().torch_device

        def mine(size: int, alignment: int, stream: int | None) -> torch.Tensor:
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(mine)
        gemshal.ensure_scratch_allocator()
        assert _allocation._allocator.get() is mine

    contextvars.copy_context().run(fresh)
