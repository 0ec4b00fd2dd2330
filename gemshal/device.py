"""The current device: lazy resolution, the Device record, and device_guard.

Nothing here runs at import. The first call that needs the vendor resolves it once
per process (thread-safe) and caches it; :func:`select` replaces that choice.
When the ``cpu`` vendor is chosen, Triton's interpreter is switched on before any
kernel module is imported, so kernels run on CPU tensors with no setting by hand.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import attrs
import torch

from gemshal import _record
from gemshal._triton import allocator_state, use_interpreter
from gemshal.detect import Detection, TraceStep, detect
from gemshal.errors import ConfigError, DeviceGuardError, DeviceNotFoundError
from gemshal.probe import LiveFacts
from gemshal.registry import vendor
from gemshal.vendor import Arch, VendorInfo, unknown_features

__all__ = [
    "Device",
    "DeviceGuard",
    "current_device",
    "current_vendor",
    "detection_trace",
    "device_guard",
    "device_module",
    "get_device",
    "installed",
    "select",
]


@attrs.frozen
class Device:
    """One device as gemsops sees it.

    Attributes:
        vendor: The vendor record.
        torch_device: The torch device (``cuda:0``, ``cpu``).
        index: The device index (0 on the CPU).
        count: How many devices of this vendor the process sees.
        name: The device's marketing name.
        arch: The architecture (compute capability on NVIDIA, gfx name on AMD...).
        warp_size: Threads per warp or wavefront.
        multiprocessor_count: Streaming multiprocessors / compute units (CPU cores on the CPU).
        total_memory: Device memory in bytes.
        interpreter: True when kernels run on the Triton interpreter.
        features: Hardware features of this device (names from
            :data:`gemshal.vendor.FEATURES`): what its vendor declares for its
            architecture, less those ``GEMS_DISABLE_FEATURES`` turns off.
    """

    vendor: VendorInfo
    torch_device: torch.device
    index: int
    count: int
    name: str
    arch: Arch
    warp_size: int
    multiprocessor_count: int
    total_memory: int
    interpreter: bool
    features: frozenset[str] = frozenset()

    def has(self, feature: str) -> bool:
        """Whether this device has ``feature`` (kernels choose their paths with it).

        Raises:
            ValueError: ``feature`` is not one of :data:`gemshal.vendor.FEATURES` (the
                message names the valid ones).
        """
        if feature in self.features:
            return True
        problem = unknown_features((feature,))
        if problem:
            raise ValueError(problem)
        return False

    def as_dict(self) -> dict[str, object]:
        """The record as plain JSON-ready values."""
        return {
            "vendor": self.vendor.name,
            "torch_device": str(self.torch_device),
            "index": self.index,
            "count": self.count,
            "name": self.name,
            "arch": self.arch.name,
            "arch_tag": self.arch.tag,
            "capability": list(self.arch.capability) if self.arch.capability else None,
            "warp_size": self.warp_size,
            "multiprocessor_count": self.multiprocessor_count,
            "total_memory": self.total_memory,
            "interpreter": self.interpreter,
            "features": sorted(self.features),
        }


class _State:
    """Everything resolution decides, swapped in one assignment."""

    __slots__ = ("count", "detection", "device_type", "devices", "indices", "module")

    def __init__(self, detection: Detection, module: Any, count: int) -> None:
        self.detection = detection
        self.module = module
        self.device_type = detection.vendor.device_type
        self.count = count
        self.devices: dict[int, Device] = {}
        self.indices: dict[object, int | None] = {}


_LOCK = threading.RLock()
_STATE: _State | None = None
_EXPLICIT: str | None = None


def _chosen_by(detection: Detection) -> str:
    """How the vendor was chosen, for error messages (``GEMS_VENDOR=nvidia``...)."""
    if detection.stage == "env" and detection.trace:
        return detection.trace[-1].detail
    if detection.stage == "explicit":
        return "chosen with gemshal.select()"
    return f"detected at the {detection.stage} stage"


def _load_module(detection: Detection) -> Any:
    info = detection.vendor
    if info.torch_module:
        try:
            importlib.import_module(info.torch_module)
        except Exception as exc:
            raise DeviceNotFoundError(
                f"vendor {info.name!r} ({_chosen_by(detection)}) needs the torch extension "
                f"{info.torch_module!r}, which failed to import: {type(exc).__name__}: {exc}"
            ) from exc
    if info.is_cpu:
        return torch.cpu
    module = getattr(torch, info.device_module_name or info.device_type, None)
    if module is None:
        raise DeviceNotFoundError(
            f"vendor {info.name!r} ({_chosen_by(detection)}) expects "
            f"torch.{info.device_module_name}, which this torch ({torch.__version__}) "
            "does not have"
        )
    return module


def _device_count(detection: Detection, module: Any) -> int:
    info = detection.vendor
    where = f"torch.{info.device_module_name or info.device_type}"
    try:
        count = int(module.device_count())
    except Exception as exc:
        raise DeviceNotFoundError(
            f"vendor {info.name!r} ({_chosen_by(detection)}): {where}.device_count() failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if count < 1:
        raise DeviceNotFoundError(
            f"vendor {info.name!r} ({_chosen_by(detection)}) has no device on this machine: "
            f"{where}.device_count() is {count}. Choose another vendor, or 'cpu' for the "
            "Triton interpreter"
        )
    return count


def _install(detection: Detection, module: Any | None = None) -> _State:
    """Make ``detection`` current.

    Raises:
        DeviceNotFoundError: the vendor's torch extension does not import, or the
            vendor has no device here; nothing changes then.
    """
    global _STATE
    info = detection.vendor
    mod = _load_module(detection) if module is None else module
    count = 1 if info.is_cpu else _device_count(detection, mod)
    if info.is_cpu:
        use_interpreter()
        if detection.fell_back:
            warnings.warn(
                "gemshal: no accelerator found; gemsops kernels run on the CPU through the "
                "Triton interpreter (slow). Set GEMS_VENDOR to choose a vendor.",
                RuntimeWarning,
                stacklevel=4,
            )
    state = _State(detection, mod, count)
    _STATE = state
    return state


def _state() -> _State:
    state = _STATE
    if state is not None:
        return state
    with _LOCK:
        if _STATE is not None:
            return _STATE
        found = detect(facts=LiveFacts(), env=os.environ, explicit=_EXPLICIT)
        return _install(found)


def select(name: str) -> VendorInfo:
    """Choose the vendor explicitly, overriding ``GEMS_VENDOR`` and the probes.

    Call it before gemsops kernels are first used: kernels already compiled for one
    vendor are not rebuilt.

    Raises:
        UnknownVendorError: ``name`` is not registered (the message lists the known names).
        PluginLoadError: ``name`` is a plugin that failed to load.
        DeviceNotFoundError: the vendor's torch extension or devices are missing here.
            The previous choice stays in force after any of these.
    """
    global _EXPLICIT
    with _LOCK:
        info = vendor(name)
        _install(detect(facts=LiveFacts(), env=os.environ, explicit=name))
        _EXPLICIT = name
    return info


def current_vendor() -> VendorInfo:
    """The vendor of this process, resolving it on first use."""
    return _state().detection.vendor


def detection_trace() -> tuple[TraceStep, ...]:
    """Every step detection took, in order, with what it saw and why."""
    return _state().detection.trace


def detection() -> Detection:
    """The full detection outcome: vendor, deciding stage and trace."""
    return _state().detection


def device_module() -> Any:
    """The vendor's torch device module (``torch.cuda``, ``torch.npu``, ``torch.cpu``...)."""
    return _state().module


