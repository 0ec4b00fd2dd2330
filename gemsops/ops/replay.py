"""The replay memo: an op whose host code decides only from its arguments' structure
runs that code once per structure, and replays the outputs and launches after.

:func:`replayable` wraps an op's implementation. Each call's key is its arguments'
structure: per tensor its dtype, shape, strides, device and 16-byte alignment; per
number, string, dtype or device its type and value; a list of integers or of tensors
element by element (a 0-dim CPU tensor, an ``out=`` tensor or any other argument: no
key, the call runs as written).
On the first call with a key the implementation runs under
:func:`gemshal.kernel.recording`; when it made new output tensors and launched gemshal
kernels whose tensor arguments are the call's own tensors, its outputs, or views of
either, the outputs' layouts and the launches are kept. A later call with the key
allocates the outputs and fires the launches (prepared, see
:meth:`gemshal.kernel.Kernel.prepare`) with its own tensors.

The contract of an op that takes it: on the replayed path its host code reads no
tensor value, keeps no state, and has no effect but its outputs and its gemshal
launches (a torch call that writes a tensor would be skipped by a replay). A recording
with no launch is kept only when every output is empty. ``when`` narrows the calls
further (``addmm`` with ``alpha`` 0 zeroes its output with a torch call: not taken).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

import gemshal
from gemshal.kernel import recording

__all__ = ["clear", "kept", "replayable"]

F = TypeVar("F", bound=Callable[..., Any])

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)
_MEMO: dict[tuple[Any, ...], _Recipe] = {}
_SLOTS = 8192


def clear() -> None:
    """Forget every kept recipe (tests)."""
    _MEMO.clear()


def kept() -> int:
    """How many recipes are kept (tests, diagnostics)."""
    return len(_MEMO)


def _tensor(value: Tensor, append: Callable[[Any], None]) -> bool:
    if value.layout is not torch.strided:
        return False
    device = value.device
    shape = value.shape
    if not shape and device.type == "cpu":
        return False  # read as a number by the ops that take one
    append(value.dtype)
    append(shape)
    append(value.stride())
    append(device)
    append(not value.data_ptr() & 15)
    return True


def _key(name: str, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(the call's key, its inputs flattened: a list of tensors gives its tensors)."""
    parts: list[Any] = [name]
    append = parts.append
    inputs: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            if not _tensor(value, append):
                return None
            inputs.append(value)
        elif type(value) in _PLAIN:
            append(type(value))
            append(value)
            inputs.append(value)
        elif type(value) in (list, tuple):
            if all(type(v) is int for v in value):
                append(tuple(value))
                inputs.append(value)
            elif all(isinstance(v, Tensor) for v in value):
                append(("tensors", len(value)))
                for v in value:
                    if not _tensor(v, append):
                        return None
                inputs.extend(value)
            else:
                return None
        else:
            return None
    if kwargs:
        append(tuple(kwargs))
    append(torch.get_default_dtype())
    return tuple(parts), tuple(inputs)


class _Launch:
    __slots__ = ("grid", "kernel", "keywords", "prepared", "template", "tensors")

    def __init__(self, kernel: Any, grid: Any, template: list[Any],
                 tensors: tuple[tuple[int, str, int, Any], ...], keywords: Any) -> None:
        self.kernel = kernel
        self.grid = grid
        self.template = template
        # (position, "in" | "out" | "view" | "outview", index, view geometry)
        self.tensors = tensors
        self.keywords = keywords
        self.prepared: Any = None


class _Recipe:
    __slots__ = ("launches", "outputs", "scratch", "single", "vendor")

    def __init__(self, outputs: tuple[tuple[Any, ...], ...], launches: tuple[_Launch, ...],
                 single: bool, scratch: bool, vendor: Any) -> None:
        self.outputs = outputs
        self.launches = launches
        self.single = single
        self.scratch = scratch
        self.vendor = vendor

    def replay(self, inputs: tuple[Any, ...]) -> Any:
        outs = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, strides, dtype, device in self.outputs]
        if self.scratch:
            gemshal.ensure_scratch_allocator()  # Triton's allocator is per thread
        for launch in self.launches:
            call = list(launch.template)
            for position, kind, index, view in launch.tensors:
                if kind == "in":
                    call[position] = inputs[index]
                elif kind == "out":
                    call[position] = outs[index]
                elif kind == "outview":
                    shape, strides, delta = view
                    call[position] = outs[index].as_strided(shape, strides, delta)
                else:
                    base = inputs[index]
                    shape, strides, delta = view
                    call[position] = base.as_strided(shape, strides, base.storage_offset() + delta)
            args = tuple(call)
            prepared = launch.prepared
            if prepared is None or not prepared.fire(args):
                launch.kernel.launch(launch.grid, args, launch.keywords)
                launch.prepared = launch.kernel.prepare(launch.grid, args, launch.keywords)
        return outs[0] if self.single else tuple(outs)


