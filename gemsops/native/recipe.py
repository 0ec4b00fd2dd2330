"""One recorded call made into the integer recipe the native library replays.

The native kernel (``native.cpp``) flattens a call's tensors in schema order (a tensor
argument, each tensor of a tensor list) and keys the call on their structure. When the
Python path served a keyed call, :func:`build` turns what it did (the outputs it made
and the gemshal launches it recorded) into a flat list of integers:

``[1, device, outputs, workspaces, launches, results, *allocs, *launches, *results]``

- an alloc: ``dtype code, dim, *sizes, *strides`` (made with ``empty_strided``);
- a launch: ``function, grid x, y, z, threads, shared bytes, scratch bytes, params,
  *(kind, a, b) per kernel parameter``, a parameter being a constant's bits, a pointer
  into an input, an output or a workspace at a fixed byte offset, Triton's global scratch,
  or a null pointer;
- a result: ``(kind, value)``: an output, an input tensor handed back (in-place), an int,
  an undefined tensor, None, a bool or a float's bits.

``[0]`` says the key is never replayed (the call stays on the Python path); None (no
offer) that it may be next time (a launch whose specialization is not yet checked).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gemshal.kernel.launcher import stubbed
from gemsops.ops.replay import _owns_storage

__all__ = ["REFUSED", "build", "flat_inputs"]

REFUSED = [0]

_CONST, _INPUT, _OUTPUT, _WORK, _SCRATCH, _NULL = range(6)
_R_OUTPUT, _R_INPUT, _R_INT, _R_UNDEFINED, _R_NONE, _R_BOOL, _R_DOUBLE = range(7)

_INT_BITS = {"i1": 8, "i8": 8, "i16": 16, "i32": 32, "i64": 64,
             "u1": 8, "u8": 8, "u16": 16, "u32": 32, "u64": 64}

DTYPE_CODES: dict[torch.dtype, int] = {}
"""torch dtype -> c10::ScalarType code, filled when the library loads."""


def flat_inputs(schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Tensor]:
    """The call's tensors in the order the native kernel flattens its stack."""
    out: list[Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            continue  # a default: never a tensor
        if isinstance(value, Tensor):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(v for v in value if isinstance(v, Tensor))
    return out


def _alloc(t: Tensor) -> list[int] | None:
    code = DTYPE_CODES.get(t.dtype)
    if code is None:
        return None
    return [code, t.dim(), *t.shape, *t.stride()]


def _pointer(value: Tensor, inputs: Sequence[Tensor], outs: Sequence[Tensor],
             work: list[Tensor], workspaces: bool) -> tuple[int, int, int] | None:
    for i, o in enumerate(outs):
        if value is o:
            return _OUTPUT, i, 0
    for i, x in enumerate(inputs):
        if value is x:
            return _INPUT, i, 0
    if not value.numel():
        return _NULL, 0, 0  # nothing is read or written through it
    ptr = value.data_ptr()
    storage = value.untyped_storage().data_ptr()
    for kind, pool in ((_OUTPUT, outs), (_INPUT, inputs)):
        for i, x in enumerate(pool):
            if x.numel() and x.untyped_storage().data_ptr() == storage:
                return kind, i, ptr - x.data_ptr()
    for i, w in enumerate(work):
        if value is w:
            return _WORK, i, 0
    if workspaces and _owns_storage(value):
        work.append(value)
        return _WORK, len(work) - 1, 0
    return None


def _results(schema: Any, result: Any, inputs: Sequence[Tensor],
             outs: list[Tensor]) -> list[int] | None:
    values = result if isinstance(result, tuple) else (result,)
    returns = schema.returns
    if len(values) != len(returns):
        return None
    words: list[int] = []
    in_storages = {x.untyped_storage().data_ptr() for x in inputs if x.numel()}
    for value, ret in zip(values, returns, strict=True):
        if isinstance(value, Tensor):
            at = next((i for i, x in enumerate(inputs) if x is value), None)
            if at is not None:
                words += [_R_INPUT, at]
                continue
            if any(value is o for o in outs):
                return None  # one tensor twice
            if value.numel() and value.untyped_storage().data_ptr() in in_storages:
                return None  # a view of an input
            if not _owns_storage(value) or value.requires_grad:
                return None
            words += [_R_OUTPUT, len(outs)]
            outs.append(value)
        elif value is None:
            words += [_R_UNDEFINED if str(ret.type) == "Tensor" else _R_NONE, 0]
        elif type(value) is bool:
            words += [_R_BOOL, int(value)]
        elif type(value) is int:
            words += [_R_INT, value]
        elif type(value) is float:
            words += [_R_DOUBLE, _f64_bits(value)]
        else:
            return None
    return words


def _signature(compiled: Any, launcher: Any) -> list[tuple[str, str]] | None:
    """(name, Triton type) of every kernel parameter, constexprs included."""
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None)
    if isinstance(signature, dict):
        names = list(getattr(getattr(src, "fn", None), "arg_names", signature))
        if any(isinstance(signature.get(n), tuple) for n in names):
            return None  # a tuple argument
        return [(n, str(signature.get(n, "constexpr"))) for n in names]
    if stubbed():
        # Stubbed launches (CPU tests): the kinds the launcher knows, typed by value.
        from gemshal.kernel.launcher import CONST

        return [(s.name, "constexpr" if s.kind == CONST else "?") for s in launcher.specs]
    return None


