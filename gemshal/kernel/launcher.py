"""The direct launcher: specialize a kernel once per cheap key, then launch it directly.

``JITFunction.run`` spends most of a tiny op's host time on work whose answer does not
change between calls: binding arguments, specializing each one, building a cache-key
string, checking globals, building launch metadata and calling two hook chains. A
:class:`Launcher` does that work once per *cheap key* and keeps the compiled kernel,
its launcher, function handle and packed metadata. Later calls with the same key go
straight to the compiled launcher.

The cheap key holds, for each argument, exactly what Triton specializes on (or
more): a tensor's dtype and whether its address is 16-byte aligned; an integer's
width class, whether it is 1 and whether it is divisible by 16 (only the width class
for ``do_not_specialize`` arguments); the value of every constexpr; the keyword
arguments with their values; and the current device. A key finer than Triton's costs
an extra compile at most; a coarser one would launch the wrong kernel, so each entry
is checked against Triton before it is trusted (below).

The current stream is fetched on every call and never cached, so CUDA graph capture
and ``torch.cuda.stream(...)`` blocks keep working.

This module is the only place that knows Triton's private launch ABI. The direct path
is taken only when all of these hold, and ``JITFunction.run`` serves the call otherwise:

* ``GEMS_LAUNCH`` is unset or ``direct`` (``jit`` turns the direct path off);
* the installed Triton's minor version is one this path was checked on
  (:data:`CHECKED_TRITON`), and its private names are where this module expects them;
* kernels are compiled, not run by the Triton interpreter;
* no launch hook is installed (a profiler such as proton installs one) and Triton's
  runtime debug mode is off;
* the call passes no argument the cheap key cannot describe (tuples, descriptors,
  non-constexpr parameters given by keyword);
* the entry passed its self-check. When an entry is made, the arguments and grid it
  would launch with are compared with those ``JITFunction.run`` binds; at its first
  reuse (a second call with the same key, so other addresses and sizes), Triton's own
  dispatch is run once more and must pick the very same compiled kernel (the same
  object, or one with the same compile hash: a background compile of the same
  specialization may have replaced the object in Triton's cache). A failed
  check turns the direct path off for that kernel, with the reason kept in
  :func:`stats`.

:func:`launch_path` says which path is active and why; ``gemshal info`` prints it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from gemshal import _triton
from gemshal._triton import CHECKED_TRITON
from gemshal.errors import ConfigError

__all__ = [
    "CHECKED_TRITON",
    "LAUNCH_ENV",
    "LaunchPath",
    "Launcher",
    "ParamSpec",
    "Ready",
    "launch_path",
    "launcher_for",
    "reset",
    "stats",
    "stub_launches",
    "stubbed",
]

LAUNCH_ENV = "GEMS_LAUNCH"

# Parameter kinds.
CONST, SPEC, NOSPEC = 0, 1, 2

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_U64_MIN = 2**63


@attrs.frozen
class LaunchPath:
    """Which launch path kernels take in this process, and why.

    Attributes:
        direct: True when compiled kernels are launched directly after their first call.
        reason: One line saying why (the Triton version, the interpreter, a setting...).
    """

    direct: bool
    reason: str


@attrs.frozen
class ParamSpec:
    """What the cheap key needs to know of one kernel parameter.

    Attributes:
        name: The parameter's name.
        kind: ``CONST`` (a ``tl.constexpr``), ``SPEC`` (specialized on its value's
            alignment / divisibility) or ``NOSPEC`` (``do_not_specialize``).
        default: The default value, or ``NO_DEFAULT``.
    """

    name: str
    kind: int
    default: Any


NO_DEFAULT: Any = object()


def _env_choice() -> str:
    raw = os.environ.get(LAUNCH_ENV, "").strip()
    if raw in ("", "direct"):
        return "direct"
    if raw == "jit":
        return "jit"
    raise ConfigError(
        f"{LAUNCH_ENV} must be 'direct' (launch compiled kernels directly, the default) or "
        f"'jit' (always through JITFunction.run); got {raw!r}"
    )


_LOCK = threading.Lock()
_PATH: LaunchPath | None = None
_TRITON: _triton.Runtime | None = None


def decide_path(*, choice: str, interpreter: bool, version: str) -> LaunchPath:
    """The launch path for a setting, an interpreter flag and a Triton version (pure)."""
    if choice == "jit":
        return LaunchPath(False, f"{LAUNCH_ENV}=jit")
    if interpreter:
        return LaunchPath(False, "kernels run on the Triton interpreter")
    if _triton.minor_version(version) not in CHECKED_TRITON:
        return LaunchPath(
            False,
            f"triton {version}: the direct path was checked on triton "
            f"{', '.join(CHECKED_TRITON)} only",
        )
    return LaunchPath(
        True,
        f"triton {version}; each specialization is checked once against JITFunction.run",
    )


def launch_path() -> LaunchPath:
    """Which launch path this process uses, and why (resolved once).

    Raises:
        ConfigError: ``GEMS_LAUNCH`` holds something other than ``direct`` or ``jit``.
    """
    global _PATH, _TRITON
    path = _PATH
    if path is not None:
        return path
    with _LOCK:
        if _PATH is not None:
            return _PATH
        choice = _env_choice()
        import triton

        from gemshal.device import current_device

        interpreter = current_device().interpreter or bool(triton.knobs.runtime.interpret)
        path = decide_path(choice=choice, interpreter=interpreter, version=triton.__version__)
        if path.direct:
            try:
                _TRITON = _triton.Runtime()
            except (ImportError, AttributeError) as exc:
                path = LaunchPath(
                    False,
                    f"triton {triton.__version__}: a private name the direct path needs is "
                    f"missing ({exc})",
                )
        _PATH = path
        return path


def reset() -> None:
    """Forget the decided path and every launcher's entries (tests, or after a setting change)."""
    global _PATH, _TRITON
    with _LOCK:
        _PATH = None
        _TRITON = None
        for launcher in list(_LAUNCHERS.values()):
            launcher.clear()


