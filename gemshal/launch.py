"""Launching a compiled Triton kernel again without ``JITFunction.run``'s per-call work.

``JITFunction.run`` recomputes, on every launch, the specialization of every argument,
a string cache key from it, and the launch options; on a GPU that is most of the host
time of a small op. :func:`launch` keeps, per ``@triton.jit`` function, the compiled
kernel for each *launch signature* and launches it through ``CompiledKernel[grid]``.

A launch signature is finer than Triton's own specialization key, so a kernel found
under it is one Triton would have picked:

* a tensor: its dtype and whether its address is a multiple of 16;
* an integer: whether it is 1, whether it is a multiple of 16, and its width
  (int32, int64 or uint64);
* a float or a bool: its type; ``None``: itself;
* a ``tl.constexpr`` parameter, a launch option (``num_warps``...) and anything else
  hashable: its value;
* the current device.

The first launch of a signature (and any launch with an argument outside these kinds,
or of a function with pre-run hooks) goes through ``JITFunction.run``,
which compiles or finds the kernel; its result is remembered. Interpreted functions
always take ``run``. ``GEMS_FAST_LAUNCH=0`` turns the cache off.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["FAST_LAUNCH_ENV", "clear", "launch"]

FAST_LAUNCH_ENV = "GEMS_FAST_LAUNCH"

_INT32 = 1 << 31
_INT64 = 1 << 63


class _Unkeyable(Exception):
    """An argument this cache does not key; the launch goes through ``run``."""


def _arg_key(value: Any, constexpr: bool) -> Any:
    if constexpr:
        return ("c", value)
    ptr = getattr(value, "data_ptr", None)
    if ptr is not None:
        return (value.dtype, ptr() & 15 == 0)
    kind = type(value)
    if kind is bool or kind is float or value is None:
        return kind
    if kind is int:
        width = 0 if -_INT32 <= value < _INT32 else 1 if -_INT64 <= value < _INT64 else 2
        return (value == 1, value & 15 == 0, width)
    if isinstance(value, str | bytes) or value.__class__.__name__ == "dtype":
        return ("v", value)
    raise _Unkeyable(kind.__name__)


class _Entry:
    """What one ``@triton.jit`` function needs to be launched from the cache."""

    __slots__ = ("cache", "constexpr", "defaults", "names")

    def __init__(self, fn: Any) -> None:
        self.names: tuple[str, ...] = tuple(fn.arg_names)
        self.constexpr: tuple[bool, ...] = tuple(bool(p.is_constexpr) for p in fn.params)
        if len(self.constexpr) != len(self.names):
            raise _Unkeyable("parameters")
        self.defaults: dict[str, Any] = {
            name: p.default
            for name, p in inspect.signature(fn.fn).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        self.cache: dict[tuple[Any, ...], Any] = {}


# id(fn) -> its entry, or None where launches go through ``run``.
_ENTRIES: dict[int, _Entry | None] = {}
_LOCK = threading.Lock()
_MISSING: Any = object()


def _enabled() -> bool:
    return os.environ.get(FAST_LAUNCH_ENV, "1").strip() != "0"


def _make_entry(fn: Any) -> _Entry | None:
    from triton.runtime.jit import JITFunction

    # Only Triton's own compiled JIT functions (interpreted ones run in Python), and
    # none with pre-run hooks, which ``run`` calls.
    if type(fn) is not JITFunction or getattr(fn, "pre_run_hooks", None) or not _enabled():
        return None
    try:
        return _Entry(fn)
    except (_Unkeyable, AttributeError, TypeError, ValueError):
        return None


def _entry(fn: Any) -> _Entry | None:
    key = id(fn)
    if key in _ENTRIES:
        return _ENTRIES[key]
    with _LOCK:
        if key not in _ENTRIES:
            _ENTRIES[key] = _make_entry(fn)
        return _ENTRIES[key]


def _bound(entry: _Entry, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
    values = list(args)
    for name in entry.names[len(args) :]:
        if name in kwargs:
            values.append(kwargs[name])
        elif name in entry.defaults:
            values.append(entry.defaults[name])
        else:
            raise _Unkeyable(f"argument {name!r} missing")  # run() raises Triton's error
    return values


def _device() -> Any:
    from triton.runtime import driver

    return driver.active.get_current_device()


def _stream(device: Any) -> Any:
    from triton.runtime import driver

    return driver.active.get_current_stream(device)


def launch(fn: Any, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn[grid](*args, **kwargs)``, from the compiled-kernel cache when it can be.

    Args:
        fn: A ``@triton.jit`` function (anything else is launched with its ``run``).
        grid: A tuple of up to three ints, or ``f(arguments by name)`` returning one.
        args, kwargs: The launch's arguments, launch options included.

    Returns:
        What ``run`` returns: the compiled kernel (None under the interpreter).
    """
    entry = _ENTRIES.get(id(fn), _MISSING)
    if entry is _MISSING:
        entry = _entry(fn)
    if entry is None:
        return fn.run(*args, grid=grid, warmup=False, **kwargs)
    device = _device()
    try:
        values = _bound(entry, args, kwargs)
        key = (
            device,
            *[_arg_key(v, c) for v, c in zip(values, entry.constexpr, strict=True)],
            *sorted((k, v) for k, v in kwargs.items() if k not in entry.names),
        )
        compiled = entry.cache.get(key)
    except (_Unkeyable, TypeError, ValueError):
        return fn.run(*args, grid=grid, warmup=False, **kwargs)
    if compiled is None:
        compiled = fn.run(*args, grid=grid, warmup=False, **kwargs)
        if compiled is not None:
            entry.cache[key] = compiled
        return compiled
    if callable(grid):
        grid = grid(dict(zip(entry.names, values, strict=True)))
    size = len(grid)
    grid3 = (grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1)
    compiled[grid3](*values, stream=_stream(device))
    return compiled


def clear() -> None:
    """Forget every remembered compiled kernel (the next launches go through ``run``)."""
    with _LOCK:
        _ENTRIES.clear()
