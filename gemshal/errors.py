"""Every exception gemshal raises.

Each one also derives from the nearest built-in exception, so callers that
already catch ``LookupError`` or ``ValueError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousDeviceError",
    "ConfigError",
    "DeviceGuardError",
    "DeviceNotFoundError",
    "GemshalError",
    "PluginLoadError",
    "UnknownVendorError",
]


class GemshalError(Exception):
    """Base class of every error raised by gemshal."""


class UnknownVendorError(GemshalError, LookupError):
    """A vendor name is not in the registry; the message lists the known names."""


class AmbiguousDeviceError(GemshalError, RuntimeError):
    """Two or more vendors claimed this machine and none was chosen explicitly."""


class DeviceNotFoundError(GemshalError, LookupError):
    """A device index or type does not exist on this machine."""


class DeviceGuardError(GemshalError, ValueError):
    """``device_guard`` was given a value it cannot turn into a device of this vendor."""


class ConfigError(GemshalError, ValueError):
    """A tuning-config file or entry is malformed or missing."""


class PluginLoadError(GemshalError, ImportError):
    """A vendor was asked for whose plugin failed to load; the plugin's error is the cause."""