def disabled_features() -> frozenset[str]:
    """The features ``GEMS_DISABLE_FEATURES`` (comma-separated names) turns off on every
    device, e.g. ``tensor_descriptors`` to run the portable matmul on a Hopper GPU.

    Raises:
        ConfigError: a name is not a known feature (the message lists the valid ones).
    """
    raw = os.environ.get("GEMS_DISABLE_FEATURES", "")
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    problem = unknown_features(names)
    if problem:
        raise ConfigError(f"GEMS_DISABLE_FEATURES: {problem}")
    return names


def _describe(state: _State, index: int) -> Device:
    info = state.detection.vendor
    if info.is_cpu:
        import platform

        machine = Arch(name=platform.machine() or "cpu")
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        return Device(
            vendor=info,
            torch_device=torch.device("cpu"),
            index=0,
            count=1,
            name=platform.processor() or platform.machine() or "cpu",
            arch=machine,
            warp_size=1,
            multiprocessor_count=os.cpu_count() or 1,
            total_memory=int(pages) * int(os.sysconf("SC_PAGE_SIZE")) if pages else 0,
            interpreter=True,
            features=info.features_of(machine) - disabled_features(),
        )
    props = state.module.get_device_properties(index)
    major, minor = getattr(props, "major", None), getattr(props, "minor", None)
    # torch fills gcnArchName on CUDA builds too (with the marketing name), so only a
    # gfx name counts as an AMD-style architecture; otherwise the capability decides.
    gcn = str(getattr(props, "gcnArchName", "") or "")
    if gcn.startswith("gfx"):
        arch = Arch(name=gcn)
    elif isinstance(major, int) and isinstance(minor, int) and major > 0:
        arch = Arch.from_capability(major, minor)
    else:
        arch = Arch(name=str(getattr(props, "name", info.name)))
    return Device(
        vendor=info,
        torch_device=torch.device(info.device_type, index),
        index=index,
        count=state.count,
        name=str(getattr(props, "name", info.display_name)),
        arch=arch,
        warp_size=int(getattr(props, "warp_size", 0) or info.warp_size),
        multiprocessor_count=int(getattr(props, "multi_processor_count", 0) or 0),
        total_memory=int(getattr(props, "total_memory", 0) or 0),
        interpreter=False,
        features=info.features_of(arch) - disabled_features(),
    )