def _param(kind: str, value: Any) -> int | None:
    """A constant kernel parameter's bits, or None when it cannot be passed."""
    if kind == "?":  # stubbed: by value
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value & ((1 << 64) - 1) if value >= 0 else value
        if isinstance(value, float):
            return _f32_bits(value)
        return None
    bits = _INT_BITS.get(kind)
    if bits is not None and isinstance(value, int | bool):
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << 64) if v >= 1 << 63 else v
    if kind in ("fp32", "f32") and isinstance(value, int | float):
        return _f32_bits(float(value))
    if kind == "fp64" and isinstance(value, int | float):
        return _f64_bits(float(value))
    return None


def _f32_bits(value: float) -> int:
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits


def _f64_bits(value: float) -> int:
    bits: int = struct.unpack("<q", struct.pack("<d", value))[0]
    return bits


def _launch(kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: Any,
            inputs: Sequence[Tensor], outs: Sequence[Tensor], work: list[Tensor],
            workspaces: bool) -> tuple[list[int] | None, int, bool]:
    """(the launch's words, its device, whether a refusal is for good)."""
    state = kernel._state
    if state.launcher is None:
        return None, -1, True  # the interpreter, or the direct path off
    prepared = kernel.prepare(grid, args, kwargs)
    if prepared is None:
        return None, -1, False  # not checked yet: next time
    ready = prepared._ready
    entry = ready.entry
    compiled = entry.kernel
    signature = _signature(compiled, ready.launcher)
    values = (*args, *entry.tail)
    if signature is None or len(signature) != len(values):
        return None, -1, True
    slots: list[int] = []
    for (_name, kind), value in zip(signature, values, strict=True):
        if kind == "constexpr":
            continue
        if kind.startswith("*") or (kind == "?" and (value is None or isinstance(value, Tensor))):
            if value is None:
                slots += [_NULL, 0, 0]
                continue
            if not isinstance(value, Tensor):
                return None, -1, True
            found = _pointer(value, inputs, outs, work, workspaces)
            if found is None:
                return None, -1, True
            slots += list(found)
            continue
        bits = _param(kind, value)
        if bits is None:
            return None, -1, True
        slots += [_CONST, bits, 0]
    g0, g1, g2 = ready.grid
    run = getattr(compiled, "run", None)
    scratch = 0
    if not stubbed():
        meta = compiled.metadata
        if (getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_pdl", False)
                or getattr(meta, "launch_cooperative_grid", False)
                or tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in
                ((1, 1, 1), (1,), ())
                or getattr(meta, "profile_scratch_size", 0)
                or getattr(run, "gsan_enabled", False)):
            return None, -1, True
        size = int(getattr(meta, "global_scratch_size", 0) or 0)
        if size:
            scratch = g0 * g1 * g2 * size
            slots += [_SCRATCH, 0, 0]
        else:
            slots += [_NULL, 0, 0]
        slots += [_NULL, 0, 0]  # profile scratch
        threads = int(meta.num_warps) * 32
        shared = int(meta.shared)
    else:
        threads, shared = 0, 0
    params = len(slots) // 3
    if params > 64:
        return None, -1, True
    words = [int(entry.function), g0, g1, g2, threads, shared, scratch, params, *slots]
    return words, ready.device, False


def build(schema: Any, args: Sequence[Any], kwargs: dict[str, Any], result: Any,
          launches: Sequence[tuple[Any, Any, tuple[Any, ...], Any]],
          workspaces: bool) -> list[int] | None:
    """The recipe of one served call (see the module docstring)."""
    inputs = flat_inputs(schema, args, kwargs)
    outs: list[Tensor] = []
    results = _results(schema, result, inputs, outs)
    if results is None:
        return REFUSED
    if not launches and any(o.numel() for o in outs):
        return REFUSED  # written by something other than a gemshal launch
    work: list[Tensor] = []
    words: list[int] = []
    device = -1
    for kernel, grid, largs, kwords in launches:
        made, dev, final = _launch(kernel, grid, largs, kwords, inputs, outs, work, workspaces)
        if made is None:
            return REFUSED if final else None
        if device >= 0 and dev != device:
            return REFUSED
        device = dev
        words += made
    if device < 0 and not stubbed():
        first = next((t for t in (*outs, *inputs) if t.device.type != "cpu"), None)
        device = -1 if first is None else int(first.device.index or 0)
    allocs: list[int] = []
    for t in (*outs, *work):
        made = _alloc(t)
        if made is None:
            return REFUSED
        allocs += made
    if stubbed():
        device = -1 if all(t.device.type == "cpu" for t in (*outs, *inputs)) else device
    return [1, device, len(outs), len(work), len(launches), len(results) // 2,
            *allocs, *words, *results]
