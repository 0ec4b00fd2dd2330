"""The replay memo: an op whose host code decides only from its arguments' structure
runs that code once per structure, and replays the outputs and launches after.

:func:`replayable` wraps an op's implementation. Each call's key is its arguments'
structure: per tensor its dtype, shape, strides, device and 16-byte alignment; per
number, string, dtype or device its type and value; a list of integers, booleans or
tensors element by element (a 0-dim CPU tensor, an ``out=`` tensor or any other
argument: no key, the call runs as written).
On the first call with a key the implementation runs under
:func:`gemshal.kernel.recording`; when it made new output tensors and launched gemshal
kernels whose tensor arguments are the call's own tensors, its outputs, or views of
either, the outputs' layouts and the launches are kept (an op that vouches for its
workspaces may also launch over tensors it allocated for the call). A result may hold
numbers and None beside its tensors. A later call with the key
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
from gemsops.ops import witness
from gemsops.ops.pointwise.iterator import _extent, _tensor_key

__all__ = ["VOUCHED", "clear", "kept", "replayable"]

F = TypeVar("F", bound=Callable[..., Any])

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)
_MEMO: dict[tuple[Any, ...], _Recipe] = {}
_SLOTS = 8192

VOUCHED: dict[str, bool] = {}
"""Per replayable implementation (``module.qualname``): whether it vouches for its
workspaces. gemsops' native replay reads it."""


def clear() -> None:
    """Forget every kept recipe (tests)."""
    _MEMO.clear()


def kept() -> int:
    """How many recipes are kept (tests, diagnostics)."""
    return len(_MEMO)


def _key(name: str, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """(the call's key, its inputs flattened: a list of tensors gives its tensors)."""
    parts: list[Any] = [name]
    append = parts.append
    inputs: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            if not _tensor_key(value, append):
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
            elif all(type(v) is bool for v in value):
                append(("bools", *value))  # a norm backward's output_mask
                inputs.append(value)
            elif all(isinstance(v, Tensor) for v in value):
                append(("tensors", len(value)))
                for v in value:
                    if not _tensor_key(v, append):
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
    __slots__ = ("launches", "outputs", "result", "scratch", "single", "vendor", "work")

    def __init__(self, outputs: tuple[tuple[Any, ...], ...], launches: tuple[_Launch, ...],
                 single: bool, scratch: bool, vendor: Any,
                 result: tuple[Any, ...] = (), work: tuple[tuple[Any, ...], ...] = ()) -> None:
        self.outputs = outputs
        self.launches = launches
        self.single = single
        self.scratch = scratch
        self.vendor = vendor
        # per result element: an index into the outputs, or (None, constant)
        self.result = result
        self.work = work  # workspaces: (shape, strides, dtype, device)

    def replay(self, inputs: tuple[Any, ...]) -> Any:
        outs = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, strides, dtype, device in self.outputs]
        work = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, strides, dtype, device in self.work]
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
                    call[position] = _rebuild(outs[index], view)
                elif kind == "work":
                    call[position] = work[index]
                else:
                    call[position] = _rebuild(inputs[index], view)
            args = tuple(call)
            prepared = launch.prepared
            if prepared is None or not prepared.fire(args):
                launch.kernel.launch(launch.grid, args, launch.keywords)
                launch.prepared = launch.kernel.prepare(launch.grid, args, launch.keywords)
        if self.single:
            return outs[0]
        return tuple(outs[r] if type(r) is int else r[1] for r in self.result)


def _find(t: Tensor, inputs: tuple[Any, ...],
          outs: tuple[Tensor, ...]) -> tuple[str, int, Any] | None:
    """Where a launch's tensor ``t`` comes from: ``("out" | "in", index, None)``, or a
    view of an output or input, ``("outview" | "view", index, (shape, strides, element
    offset, dtype))``. A view may read its base as another dtype of the same element
    size (a bool tensor read as uint8 by the reductions' kernel view). None when ``t``
    is none of these, or a view of one that the replay could not rebuild."""
    for i, o in enumerate(outs):
        if t is o:
            return "out", i, None
    for i, x in enumerate(inputs):
        if t is x:
            return "in", i, None
    storage = t.untyped_storage().data_ptr()
    for kind, pool in (("outview", outs), ("view", inputs)):
        for i, x in enumerate(pool):
            if isinstance(x, Tensor) and x.untyped_storage().data_ptr() == storage:
                if t.element_size() != x.element_size():
                    return None  # offsets in other units: not rebuilt, not a workspace
                return kind, i, (tuple(t.shape), tuple(t.stride()),
                                 t.storage_offset() - x.storage_offset(), t.dtype)
    return None