def get_device(index: int) -> Device:
    """The record of device ``index`` of the current vendor.

    Raises:
        DeviceNotFoundError: no such index (the message gives the valid range).
    """
    state = _state()
    cached = state.devices.get(index)
    if cached is not None:
        return cached
    if not 0 <= index < state.count:
        raise DeviceNotFoundError(
            f"device index {index} does not exist; {state.detection.vendor.name} has "
            f"{state.count} device(s): 0..{state.count - 1}"
        )
    # Threads that race here may each describe the device; setdefault keeps the first
    # record, so every caller gets the same one (records are compared by identity).
    return state.devices.setdefault(index, _describe(state, index))


def current_device() -> Device:
    """The current device of this process's vendor (resolving the vendor on first use)."""
    state = _state()
    index = 0 if state.detection.vendor.is_cpu else int(state.module.current_device())
    return get_device(index)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # Triton's allocator protocol: ``size`` bytes on the device the launch runs on (the
    # current one); torch's caching allocator hands out 512-byte aligned blocks.
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device=current_device().torch_device)


_ALLOCATOR: Any = None  # Triton's allocator context variable, found on first use


def ensure_scratch_allocator() -> None:
    """Let Triton allocate the global scratch memory some kernels need at launch.

    Kernels that build tensor descriptors on the device (``tl.make_tensor_descriptor``)
    need a few hundred bytes of scratch per program, which Triton asks an allocator for.
    This installs one that takes it from torch's caching allocator on the current device,
    unless an allocator is already installed in this context (a user's is kept). Cheap
    enough to call before every such launch, which covers new threads too.
    """
    global _ALLOCATOR
    if _record.RECORDERS:
        recorder = _record.RECORDERS.get(threading.get_ident())
        if recorder is not None:
            recorder.scratch = True
    var = _ALLOCATOR
    if var is None:
        var = _ALLOCATOR = allocator_state()
    current, null = var
    if current is not None and null is not None and not isinstance(current.get(), null):
        return
    import triton

    triton.set_allocator(_scratch)


class DeviceGuard:
    """Makes a device current for a ``with`` block and restores the previous one after.

    Construct it with :func:`device_guard`. Re-entrant use of one instance is not
    supported; nest separate guards instead.
    """

    __slots__ = ("_index", "_module", "_previous")

    def __init__(self, index: int | None, module: Any) -> None:
        self._index = index
        self._module = module
        self._previous: int | None = None

    def __enter__(self) -> DeviceGuard:
        index = self._index
        if index is None:
            return self
        previous = self._module.current_device()
        if previous != index:
            self._module.set_device(index)
            self._previous = previous
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        previous = self._previous
        if previous is not None:
            self._previous = None
            self._module.set_device(previous)