# --- the cheap key -------------------------------------------------------------------


def specs_of(jit: Any) -> tuple[ParamSpec, ...]:
    """A Triton ``JITFunction``'s parameters as :class:`ParamSpec` records."""
    out = []
    for p in jit.params:
        kind = CONST if p.is_constexpr else (NOSPEC if p.do_not_specialize else SPEC)
        default = p.default if p.has_default else NO_DEFAULT
        out.append(ParamSpec(p.name, kind, default))
    return tuple(out)


# --- entries ---------------------------------------------------------------------------


class _Entry:
    """One specialization: the compiled kernel and what a direct launch passes it."""

    __slots__ = ("call", "consts", "function", "kernel", "pre", "tail", "verified")

    def __init__(self, kernel: Any, tail: tuple[Any, ...], consts: dict[str, Any]) -> None:
        self.kernel = kernel
        run = kernel.run  # the launcher object (loads the binary on first access)
        self.function = kernel.function
        self.tail = tail
        self.consts = consts
        self.verified = False
        # Launch metadata and both hooks are None: no hook is installed (checked per call).
        self.call: Callable[..., Any] = run
        self.pre: tuple[Any, ...] = (kernel.packed_metadata, None, None, None)
        # The generated C launch function, called without the Python wrapper when the
        # kernel needs no scratch memory (all the wrapper adds is scratch allocation).
        launch = getattr(run, "launch", None)
        if (
            callable(launch)
            and type(run).__name__ == "CudaLauncher"
            and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0
        ):
            self.call = launch
            self.pre = (run.launch_cooperative_grid, run.launch_pdl, None, None, *self.pre)


_KEYWORD_SLOTS = 256


class Keywords:
    """A call's keyword arguments, frozen, with their hash computed once.

    A launcher remembers the frozen form of each keyword dict it is given, by identity,
    while it holds the dict: callers pass a dict once and do not change it afterwards.
    """

    __slots__ = ("_hash", "items")

    def __init__(self, items: tuple[tuple[str, Any], ...]) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Keywords) and self.items == other.items)

    def __repr__(self) -> str:
        return f"Keywords({dict(self.items)!r})"


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return type(a) is type(b) and bool(a == b)


def _grid3(grid: Sequence[int]) -> tuple[int, int, int]:
    n = len(grid)
    return grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1


# --- the launcher ------------------------------------------------------------------------


