"""gemsops: Triton kernels for aten ops, reaching the device only through gemshal.

Importing gemsops resolves no device and compiles no kernel: the op modules are
imported on first use (``enable()``, ``use_gems()`` or the first direct op call),
after gemshal has picked the vendor, so on a CPU-only machine the kernels run on
the Triton interpreter without any setting by hand.
"""

from __future__ import annotations

import importlib
from typing import Any

from gemsops import tuning as _tuning
from gemsops.errors import GemsopsError as GemsopsError
from gemsops.errors import UnknownOpError as UnknownOpError
from gemsops.errors import Unsupported as Unsupported
from gemsops.registry import CallRecord as CallRecord
from gemsops.registry import disable as disable
from gemsops.registry import enable as enable
from gemsops.registry import record as record
from gemsops.registry import registered_ops as registered_ops
from gemsops.registry import use_gems as use_gems

__version__ = "0.1.0"

_tuning.register()

# Public op functions, by the module that defines them; imported on first access.
_OPS: dict[str, str] = {}

__all__ = [
    "CallRecord",
    "GemsopsError",
    "UnknownOpError",
    "Unsupported",
    "disable",
    "enable",
    "record",
    "registered_ops",
    "use_gems",
    *sorted(_OPS),
]


def __getattr__(name: str) -> Any:
    module = _OPS.get(name)
    if module is None:
        raise AttributeError(f"module 'gemsops' has no attribute {name!r}")
    import gemshal

    gemshal.current_device()
    value = getattr(importlib.import_module(f"gemsops.ops.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_OPS))
