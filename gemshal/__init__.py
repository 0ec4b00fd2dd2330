"""gemshal: the hardware abstraction layer for Triton operator libraries.

Importing gemshal does nothing but define names: no detection, no subprocess, no
file read, no device runtime. The vendor is resolved on the first call that needs it.
"""

from __future__ import annotations

from gemshal.detect import Detection as Detection
from gemshal.detect import TraceStep as TraceStep
from gemshal.device import Device as Device
from gemshal.device import DeviceGuard as DeviceGuard
from gemshal.device import current_device as current_device
from gemshal.device import current_vendor as current_vendor
from gemshal.device import detection as detection
from gemshal.device import detection_trace as detection_trace
from gemshal.device import device_guard as device_guard
from gemshal.device import device_module as device_module
from gemshal.device import device_of as device_of
from gemshal.device import ensure_scratch_allocator as ensure_scratch_allocator
from gemshal.device import get_device as get_device
from gemshal.device import select as select
from gemshal.errors import AmbiguousDeviceError as AmbiguousDeviceError
from gemshal.errors import ConfigError as ConfigError
from gemshal.errors import DeviceGuardError as DeviceGuardError
from gemshal.errors import DeviceNotFoundError as DeviceNotFoundError
from gemshal.errors import GemshalError as GemshalError
from gemshal.errors import PluginLoadError as PluginLoadError
from gemshal.errors import UnknownVendorError as UnknownVendorError
from gemshal.probe import Claim as Claim
from gemshal.probe import Facts as Facts
from gemshal.probe import StaticFacts as StaticFacts
from gemshal.registry import PluginFailure as PluginFailure
from gemshal.registry import plugin_failures as plugin_failures
from gemshal.registry import register_vendor as register_vendor
from gemshal.registry import vendor as vendor
from gemshal.registry import vendor_names as vendor_names
from gemshal.registry import vendors as vendors
from gemshal.vendor import Arch as Arch
from gemshal.vendor import ArchFeatures as ArchFeatures
from gemshal.vendor import Capabilities as Capabilities
from gemshal.vendor import VendorInfo as VendorInfo

__version__ = "0.1.0"

__all__ = [
    "AmbiguousDeviceError",
    "Arch",
    "ArchFeatures",
    "Capabilities",
    "Claim",
    "ConfigError",
    "Detection",
    "Device",
    "DeviceGuard",
    "DeviceGuardError",
    "DeviceNotFoundError",
    "Facts",
    "GemshalError",
    "PluginFailure",
    "PluginLoadError",
    "StaticFacts",
    "TraceStep",
    "UnknownVendorError",
    "VendorInfo",
    "current_device",
    "current_vendor",
    "detection",
    "detection_trace",
    "device_guard",
    "device_module",
    "device_of",
    "ensure_scratch_allocator",
    "get_device",
    "plugin_failures",
    "register_vendor",
    "select",
    "vendor",
    "vendor_names",
    "vendors",
]
