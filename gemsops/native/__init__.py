"""gemsops' native replay: served calls of a seen structure issued from C++.

With ``GEMS_NATIVE=1``, :func:`gemsops.enable` registers, for each overload whose host
code decides from its arguments' structure alone (the pointwise ops, and the ops the
replay memo takes: :func:`gemsops.ops.replay.replayable`), a C++ kernel
(``native.cpp``, built on first use by :mod:`gemsops.native.build`) at the backend key
in place of the Python kernel. The C++ kernel keys each call; a key it holds a recipe
for allocates the outputs and launches the recorded kernels through the CUDA driver
on torch's current stream, with no Python frame. A new key runs the Python kernel
(registered at PrivateUse3) under :func:`gemshal.kernel.recording`, and when one of the
host memos took the call and every launch maps onto the call's own tensors, hands the
recipe back (:mod:`gemsops.native.recipe`). Calls it cannot key (a 0-dim CPU tensor,
a generator...) run the Python kernel (at PrivateUse2) as before.

Everything that decides stays in Python: tuning, compiling, the self-check of a launch,
every fallback to torch. A recipe is what the Python path did for that structure.
"""

from __future__ import annotations

import os
import struct
import threading
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = [
    "ENV",
    "available",
    "building",
    "clear",
    "eligible",
    "load",
    "recorder",
    "release",
    "serve",
    "stats",
    "wanted",
]

ENV = "GEMS_NATIVE"
_VALUES = ("auto", "0", "1")

_LOCK = threading.Lock()
_LOADED: list[bool] = []  # [True] loaded, [False] failed (see _WHY)
_WHY: list[str] = []
_HANDLES: dict[int, str] = {}  # handle -> overload, while registered


def setting() -> str:
    """``GEMS_NATIVE``: ``auto`` (unset), ``1`` or ``0``.

    Raises:
        ValueError: any other value, naming the valid ones.
    """
    value = os.environ.get(ENV, "").strip() or "auto"
    if value not in _VALUES:
        raise ValueError(f"{ENV}={value!r}: expected auto or unset (on where the vendor "
                         "names a native launch), 1 (on) or 0 (off)")
    return value


def wanted(vendor: Any = None) -> bool:
    """Whether the native replay serves this process: ``GEMS_NATIVE=1``, or unset /
    ``auto`` on a vendor whose record names a native launch
    (``VendorInfo.native_launch``; the library knows the CUDA driver's), with compiled
    kernels."""
    value = setting()
    if value != "auto":
        return value == "1"
    if vendor is None:
        import gemshal

        vendor = gemshal.current_vendor()
    return vendor.native_launch is not None and not vendor.is_cpu


_BUILDER: list[threading.Thread] = []  # the background build, once started
_ON_READY: list[Callable[[], None]] = []


def load(*, background: bool = False, on_ready: Callable[[], None] | None = None) -> bool:
    """Build (first use) and load the library; False, with a warning naming the reason,
    when it cannot be: the Python path then serves every call.

    With ``background``, a library not built yet is built on a thread (the compiler is a
    subprocess: 8-10 s once per torch install, beside the first step's Triton compiles)
    and this returns False at once; ``on_ready`` runs on that thread once the library is
    loaded (gemsops' registration then swaps its native kernels in). A progress line says
    so where :mod:`gemshal.kernel`'s progress lines are shown (``GEMS_PROGRESS``)."""
    if _LOADED:
        return _LOADED[0]
    if background:
        from gemsops.native import build

        path = build.library_path()
        if path is not None and not path.exists():
            with _LOCK:
                if on_ready is not None and on_ready not in _ON_READY:
                    _ON_READY.append(on_ready)
                if not _BUILDER:
                    thread = threading.Thread(target=_build_behind, name="gemsops-native-build",
                                              daemon=True)
                    _BUILDER.append(thread)
                    thread.start()
            return False
    return _load(quiet=False)


def building() -> bool:
    """Whether a background build (``load(background=True)``) is still running."""
    return bool(_BUILDER) and _BUILDER[0].is_alive()


def _build_behind() -> None:
    from gemshal.kernel.decorator import _progress_on

    try:
        quiet = not _progress_on()
    except ValueError:
        quiet = True
    if _load(quiet=quiet):
        with _LOCK:
            ready = list(_ON_READY)
            _ON_READY.clear()
        for callback in ready:
            callback()


def _load(*, quiet: bool) -> bool:
    if _LOADED:
        return _LOADED[0]
    with _LOCK:
        if _LOADED:
            return _LOADED[0]
        from gemsops.native import build, recipe

        try:
            path = build.build(quiet=quiet)
            torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
            ops = torch.ops.gemsops_native
            for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                          torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                          torch.bool, torch.complex64, torch.complex128):
                recipe.DTYPE_CODES[dtype] = int(ops.dtype_code(dtype))
            for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
                extra = getattr(torch, name, None)
                if isinstance(extra, torch.dtype):
                    recipe.DTYPE_CODES[extra] = int(ops.dtype_code(extra))
        except (build.BuildError, OSError, RuntimeError) as error:
            _WHY.append(str(error))
            _LOADED.append(False)
            warnings.warn(f"gemsops: the native replay is off: {error}", RuntimeWarning,
                          stacklevel=3)
            return False
        from gemshal import tune

        tune.ON_CHANGE.append(clear)
        _LOADED.append(True)
        return True


def available() -> bool:
    """Whether the library is loaded."""
    return bool(_LOADED and _LOADED[0])


