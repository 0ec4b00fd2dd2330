"""Test helpers: a fake accelerator so device code is testable without hardware.

``fake_vendor()`` registers a vendor whose device module records every
``set_device`` call, selects it, and restores the previous resolution on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import attrs

from gemshal import device as _device
from gemshal import registry as _registry
from gemshal.detect import Detection, TraceStep
from gemshal.vendor import VendorInfo

__all__ = ["FakeDeviceModule", "FakeProperties", "fake_vendor"]


@attrs.define
class FakeDeviceModule:
    """Stands in for ``torch.cuda`` and friends: tracks the current index and every switch."""

    count: int = 2
    current: int = 0
    switches: list[int] = attrs.field(factory=list)

    def device_count(self) -> int:
        """How many fake devices there are."""
        return self.count

    def current_device(self) -> int:
        """The fake current index."""
        return self.current

    def set_device(self, index: int) -> None:
        """Switch the fake current index, recording the switch."""
        if not 0 <= index < self.count:
            raise RuntimeError(f"invalid device ordinal {index}")
        self.switches.append(index)
        self.current = index

    def synchronize(self, device: object = None) -> None:
        """Nothing to wait for."""

    def get_device_properties(self, index: int) -> FakeProperties:
        """Properties shaped like torch's, for the fake device ``index``."""
        if not 0 <= index < self.count:
            raise RuntimeError(f"invalid device ordinal {index}")
        return FakeProperties(name=f"Fake Device {index}")


@attrs.frozen
class FakeProperties:
    """The fields of ``torch.cuda.get_device_properties`` that gemshal reads."""

    name: str
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 4
    total_memory: int = 2**30
    warp_size: int = 32


@contextlib.contextmanager
def fake_vendor(
    name: str = "fakegpu", *, device_type: str = "meta", count: int = 2
) -> Iterator[FakeDeviceModule]:
    """Make a fake vendor current for the ``with`` block.

    ``device_type`` defaults to ``meta`` so torch can build ``torch.device`` values
    for it without any backend. Yields the fake device module.
    """
    info = VendorInfo(
        name=name,
        display_name=f"Fake ({name})",
        device_type=device_type,
        dispatch_key="Meta",
        triton_backends=(name,),
    )
    module = FakeDeviceModule(count=count)
    with _registry.registered(info, source="gemshal.testing.fake_vendor") as chosen:
        step = TraceStep("explicit", "chosen", "gemshal.testing.fake_vendor", name)
        # Installing can raise (a vendor with no devices): both blocks undo what they did.
        with _device.installed(Detection(chosen, "explicit", (step,)), module):
            yield module
