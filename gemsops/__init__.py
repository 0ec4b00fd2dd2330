"""gemsops: Triton kernels for aten ops, reaching the device only through gemshal.

Importing gemsops resolves no device and compiles no kernel: the op modules are
imported on first use (``enable()``, ``use_gems()`` or the first direct op call),
after gemshal has picked the vendor, so on a CPU-only machine the kernels run on
the Triton interpreter without any setting by hand.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from gemsops import declare as _declare
from gemsops import tuning as _tuning
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

# Public op functions of modules that still keep a hand-written table (being retired:
# declared ops are found through gemsops.declare).
_OPS: dict[str, str] = {
    "abs": "pointwise",
    "add": "pointwise",
    "amax": "reduce",
    "amin": "reduce",
    "argmax": "reduce_index",
    "argmin": "reduce_index",
    "clamp": "pointwise",
    "clamp_max": "pointwise",
    "clamp_min": "pointwise",
    "cos": "pointwise_activation",
    "cumsum": "scan",
    "div": "pointwise",
    "eq": "pointwise",
    "exp": "pointwise_activation",
    "fused_rms_norm": "norm",
    "fused_rms_norm_backward": "norm",
    "ge": "pointwise",
    "gelu": "pointwise_activation",
    "gelu_backward": "pointwise_activation",
    "gt": "pointwise",
    "layer_norm": "norm",
    "le": "pointwise",
    "log": "pointwise_activation",
    "log_softmax": "softmax",
    "log_softmax_backward": "softmax",
    "logical_and": "pointwise",
    "logical_not": "pointwise",
    "logical_or": "pointwise",
    "lt": "pointwise",
    "masked_fill": "pointwise",
    "max": "reduce",
    "max_dim": "reduce_index",
    "maximum": "pointwise",
    "mean": "reduce",
    "min": "reduce",
    "min_dim": "reduce_index",
    "minimum": "pointwise",
    "mul": "pointwise",
    "native_layer_norm": "norm",
    "native_layer_norm_backward": "norm",
    "ne": "pointwise",
    "neg": "pointwise",
    "pow": "pointwise",
    "prod": "reduce",
    "reciprocal": "pointwise_activation",
    "relu": "pointwise_activation",
    "rms_norm": "norm",
    "rsqrt": "pointwise_activation",
    "rsub": "pointwise",
    "sigmoid": "pointwise_activation",
    "sigmoid_backward": "pointwise_activation",
    "sign": "pointwise",
    "silu": "pointwise_activation",
    "silu_backward": "pointwise_activation",
    "sin": "pointwise_activation",
    "softmax": "softmax",
    "softmax_backward": "softmax",
    "sqrt": "pointwise_activation",
    "sub": "pointwise",
    "sum": "reduce",
    "tanh": "pointwise_activation",
    "tanh_backward": "pointwise_activation",
    "threshold": "pointwise_activation",
    "threshold_backward": "pointwise_activation",
    "var_mean": "reduce_stats",
    "where": "pointwise",
}


_BASE_ALL = (
    "CallRecord",
    "GemsopsError",
    "UnknownOpError",
    "Unsupported",
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
    ops = {d.name: d.fn for d in _declare.load() if d.public}
    for name, module in _OPS.items():
        if name not in ops:
            ops[name] = getattr(importlib.import_module(f"gemsops.ops.{module}"), name)
    return ops


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