STRUCTURAL: dict[str, bool] = {
    "zero_.default": False,
    "fill_.Scalar": False,
    "embedding.default": True,
}
"""Overloads outside the pointwise modules and the replay memo whose host code decides
from structure alone (value: only for tensors off the CPU, whose indices it does not
read), eligible with no memo's word."""


class Plan(NamedTuple):
    """How the native kernel of one eligible overload records its misses."""

    workspaces: bool
    """The op vouches that its launches write every tensor it made for the call."""
    witnessed: bool
    """A recipe needs the replay memo's word (its ``when`` excludes some calls)."""
    device_only: bool
    """Calls with a CPU tensor are refused (the host code reads CPU indices)."""


def plan(overload: str, source: str) -> Plan | None:
    """How ``overload`` (implemented by ``source``, ``module.function``) is replayed
    natively, or None when it is not: eligible are the pointwise ops, the ops the replay
    memo takes and :data:`STRUCTURAL`, never an ``out=`` overload (a replay would not
    resize ``out``)."""
    from gemsops.ops import replay

    over = overload.partition(".")[2]
    if over == "out" or over.endswith("_out"):
        return None
    if overload in STRUCTURAL:
        return Plan(False, False, STRUCTURAL[overload])
    base = source.split(" ")[0]
    if base in replay.VOUCHED:
        return Plan(replay.VOUCHED[base], True, False)
    if base.startswith("gemsops.ops.pointwise."):
        return Plan(False, False, False)
    return None


def eligible(overload: str, source: str) -> bool:
    """Whether ``overload`` may be replayed natively (:func:`plan`)."""
    return plan(overload, source) is not None


def serve(name: str, key: str, overload: str) -> int:
    """Register the native kernel for ``aten::name`` at dispatch key ``key``; its handle."""
    handle = int(torch.ops.gemsops_native.serve(name, key))
    _HANDLES[handle] = overload
    return handle


_RELEASED_HITS: dict[str, int] = {}
"""Hits of native kernels already deregistered, per overload (for :func:`hit_counts`)."""


def release(handle: int) -> None:
    """Deregister one native kernel (its recipes go with it). While other threads run,
    the kernel object is kept (a call another thread looked up just before its
    deregistration stays valid), as the registry keeps its Python kernels."""
    overload = _HANDLES.pop(handle, None)
    if overload is not None:
        values = list(torch.ops.gemsops_native.stats(handle))
        if values:
            _RELEASED_HITS[overload] = _RELEASED_HITS.get(overload, 0) + int(values[0])
    torch.ops.gemsops_native.release(handle, threading.active_count() > 1)


def hit_counts() -> dict[str, int]:
    """Calls served natively so far in this process, per overload (registered or not)."""
    out = dict(_RELEASED_HITS)
    if available():
        for handle, overload in list(_HANDLES.items()):
            values = list(torch.ops.gemsops_native.stats(handle))
            if values:
                out[overload] = out.get(overload, 0) + int(values[0])
    return out


def clear() -> None:
    """Forget every recipe (the tuning changed: the launches they hold may be stale)."""
    if available():
        torch.ops.gemsops_native.clear()


_STAT_NAMES = ("hits", "misses", "unkeyed", "refused", "offered", "nested", "recipes")


def stats() -> dict[str, dict[str, int]]:
    """Per registered overload: native hits, misses (recorded by Python), calls it could
    not key, calls of a refused key, recipes offered, calls made from inside a kernel,
    recipes held."""
    out = {}
    for handle, overload in list(_HANDLES.items()):
        values = list(torch.ops.gemsops_native.stats(handle))
        if values:
            out[overload] = dict(zip(_STAT_NAMES, values, strict=True))
    return out


def recorder(overload: str, kernel: Callable[..., Any], schema: Any,
             how: Plan) -> Callable[..., Any]:
    """The Python kernel of a native kernel's keyed miss: ``kernel`` under a recording,
    then the recipe offered (or a refusal for good). The C++ key holds the global state
    the replayable ops read through ``extra`` (the float32 matmul precision)."""
    from gemshal.kernel import recording
    from gemshal.kernel.launcher import stubbed
    from gemsops import call_record
    from gemsops.native import recipe
    from gemsops.ops import witness

    offer = torch.ops.gemsops_native.offer
    set_mode = torch.ops.gemsops_native.set_mode
    forced = setting() == "1"
    workspaces, witnessed, device_only = how

    inside = call_record.INSIDE

    def record(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        before = witness.COUNT[0]
        inside.served = False
        with recording() as rec:
            out = kernel(keyset, *args, **kwargs)
        blob: list[int] | None
        if not inside.served or (not forced and stubbed()):
            # Handed back to torch (maybe while its kernel compiles): next time. Stubbed
            # launches (the host bench) keep to the Python path unless GEMS_NATIVE=1.
            blob = None
        elif device_only and any(t.device.type == "cpu"
                                    for t in recipe.flat_inputs(schema, args, kwargs)):
            blob = recipe.REFUSED  # its host code checks CPU indices by value
        elif witnessed and witness.COUNT[0] == before:
            blob = recipe.REFUSED  # the replay memo did not take it (``when`` said no)
        else:
            try:
                blob = recipe.build(schema, args, kwargs, out, rec.launches, workspaces)
            except (AttributeError, TypeError, ValueError, RuntimeError, struct.error):
                blob = recipe.REFUSED
        if blob is not None:
            # Stubbed launches (the host bench, CPU tests) log instead of launching;
            # entering or leaving them clears every recipe (the tuning generation).
            set_mode(1 if stubbed() else 0)
            offer(blob)
        return out

    record.__name__ = f"gemsops_native_record_{overload.replace('.', '_')}"
    return record