def _rebuild(base: Tensor, view: tuple[Any, ...]) -> Tensor:
    """The view :func:`_find` described, over this call's ``base``."""
    shape, strides, delta, dtype = view
    if dtype != base.dtype:
        base = base.view(dtype)
    return base.as_strided(shape, strides, base.storage_offset() + delta)


def _shares_storage(t: Tensor, inputs: tuple[Any, ...], outs: tuple[Tensor, ...]) -> bool:
    """Whether ``t`` lies in the storage of one of the call's tensors (so it is no
    workspace of its own, whatever its dtype)."""
    storage = t.untyped_storage().data_ptr()
    return any(isinstance(x, Tensor) and x.untyped_storage().data_ptr() == storage
               for x in (*inputs, *outs))


def _owns_storage(t: Tensor) -> bool:
    """Whether ``t`` is its storage's only view from the start (a replay allocates it
    alone)."""
    return not t.storage_offset() and t.untyped_storage().nbytes() == _extent(t)


_CONSTANT_OUTPUT = (type(None), bool, int, float)


def _recipe(inputs: tuple[Any, ...], result: Any, rec: Any,
            workspaces: bool) -> _Recipe | None:
    single = isinstance(result, Tensor)
    if single:
        outs: tuple[Tensor, ...] = (result,)
        shape: tuple[Any, ...] = (0,)
    else:
        if not isinstance(result, tuple) or not result:
            return None
        if not all(isinstance(o, Tensor) or type(o) in _CONSTANT_OUTPUT for o in result):
            return None
        outs = tuple(o for o in result if isinstance(o, Tensor))
        slots: list[Any] = []
        for o in result:
            slots.append(len([s for s in slots if type(s) is int]) if isinstance(o, Tensor)
                         else (None, o))
        shape = tuple(slots)
    if not outs:
        return None
    ids = {id(x) for x in inputs if isinstance(x, Tensor)}
    if len({id(o) for o in outs}) != len(outs) or any(id(o) in ids for o in outs):
        return None  # an input handed back, or one tensor twice
    in_storages = {x.untyped_storage().data_ptr() for x in inputs
                   if isinstance(x, Tensor) and x.numel()}
    if any(o.numel() and o.untyped_storage().data_ptr() in in_storages for o in outs):
        return None  # a view of an input
    if not all(_owns_storage(o) for o in outs):
        return None  # the replay allocates each output alone
    if not rec.launches and any(o.numel() for o in outs):
        return None  # written by something other than a gemshal launch
    launches = []
    work: list[Tensor] = []
    for kernel, grid, args, keywords in rec.launches:
        template = list(args)
        tensors = []
        for position, value in enumerate(args):
            if isinstance(value, Tensor):
                found = _find(value, inputs, outs)
                if found is None and _shares_storage(value, inputs, outs):
                    return None  # a view of an input or output the replay cannot rebuild
                if found is None:
                    # A tensor made for this call (a workspace): kept only where the op
                    # vouches its launches write every workspace before reading it.
                    at = next((i for i, w in enumerate(work) if w is value), None)
                    if at is None:
                        if not workspaces or not _owns_storage(value):
                            return None
                        at = len(work)
                        work.append(value)
                    found = ("work", at, None)
                tensors.append((position, *found))
                template[position] = None
        launches.append(_Launch(kernel, grid, template, tuple(tensors), keywords))
    outputs = tuple((tuple(o.shape), tuple(o.stride()), o.dtype, o.device) for o in outs)
    spaces = tuple((tuple(w.shape), tuple(w.stride()), w.dtype, w.device) for w in work)
    return _Recipe(outputs, tuple(launches), single, rec.scratch, gemshal.current_vendor(),
                   () if single else shape, spaces)


def replayable(*, when: Callable[..., bool] | None = None,
               extra: Callable[[], Any] | None = None,
               workspaces: bool = False) -> Callable[[F], F]:
    """Make an op implementation replay its outputs and launches per argument structure
    (see the module docstring for the contract). ``when(*args, **kwargs)``: False for a
    call that must run as written every time; ``extra()``: global state the host code
    reads (mm's float32 matmul precision), added to each key; ``workspaces``: the op
    vouches that every other tensor its launches take is allocated empty and written by
    a launch before one reads it, so the replay allocates it afresh (attention's
    backward and its row statistics)."""

    def wrap(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"
        VOUCHED[name] = workspaces

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
                witness.note()
                return recipe.replay(inputs)
            with recording() as rec:
                result = fn(*args, **kwargs)
            made = _recipe(inputs, result, rec, workspaces)
            if made is not None:
                if len(_MEMO) >= _SLOTS:
                    _MEMO.clear()
                _MEMO[key] = made
                witness.note()
            return result

        return run  # type: ignore[return-value]

    return wrap