def _index_of(device: object, state: _State) -> int | None:
    kind = type(device)
    if kind is torch.device:
        dev: torch.device = device  # type: ignore[assignment]
    elif kind is int:
        index: int = device  # type: ignore[assignment]
        if index < 0:
            raise DeviceGuardError(f"device index must be >= 0; got {index}")
        if index >= state.count:  # the CPU vendor's one device included
            raise DeviceGuardError(
                f"device index {index} does not exist; valid indices are 0..{state.count - 1} "
                f"({state.detection.vendor.name} has {state.count} device(s))"
            )
        dev = torch.device(state.device_type, index) if state.device_type != "cpu" else _CPU
    elif isinstance(device, str):
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise DeviceGuardError(f"not a device: {device!r} ({exc})") from None
    elif isinstance(device, torch.Tensor):
        dev = device.device
    elif isinstance(device, torch.device):
        dev = device
    else:
        raise DeviceGuardError(
            f"device_guard takes a torch.device, a tensor, an int or a str; "
            f"got {type(device).__name__}: {device!r}"
        )
    if dev.type == "cpu":
        return None
    if dev.type != state.device_type:
        raise DeviceGuardError(
            f"device {str(dev)!r} is not a {state.detection.vendor.name} device; "
            f"this process runs on {state.device_type!r} (and 'cpu')"
        )
    if dev.index is not None and dev.index >= state.count:
        raise DeviceGuardError(
            f"device {str(dev)!r} does not exist; valid indices are 0..{state.count - 1}"
        )
    return dev.index


def _cached_index(device: object, state: _State) -> int | None:
    if isinstance(device, torch.Tensor):
        device = device.device
    kind = type(device)
    if kind is torch.device or kind is str or kind is int:
        # Launch paths ask about the same few devices over and over: remember each answer.
        try:
            return state.indices[device]
        except KeyError:
            index = state.indices[device] = _index_of(device, state)
            return index
    return _index_of(device, state)


_CPU = torch.device("cpu")
_NO_GUARD = DeviceGuard(None, None)  # shared: entering and leaving it does nothing


def device_guard(device: torch.device | torch.Tensor | int | str) -> DeviceGuard:
    """A context manager that makes ``device`` current and restores the previous device.

    Accepts a ``torch.device``, a tensor (its device), an index, or a string such as
    ``"cuda:1"``. It restores on exceptions too, nests, and costs next to nothing when
    the device is the CPU, the process's only device, or already current.

    Raises:
        DeviceGuardError: the value is not a device of this vendor, or its index is out
            of range (the message names the value and the valid ones).
    """
    state = _STATE or _state()
    index = _cached_index(device, state)
    if index is None or state.count == 1:
        # The CPU, or the only device there is (always current): nothing to switch.
        return _NO_GUARD
    return DeviceGuard(index, state.module)


def device_of(device: torch.device | torch.Tensor | int | str) -> Device:
    """The record of the device a tensor lives on (or of a device, an index, a string).

    Launch paths size their grids with it (``device_of(x).multiprocessor_count``), so a
    tensor on ``cuda:1`` is planned for ``cuda:1`` whichever device is current. A CPU
    tensor, and an index-less device such as ``"cuda"``, give the current device.

    Raises:
        DeviceGuardError: the value is not a device of this vendor, or its index is out
            of range (as :func:`device_guard`).
    """
    state = _STATE or _state()
    index = _cached_index(device, state)
    if index is None:
        return current_device()
    return state.devices.get(index) or get_device(index)


@contextlib.contextmanager
def installed(detection: Detection, module: Any | None = None) -> Iterator[None]:
    """Make ``detection`` current for the ``with`` block, then restore the resolution and
    explicit choice there were before (for test harnesses such as
    :func:`gemshal.testing.fake_vendor`).

    Raises:
        DeviceNotFoundError: as :func:`select` does; nothing changes then.
    """
    global _STATE, _EXPLICIT
    saved = _STATE, _EXPLICIT
    try:
        _install(detection, module)
        yield
    finally:
        _STATE, _EXPLICIT = saved


def _reset() -> None:
    """Forget the resolution and any explicit choice (tests only)."""
    global _STATE, _EXPLICIT
    with _LOCK:
        _STATE = None
        _EXPLICIT = None