class Launcher:
    """Direct launches of one ``@triton.jit`` function, by cheap key.

    Made by :func:`launcher_for`; tests build one over fakes through ``specs``,
    ``slow`` (the ``JITFunction.run`` stand-in), ``bind`` (Triton's argument binder)
    and ``triton`` (device, stream and hook queries).
    """

    def __init__(
        self,
        jit: Any,
        *,
        specs: Sequence[ParamSpec] | None = None,
        slow: Callable[..., Any] | None = None,
        bind: Callable[[int, tuple[Any, ...], dict[str, Any]], tuple[Any, ...] | None]
        | None = None,
        triton: Any = None,
    ) -> None:
        self.jit = jit
        self.specs = tuple(specs) if specs is not None else specs_of(jit)
        self.names = tuple(s.name for s in self.specs)
        self.kinds = tuple(s.kind for s in self.specs)
        self.index = {s.name: i for i, s in enumerate(self.specs)}
        self.dynamic = frozenset(s.name for s in self.specs if s.kind != CONST)
        self._slow = slow if slow is not None else jit.run
        self._bind = bind if bind is not None else self._triton_bind
        self._triton = triton
        self.entries: dict[tuple[Any, ...], _Entry] = {}
        self.disabled: str | None = None
        self.counts = {"direct": 0, "jit": 0, "compiled": 0}
        self._keywords: dict[int, tuple[Mapping[str, Any], Keywords]] = {}
        # Counts the times entries were dropped: a Ready launch made before holds an
        # older epoch and stands down.
        self.epoch = 0

    def clear(self) -> None:
        """Drop every entry and re-enable the direct path."""
        self.entries.clear()
        self._keywords.clear()
        self.disabled = None
        self.epoch += 1

    def _tr(self) -> Any:
        tr = self._triton
        if tr is None:
            tr = self._triton = _TRITON
        return tr

    def key(
        self,
        device: int,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: Any = None,
    ) -> tuple[Any, ...] | None:
        """The cheap key of one call, or None when the call needs JITFunction.run.

        ``extra`` is added to the key as it is: what a caller's own choices depend on
        (an autotuner's size bucket), so one lookup serves both.
        """
        kinds = self.kinds
        if len(args) > len(kinds):
            return None
        parts: list[Any] = [device, extra]
        append = parts.append
        tensor = torch.Tensor
        # This loop runs on every launch: plain type tests, no helper calls.
        for value, kind in zip(args, kinds, strict=False):
            if kind == CONST:
                append(value)
                continue
            t = type(value)
            if t is tensor or (t is not int and isinstance(value, tensor)):
                append(value.dtype)
                append(not value.data_ptr() & 15)
            elif t is int:
                # Bit 0: the value is 1; bit 1: divisible by 16; bits 2-3: the width
                # class (i32, u64, else i64). do_not_specialize keeps only the width.
                width = 4 if _I32_MIN <= value <= _I32_MAX else (8 if value >= _U64_MIN else 0)
                if kind == NOSPEC:
                    append(width)
                else:
                    append(width | (value == 1) | ((value & 15 == 0) << 1))
            elif t is float or t is bool or value is None:
                append(t)
            else:
                return None
        if kwargs:
            # Keyword sets are mostly the same few dicts, reused by the ops' cached
            # plans: their frozen form (hash computed once) is remembered by identity.
            seen = self._keywords.get(id(kwargs))
            if seen is not None and seen[0] is kwargs:
                append(seen[1])
            else:
                if not self.dynamic.isdisjoint(kwargs):
                    return None  # a runtime argument by keyword: let Triton bind it
                frozen = Keywords(tuple(kwargs.items()))
                if len(self._keywords) >= _KEYWORD_SLOTS:
                    self._keywords.clear()
                self._keywords[id(kwargs)] = (kwargs, frozen)
                append(frozen)
        append(len(args))
        return tuple(parts)

    def _tail(
        self, nargs: int, kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # Every parameter after the positional ones comes from a constexpr keyword or a
        # default: fixed for the key. consts: what a grid function may read.
        tail = []
        consts: dict[str, Any] = {}
        for spec in self.specs[nargs:]:
            value = kwargs.get(spec.name, spec.default)
            if value is NO_DEFAULT:
                raise TypeError(f"kernel argument {spec.name!r} was not passed")
            tail.append(value)
            consts[spec.name] = value
        return tuple(tail), consts

    def _full_meta(self, args: tuple[Any, ...], entry: _Entry) -> dict[str, Any]:
        meta = dict(zip(self.names, args, strict=False))
        meta.update(entry.consts)
        return meta

    def _grid(self, grid: Any, args: tuple[Any, ...], entry: _Entry) -> tuple[int, int, int]:
        if not callable(grid):
            return _grid3(grid)
        try:
            return _grid3(grid(entry.consts))
        except KeyError:
            # The grid reads a runtime argument: give it every argument, as Triton does.
            return _grid3(grid(self._full_meta(args, entry)))

    def _triton_bind(
        self, device: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, ...] | None:
        # The argument values JITFunction.run would pass to the launcher (its binder).
        caches = getattr(self.jit, "device_caches", None)
        if caches is None:
            return None
        binder = caches[device][4]
        bound, _specialization, _options = binder(*args, **kwargs)
        return tuple(bound.values())

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.entries.clear()
        self.epoch += 1

    def _first(
        self,
        key: tuple[Any, ...],
        entry: _Entry | None,
        device: int,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The first call with a key (make the entry) or its first reuse (check it)."""
        self.counts["jit"] += 1
        kernel = self._slow(*args, grid=grid, warmup=False, **kwargs)
        if kernel is None or hasattr(kernel, "result"):
            return kernel  # compiled asynchronously: nothing to keep yet
        if entry is not None:
            if _triton.same_binary(kernel, entry.kernel):
                entry.verified = True
            else:
                self._disable(
                    "self-check: a second call with the same cheap key reached another "
                    "compiled kernel"
                )
            return kernel
        tail, consts = self._tail(len(args), kwargs)
        made = _Entry(kernel, tail, consts)
        bound = self._bind(device, args, kwargs)
        if bound is None:
            self._disable("self-check: Triton's argument binder is not available")
            return kernel
        mine = args + tail
        if len(bound) != len(mine) or not all(map(_same, bound, mine)):
            self._disable(
                "self-check: the direct path's arguments differ from those JITFunction.run binds"
            )
            return kernel
        if callable(grid):
            named = dict(zip(self.names, bound, strict=True))
            if self._grid(grid, args, made) != _grid3(grid(named)):
                self._disable("self-check: the direct path's grid differs from JITFunction.run's")
                return kernel
        self.entries[key] = made
        self.counts["compiled"] += 1
        return kernel

    def lookup(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], extra: Any = None
    ) -> tuple[int, tuple[Any, ...] | None, _Entry | None]:
        """(device, key, entry) for one call; key None: JITFunction.run must serve it."""
        tr = self._tr()
        if self.disabled is not None or tr is None or not tr.quiet():
            return -1, None, None
        device: int = tr.get_device()
        try:
            key = self.key(device, args, kwargs, extra)
            return device, key, None if key is None else self.entries.get(key)
        except TypeError:  # an unhashable constexpr value
            return device, None, None

    def fire(self, entry: _Entry, grid: Any, args: tuple[Any, ...], device: int) -> Any:
        """Launch a verified entry directly on the current stream."""
        g0, g1, g2 = self._grid(grid, args, entry)
        stream = self._triton.get_stream(device)
        entry.call(g0, g1, g2, stream, entry.function, *entry.pre, *args, *entry.tail)
        self.counts["direct"] += 1
        return entry.kernel

    def launch(
        self,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        device: int,
        key: tuple[Any, ...] | None,
        entry: _Entry | None,
    ) -> Any:
        """Launch after :meth:`lookup`, with ``kwargs`` complete (configs merged in)."""
        if key is None:
            self.counts["jit"] += 1
            return self._slow(*args, grid=grid, warmup=False, **kwargs)
        if entry is None or not entry.verified:
            return self._first(key, entry, device, grid, args, kwargs)
        return self.fire(entry, grid, args, device)

    def run(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch ``jit[grid](*args, **kwargs)``, directly when an entry is ready."""
        device, key, entry = self.lookup(args, kwargs)
        if entry is not None and entry.verified:
            return self.fire(entry, grid, args, device)
        return self.launch(grid, args, kwargs, device, key, entry)

    def ready(
        self, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], extra: Any = None
    ) -> Ready | None:
        """This call made ready to repeat (:class:`Ready`), when its entry is verified
        and it runs on the current device; else None."""
        device, _key, entry = self.lookup(args, kwargs, extra)
        if entry is None or not entry.verified:
            return None
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.get_device() not in (device, -1):
            return None
        return Ready(self, entry, self._grid(grid, args, entry), device)


class Ready:
    """One verified launch, ready to repeat with new tensors of the same kind.

    The caller guarantees what the launcher's key would check: every later call passes
    tensors of the same dtypes and 16-byte alignment, and the same integers and
    constant keywords (the pointwise plan memo keys on exactly that). :meth:`fire` then
    skips the key and the lookup; it stands down (returns False, nothing launched) when
    the launcher's entries were dropped since, a launch hook was installed, or the
    current device is another.
    """

    __slots__ = ("device", "entry", "epoch", "grid", "launcher")

    def __init__(
        self, launcher: Launcher, entry: _Entry, grid: tuple[int, int, int], device: int
    ) -> None:
        self.launcher = launcher
        self.entry = entry
        self.grid = grid
        self.device = device
        self.epoch = launcher.epoch

    def fire(self, args: tuple[Any, ...]) -> bool:
        """Launch with ``args``; whether it did."""
        launcher = self.launcher
        if launcher.epoch != self.epoch or launcher.disabled is not None:
            return False
        tr = launcher._triton
        device = self.device
        if not tr.quiet() or tr.get_device() != device:
            return False
        entry = self.entry
        g0, g1, g2 = self.grid
        entry.call(
            g0, g1, g2, tr.get_stream(device), entry.function, *entry.pre, *args, *entry.tail
        )
        launcher.counts["direct"] += 1
        return True


_LAUNCHERS: dict[int, Launcher] = {}


# --- stubbed launches (the host-time bench) ---------------------------------------------


def _noop(*_args: Any) -> None:
    return None


class _StubKernel:
    """Stands for a compiled kernel while launches are stubbed: its launch does nothing."""

    function = 0
    packed_metadata = None
    run = staticmethod(_noop)


class _StubRuntime:
    """Device 0, stream 0, no hooks: what a stubbed launcher asks instead of a driver."""

    version = "stub"

    @staticmethod
    def get_device() -> int:
        return 0

    @staticmethod
    def get_stream(_device: int) -> int:
        return 0

    @staticmethod
    def quiet() -> bool:
        return True


def _python_specs(fn: Any) -> tuple[ParamSpec, ...]:
    # An interpreted kernel keeps no parameter records: read its Python signature
    # (``tl.constexpr`` annotations, possibly as strings).
    import inspect

    target = getattr(fn, "fn", fn)
    out = []
    for p in inspect.signature(target).parameters.values():
        const = "constexpr" in str(p.annotation)
        default = NO_DEFAULT if p.default is inspect.Parameter.empty else p.default
        out.append(ParamSpec(p.name, CONST if const else SPEC, default))
    return tuple(out)


_STUBS: dict[int, Launcher] = {}
_STUBBED = [False]


def _stub_launcher(fn: Any) -> Launcher:
    launcher = _STUBS.get(id(fn))
    if launcher is not None and launcher.jit is fn:
        return launcher
    specs = specs_of(fn) if hasattr(fn, "params") else _python_specs(fn)

    def bind(_device: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        tail = [kwargs.get(s.name, s.default) for s in specs[len(args) :]]
        return (*args, *tail)

    compiled = _StubKernel()  # one per kernel, as Triton's cache would return
    launcher = _STUBS[id(fn)] = Launcher(
        fn,
        specs=specs,
        slow=lambda *_a, **_k: compiled,
        bind=bind,
        triton=_StubRuntime(),
    )
    return launcher


@contextlib.contextmanager
def stub_launches() -> Iterator[None]:
    """Inside the block (process-wide), kernels take the direct path with a launch that
    does nothing: the whole host path of an op runs, the device does no work and
    results are not written. ``gemsops bench --host`` uses it on machines without an
    accelerator; never use it where results matter. Kernels resolve their launch path
    again on entry and on exit.
    """
    from gemshal import tune

    before = _STUBBED[0]
    _STUBBED[0] = True
    tune.clear_cache()
    try:
        yield
    finally:
        _STUBBED[0] = before
        tune.clear_cache()


def stubbed() -> bool:
    """Whether launches are stubbed (:func:`stub_launches`)."""
    return _STUBBED[0]


def launcher_for(fn: Any) -> Launcher | None:
    """The launcher of a ``@triton.jit`` function, or None when the direct path is off.

    None also for anything that is not a compiled-mode ``JITFunction`` (an interpreted
    function, another decorator): those are launched through their own ``run``.
    """
    if stubbed():
        return _stub_launcher(fn)
    if not launch_path().direct:
        return None
    if not _triton.is_jit_function(fn):
        return None
    launcher = _LAUNCHERS.get(id(fn))
    if launcher is None or launcher.jit is not fn:
        launcher = _LAUNCHERS[id(fn)] = Launcher(fn)
    return launcher


def stats() -> list[dict[str, Any]]:
    """Per launcher: the kernel's name, launches direct / through JITFunction.run,
    entries made, and why the direct path is off for it (None when it is on)."""
    out = []
    for launcher in list(_LAUNCHERS.values()):
        out.append(
            {
                "kernel": getattr(launcher.jit, "__name__", repr(launcher.jit)),
                **launcher.counts,
                "disabled": launcher.disabled,
            }
        )
    return sorted(out, key=lambda r: str(r["kernel"]))