def _find(t: Tensor, inputs: tuple[Any, ...],
          outs: tuple[Tensor, ...]) -> tuple[str, int, Any] | None:
    for i, o in enumerate(outs):
        if t is o:
            return "out", i, None
    for i, x in enumerate(inputs):
        if t is x:
            return "in", i, None
    storage = t.untyped_storage().data_ptr()
    for i, o in enumerate(outs):
        if o.untyped_storage().data_ptr() == storage and t.dtype == o.dtype:
            return "outview", i, (tuple(t.shape), tuple(t.stride()),
                                  t.storage_offset() - o.storage_offset())
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.untyped_storage().data_ptr() == storage and (
                t.dtype == x.dtype):
            return "view", i, (tuple(t.shape), tuple(t.stride()),
                               t.storage_offset() - x.storage_offset())
    return None


def _recipe(inputs: tuple[Any, ...], result: Any, rec: Any) -> _Recipe | None:
    single = isinstance(result, Tensor)
    outs = (result,) if single else result
    if not isinstance(outs, tuple) or not outs or not all(isinstance(o, Tensor) for o in outs):
        return None
    ids = {id(x) for x in inputs if isinstance(x, Tensor)}
    if len({id(o) for o in outs}) != len(outs) or any(id(o) in ids for o in outs):
        return None  # an input handed back, or one tensor twice
    in_storages = {x.untyped_storage().data_ptr() for x in inputs
                   if isinstance(x, Tensor) and x.numel()}
    if any(o.numel() and o.untyped_storage().data_ptr() in in_storages for o in outs):
        return None  # a view of an input
    for o in outs:
        # The replay allocates each output alone: it must own its whole storage.
        span = (sum((n - 1) * st for n, st in zip(o.shape, o.stride(), strict=True)) + 1
                if o.numel() else 0) * o.element_size()
        if o.storage_offset() or o.untyped_storage().nbytes() != span:
            return None
    if not rec.launches and any(o.numel() for o in outs):
        return None  # written by something other than a gemshal launch
    launches = []
    for kernel, grid, args, keywords in rec.launches:
        template = list(args)
        tensors = []
        for position, value in enumerate(args):
            if isinstance(value, Tensor):
                found = _find(value, inputs, outs)
                if found is None:
                    return None  # a tensor made for this call (a workspace)
                tensors.append((position, *found))
                template[position] = None
        launches.append(_Launch(kernel, grid, template, tuple(tensors), keywords))
    outputs = tuple((tuple(o.shape), tuple(o.stride()), o.dtype, o.device) for o in outs)
    return _Recipe(outputs, tuple(launches), single, rec.scratch, gemshal.current_vendor())


def replayable(*, when: Callable[..., bool] | None = None,
               extra: Callable[[], Any] | None = None) -> Callable[[F], F]:
    """Make an op implementation replay its outputs and launches per argument structure
    (see the module docstring for the contract). ``when(*args, **kwargs)``: False for a
    call that must run as written every time; ``extra()``: global state the host code
    reads (mm's float32 matmul precision), added to each key."""

    def wrap(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("out") is not None or (when is not None and not when(*args, **kwargs)):
                return fn(*args, **kwargs)
            keyed = _key(name, args, kwargs)
            if keyed is None:
                return fn(*args, **kwargs)
            key, inputs = keyed
            if extra is not None:
                key = (*key, extra())
            recipe = _MEMO.get(key)
            if recipe is not None and recipe.vendor is gemshal.current_vendor():
                return recipe.replay(inputs)
            with recording() as rec:
                result = fn(*args, **kwargs)
            made = _recipe(inputs, result, rec)
            if made is not None:
                if len(_MEMO) >= _SLOTS:
                    _MEMO.clear()
                _MEMO[key] = made
            return result

        return run  # type: ignore[return-value]

    return wrap
