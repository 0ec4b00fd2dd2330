"""gemsops: Triton kernels for aten ops, reaching the device only through gemshal.

Importing gemsops resolves no device and compiles no kernel: the op modules are
imported on first use (``enable()``, ``use_gems()`` or the first direct op call),
after gemshal has picked the vendor, so on a CPU-only machine the kernels run on
the Triton interpreter without any setting by hand.
"""

from __future__ import annotations

import functools
import pkgutil
from typing import Any

from gemsops import declare as _declare
from gemsops import tuning as _tuning
from gemsops.compiler import compile_backend as compile_backend
from gemsops.declare import op as op
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



_BASE_ALL = (
    "CallRecord",
    "GemsopsError",
    "UnknownOpError",
    "Unsupported",
    "compile_backend",
    "disable",
    "enable",
    "op",
    "record",
    "registered_ops",
    "use_gems",
)


@functools.cache
def _submodules() -> frozenset[str]:
    return frozenset(info.name for info in pkgutil.iter_modules(__path__))


def _public_ops() -> dict[str, Any]:
    """Declared public op functions by name; imports the op modules on first call."""
    import gemshal

    gemshal.current_device()
    return {d.name: d.fn for d in _declare.load() if d.public}


def __getattr__(name: str) -> Any:
    # __all__ is built on first use: it lists the declared ops, which importing gemsops
    # must not load (that resolves the device).
    if name == "__all__":
        return sorted({*_BASE_ALL, *_public_ops()})
    if name.startswith("_") or name in _submodules():
        # A submodule not imported yet (``from gemsops import bench``): the import
        # system imports it when this lookup fails; no op module is loaded for it.
        raise AttributeError(f"module 'gemsops' has no attribute {name!r}")
    value = _public_ops().get(name)
    if value is None:
        raise AttributeError(f"module 'gemsops' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_public_ops()))
