"""What torch's TensorIterator does on the host, for the pointwise generator.

:func:`run` takes an op (:class:`~gemsops.ops.pointwise.types.PointwiseOp`) and its
operands; it promotes dtypes, broadcasts, turns Python numbers and 0-dim CPU tensors into
kernel scalars, checks and allocates the output, and hands
:mod:`gemsops.ops.pointwise.codegen` a flat or a strided launch. Anything a kernel
cannot do as torch would is refused with :class:`~gemsops.errors.Unsupported` before
the output is touched.

The common call (same-shape contiguous tensors, functional or in place on ``self``)
takes a fast path whose dtype decisions are cached per (op, operand dtypes).

Every decision :func:`run` makes depends only on what it can read without touching
data: the op, each tensor's dtype, shape, strides, device and 16-byte alignment, each
number's type and value. So a call's outcome (the output's layout and the launch) is
kept per such key in a plan memo, and a later call with the same key allocates and
launches without deciding again (:class:`_Recipe`); with the kernel's launch prepared
(:meth:`gemshal.kernel.Kernel.prepare`) it also skips the launch key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gemshal import current_vendor
from gemsops.errors import Unsupported
from gemsops.ops import witness
from gemsops.ops.dtypes import TL_DTYPES, Number
from gemsops.ops.outputs import warn_resize
from gemsops.ops.pointwise.codegen import (
    BITS64,
    LOAD,
    SINGLE,
    VALUE,
    Launch,
    launch_flat,
    launch_flat_planned,
    launch_strided,
)
from gemsops.ops.pointwise.types import PointwiseOp, device_type, op_dtypes, scalar_arg
from gemsops.ops.pointwise.types import casts as operand_casts

__all__ = ["binary_function", "broadcast_shape", "resize_output", "run", "unary_function"]

Casts = tuple[torch.dtype | None, torch.dtype | None]  # (via, to) of types.casts


def _tl(dtype: torch.dtype | None) -> Any:
    return None if dtype is None else TL_DTYPES[dtype]


_HALVES = (torch.float16, torch.bfloat16)


_METAS: dict[tuple[Any, ...], tuple[PointwiseOp, dict[str, Any]]] = {}


def _meta(op: PointwiseOp, kinds: Sequence[int], casts: Sequence[tuple[Any, Any]],
          result: torch.dtype, out_dtype: torch.dtype) -> dict[str, Any]:
    """The kernel constants of one call, one kept dict per distinct set (callers never
    change it): the launch path then recognises it by identity."""
    key = (id(op), tuple(kinds), tuple(casts), result, out_dtype)
    hit = _METAS.get(key)
    if hit is not None and hit[0] is op:
        return hit[1]
    meta = _make_meta(op, kinds, casts, result, out_dtype)
    if len(_METAS) >= 4096:
        _METAS.clear()
    _METAS[key] = (op, meta)
    return meta


def _make_meta(op: PointwiseOp, kinds: Sequence[int], casts: Sequence[tuple[Any, Any]],
               result: torch.dtype, out_dtype: torch.dtype) -> dict[str, Any]:
    kinds = [*kinds, VALUE, VALUE, VALUE][:3]
    casts = [*casts, (None, None), (None, None)][:3]
    return {
        "OP": op.half_body if op.half_body is not None and result in _HALVES else op.body,
        "NARGS": len(op.roles),
        "K0": kinds[0], "K1": kinds[1], "K2": kinds[2],
        "V0": _tl(casts[0][0]), "V1": _tl(casts[1][0]), "V2": _tl(casts[2][0]),
        "T0": _tl(casts[0][1]), "T1": _tl(casts[1][1]), "T2": _tl(casts[2][1]),
        "R": None if out_dtype == result else TL_DTYPES[result],
    }


# --- layouts ----------------------------------------------------------------------


def broadcast_shape(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The broadcast of ``shapes`` (Unsupported when they do not broadcast; torch raises)."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        for k, size in enumerate(s, rank - len(s)):
            if size != 1:
                if out[k] not in (1, size):
                    raise Unsupported(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[k] = size
    return tuple(out)


def _dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Non-overlapping and dense: the elements fill one block of memory exactly once."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(strides, shape, strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _span(t: Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def _check_out(out: Tensor, tensors: Sequence[Tensor]) -> None:
    if any(st == 0 and s > 1 for s, st in zip(out.shape, out.stride(), strict=True)):
        raise Unsupported("the output has overlapping elements (a stride of 0)")
    if out.numel() == 0:
        return
    lo, hi = _span(out)
    for t in tensors:
        if t.numel() == 0 or (
            t.data_ptr() == lo and t.shape == out.shape and t.stride() == out.stride()
        ):
            continue  # the output itself, read and written at the same element
        tlo, thi = _span(t)
        if tlo < hi and lo < thi:
            raise Unsupported("an input partly overlaps the output")


_CHANNELS_LAST: Any = "channels_last"


def _output_layout(shape: tuple[int, ...], tensors: Sequence[Tensor]) -> Any:
    """The layout torch's TensorIterator gives a new output of ``shape``: None for
    contiguous, :data:`_CHANNELS_LAST`, or strides.

    Same-shape operands that are all contiguous, all channels-last or all dense with one
    set of strides keep that layout. Otherwise the dims are sorted by the operands'
    strides, the first operand deciding and the next ones breaking ties (broadcast dims
    left out), so the output follows the first input's memory order.
    """
    n = len(shape)
    if n <= 1 or not tensors or all(t.is_contiguous() for t in tensors):
        return None  # (contiguous inputs sort into the contiguous order, broadcast or not)
    if all(t.shape == shape for t in tensors):
        if n == 4 and all(t.is_contiguous(memory_format=torch.channels_last) for t in tensors):
            return _CHANNELS_LAST
        first = tensors[0].stride()
        if all(t.stride() == first for t in tensors) and _dense(shape, first):
            return first
    strides = []
    for t in tensors:
        off = n - t.dim()
        strides.append([0] * off + [0 if size == 1 and shape[off + i] != 1 else t.stride(i)
                                    for i, size in enumerate(t.shape)])
    return _permuted(shape, strides)


def _permuted(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The output strides of torch's TensorIterator for operands of these strides (over
    ``shape``, broadcast dims at 0): dims sorted fastest first by torch's rule; None when
    that order is the contiguous one."""
    n = len(shape)

    def should_swap(d0: int, d1: int) -> int:
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    # torch's insertion sort, fastest dim first, with ambiguous comparisons left alone.
    perm = list(range(n - 1, -1, -1))
    for i in range(1, n):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    if perm == list(range(n - 1, -1, -1)):
        return None
    out = [0] * n
    step = 1
    for d in perm:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _new_output(shape: tuple[int, ...], tensors: Sequence[Tensor], dtype: torch.dtype,
                device: torch.device) -> Tensor:
    layout = _output_layout(shape, tensors)
    if layout is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if layout is _CHANNELS_LAST:
        return torch.empty(shape, dtype=dtype, device=device, memory_format=torch.channels_last)
    return torch.empty_strided(shape, layout, dtype=dtype, device=device)


def resize_output(out: Tensor, shape: tuple[int, ...], tensors: Sequence[Tensor]) -> None:
    """Resize an ``out=`` tensor as torch does: its warning when ``out`` had elements, and
    the layout a new output would get."""
    if out.numel():
        warn_resize(out, shape)
    layout = _output_layout(shape, tensors)
    if layout is _CHANNELS_LAST:
        out.resize_(shape, memory_format=torch.channels_last)
        return
    out.resize_(shape)
    if layout is not None:
        out.as_strided_(shape, layout)


def _same_walk(shape: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Equal strides on every dim of more than one element (a flat walk reads both alike)."""
    return all(x == y for x, y, size in zip(a, b, shape, strict=True) if size != 1)


# --- run --------------------------------------------------------------------------


class _Plan:
    """The cached decisions of the fast path for one (op, operand dtypes) key."""

    __slots__ = ("casts", "checked", "meta", "meta64", "result", "scalars")

    def __init__(self, meta: dict[str, Any], result: torch.dtype,
                 casts: list[Casts], checked: bool, scalars: bool) -> None:
        # Launch keywords, built once: the kernel takes them as they are (never mutated).
        self.meta = {**meta, "INT64": False}
        self.meta64 = {**meta, "INT64": True}
        self.result = result
        self.casts = casts
        self.checked = checked
        self.scalars = scalars  # some operand is a Python number


_PLANS: dict[tuple[Any, ...], _Plan | None] = {}
_DEVICE_OK: dict[torch.device, bool] = {}
"""Per device: whether the kernels run there (the vendor's device type)."""


def _plan(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None) -> _Plan | None:
    if any(r == "b" and not (isinstance(x, Tensor) and x.dtype == torch.bool)
           for x, r in zip(operands, op.roles, strict=True)):
        return None
    if any(isinstance(x, Tensor) and x.dtype not in TL_DTYPES for x in operands):
        return None
    try:
        common, compute, result = op_dtypes(op, operands, out, None)
    except Unsupported:
        return None  # the general path raises with the reason
    casts = [operand_casts(op, r, common, compute, not isinstance(x, Tensor))
             for x, r in zip(operands, op.roles, strict=True)]
    kinds = []
    for x, (via, to) in zip(operands, casts, strict=True):
        if isinstance(x, Tensor):
            kinds.append(LOAD)
        else:
            kinds.append(BITS64 if isinstance(x, float) and torch.float64 in (via, to) else VALUE)
    out_dtype = out.dtype if out is not None else result
    scalars = any(not isinstance(x, Tensor) for x in operands)
    return _Plan(_meta(op, kinds, casts, result, out_dtype), result, casts,
                 op.scalars == "checked", scalars)


def _output_with_unit_dims(first: Tensor, dtype: torch.dtype, scalars: bool) -> Tensor:
    """The output for a contiguous input with size-1 dims, which may carry any stride
    (``empty_like`` would copy a stride of 2**33): torch's layout. Tensors alone give the
    contiguous one; with a number, TensorIterator sorts the dims by the input's strides,
    size-1 dims included."""
    shape = first.shape
    layout = _permuted(shape, [first.stride()]) if scalars else None
    if layout is None:
        return torch.empty(shape, dtype=dtype, device=first.device)
    return torch.empty_strided(shape, layout, dtype=dtype, device=first.device)


def _device_ok(device: torch.device) -> bool:
    ok = _DEVICE_OK.get(device)
    if ok is None:
        ok = _DEVICE_OK[device] = device.type == device_type()
    return ok


def _run_fast(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None,
              rec: list[Launch] | None = None) -> Tensor | None:
    """Same-shape contiguous tensors (and numbers): functional, in place on self, or a fill.

    Returns None where the general path must decide. Everything that depends only on
    the op and the operand dtypes is cached in a :class:`_Plan`; per call this checks
    layout, shape, device and overlap, allocates the output and launches.
    """
    first: Tensor | None = None
    shape = device = None
    key: list[Any] = [op, None if out is None else out.dtype]
    for x in operands:
        if isinstance(x, Tensor):
            if x.layout is not torch.strided or not x.is_contiguous():
                return None
            if first is None:
                first = x
                shape = x.shape
                device = x.device
                if not shape:  # 0-dim: the general path decides how it promotes
                    return None
            elif x.shape != shape or x.device != device:
                return None
            key.append(x.dtype)
        else:
            kind = type(x)
            key.append(kind)
            if kind is float or kind is complex:
                # A Python float promotes to the default dtype: part of the plan's key.
                key.append(torch.get_default_dtype())
    if first is None:  # a fill: the output alone gives the layout
        if out is None or out.layout is not torch.strided or not out.is_contiguous():
            return None
        first = out
        device = out.device
    elif out is not None and out is not operands[0]:
        return None
    if not _device_ok(device):  # type: ignore[arg-type]
        return None
    k = tuple(key)
    plan: _Plan | None = _PLANS.get(k, _MISSING)
    if plan is _MISSING:
        plan = _PLANS[k] = _plan(op, operands, out)
    if plan is None:
        return None
    if plan.scalars:
        args: list[Any] = [None, None, None]
        for i, x in enumerate(operands):
            args[i] = x if isinstance(x, Tensor) else scalar_arg(x, *plan.casts[i],
                                                                 plan.checked)[0]
    else:
        args = [*operands, None, None][:3]
    if out is None:
        if 1 in shape and not op.keeps_strides:  # type: ignore[operator]
            out = _output_with_unit_dims(first, plan.result, bool(plan.scalars))
        else:
            # Contiguous without size-1 dims: the one contiguous layout. A copy (clone,
            # _to_copy) keeps the input's strides, as aten's empty_like does.
            out = torch.empty_like(first, dtype=plan.result)
    elif len(operands) > 1:
        optr = out.data_ptr()
        for x in operands:
            if isinstance(x, Tensor) and x is not out and x.data_ptr() != optr:
                (lo, hi), (xlo, xhi) = _span(out), _span(x)
                if xlo < hi and lo < xhi:
                    return None  # partial overlap: the general path refuses it
    n = out.numel()
    if n:
        launch_flat_planned(out, args, n, plan.meta64 if n >= 2**31 else plan.meta, rec)
    return out


_MISSING: Any = object()


# --- the plan memo -----------------------------------------------------------------


class _Recipe:
    """What :func:`run` did for one memo key: the output to allocate (or the given one,
    in place or ``out=``), and the one launch, with each operand's place in its
    arguments.

    ``slots``: per kernel operand (three), the index of the call's operand passed there,
    or -1 for the constant in ``consts`` (a converted number, or None). ``overlaps``:
    with a given output, its byte span, then per tensor operand (index, byte span,
    whether it has the output's shape and strides): run refuses an operand that partly
    overlaps the output, and the replay hands such a call back to it.
    """

    __slots__ = ("alloc", "consts", "grid", "ints", "kernel", "keywords", "op", "overlaps",
                 "prepared", "slots", "vendor")

    def __init__(self, op: PointwiseOp, alloc: tuple[Any, ...] | None,
                 launch: Launch | None, overlaps: tuple[Any, ...] | None,
                 vendor: Any) -> None:
        self.op = op
        self.vendor = vendor  # decisions depend on the vendor's device type
        self.alloc = alloc
        self.overlaps = overlaps
        self.prepared: Any = None
        self.kernel: Any = None
        self.grid: Any = None
        self.keywords: dict[str, Any] = {}
        self.ints: tuple[Any, ...] = ()
        self.slots = (-1, -1, -1)
        self.consts: tuple[Any, ...] = (None, None, None)
        if launch is not None:
            self.kernel, self.grid, call, self.keywords = launch
            slots, consts = [], []
            for i, value in enumerate(call[1:4]):
                # Kernel operand i is the call's operand i, or a constant made from it.
                slots.append(i if isinstance(value, Tensor) else -1)
                consts.append(None if isinstance(value, Tensor) else value)
            self.slots = (slots[0], slots[1], slots[2])
            self.consts = tuple(consts)
            self.ints = tuple(call[4:])

    def replay(self, operands: Sequence[Any], out: Tensor | None) -> Tensor | None:
        """The call again, for operands of the recipe's key; None: run must decide (an
        operand now partly overlaps the given output)."""
        alloc = self.alloc
        if alloc is None:
            assert out is not None
            overlaps = self.overlaps
            if overlaps is not None:
                lo = out.data_ptr()
                hi = lo + overlaps[0]
                for i, span, same in overlaps[1:]:
                    x = operands[i]
                    if x is not out:
                        p = x.data_ptr()
                        if p < hi and lo < p + span and not (p == lo and same):
                            return None
        elif alloc[1] is None:
            out = torch.empty(alloc[0], dtype=alloc[2], device=alloc[3])
        else:
            out = torch.empty_strided(alloc[0], alloc[1], dtype=alloc[2], device=alloc[3])
        kernel = self.kernel
        if kernel is None:
            return out
        s0, s1, s2 = self.slots
        c = self.consts
        call = (out, operands[s0] if s0 >= 0 else c[0], operands[s1] if s1 >= 0 else c[1],
                operands[s2] if s2 >= 0 else c[2], *self.ints)
        prepared = self.prepared
        if prepared is None or not prepared.fire(call):
            kernel.launch(self.grid, call, self.keywords)
            self.prepared = kernel.prepare(self.grid, call, self.keywords)
        return out


_MEMO: dict[tuple[Any, ...], _Recipe] = {}
_MEMO_SLOTS = 8192


def _tensor_key(x: Tensor, append: Callable[[Any], None]) -> bool:
    """Append what run reads of ``x``; False for a tensor the memo does not take."""
    if x.layout is not torch.strided:
        return False
    device = x.device
    shape = x.shape
    if not shape and device.type == "cpu":
        return False  # read with .item(): its value decides
    append(x.dtype)
    append(shape)
    append(x.stride())
    append(device)
    append(not x.data_ptr() & 15)
    return True


def _memo_key(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None,
              inplace: bool, common: torch.dtype | None) -> tuple[Any, ...] | None:
    """What run's decisions depend on, or None for a call the memo does not take (a
    0-dim CPU tensor, read as a number; a layout without strides)."""
    parts: list[Any] = [id(op), common, inplace]
    append = parts.append
    if out is not None:
        first = operands[0] if operands else None
        append(out is first)
        if out is not first and not _tensor_key(out, append):
            return None
    floats = False
    for x in operands:
        if isinstance(x, Tensor):
            if not _tensor_key(x, append):
                return None
        else:
            kind = type(x)
            append(kind)
            append(x)
            if kind is float or kind is complex:
                floats = True
    if floats:
        append(torch.get_default_dtype())
    return tuple(parts)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    step = 1
    for size in reversed(shape):
        out.append(step)
        step *= max(size, 1)
    return tuple(reversed(out))


def _extent(t: Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1) * (
        t.element_size())


def _remember(key: tuple[Any, ...], op: PointwiseOp, operands: Sequence[Any],
              out: Tensor, given: tuple[Any, ...] | None, rec: list[Launch]) -> None:
    """Keep what run just did for ``key``, when it was one launch (or none for an empty
    output) over the call's own operands; ``given``: a given output's shape and strides
    before the call (None: run made the output)."""
    if len(rec) > 1 or (not rec and out.numel()):
        return  # several launches, or a copy first (too many dims): not a recipe
    launch = rec[0] if rec else None
    if launch is not None:
        call = launch[2]
        if call[0] is not out:
            return
        for i, value in enumerate(call[1:4]):
            if isinstance(value, Tensor) and not (i < len(operands) and value is operands[i]):
                return  # a tensor made for this call (an expanded copy)
        if any(isinstance(value, Tensor) for value in call[4:]):
            return
    alloc = None
    overlaps: tuple[Any, ...] | None = None
    if given is None:
        # (is_contiguous holds for any strides of an empty tensor: compare them)
        strides = tuple(out.stride())
        layout = None if strides == _contiguous_strides(out.shape) else strides
        alloc = (tuple(out.shape), layout, out.dtype, out.device)
    else:
        if given != (tuple(out.shape), tuple(out.stride())):
            return  # run resized the output: a later call would not
        view = given
        overlaps = (_extent(out), *(
            (i, _extent(x), (tuple(x.shape), tuple(x.stride())) == view)
            for i, x in enumerate(operands) if isinstance(x, Tensor)))
    if len(_MEMO) >= _MEMO_SLOTS:
        _MEMO.clear()
    _MEMO[key] = _Recipe(op, alloc, launch, overlaps, current_vendor())
    witness.note()


def clear_memo() -> None:
    """Forget every kept plan (tests; a changed default dtype needs nothing: it is keyed)."""
    _MEMO.clear()


def run(op: PointwiseOp, operands: Sequence[Tensor | Number | None], *,
        out: Tensor | None = None, inplace: bool = False,
        common: torch.dtype | None = None) -> Tensor:
    """Compute ``op`` elementwise over ``operands`` (broadcast), into ``out`` or a new tensor.

    Args:
        op: The op.
        operands: One per role of ``op``; trailing ones may be None (absent).
        out: An ``out=`` tensor (resized when its shape differs), or with ``inplace``
            the tensor operated on (its shape must be the broadcast shape).
        inplace: ``out`` is an in-place ``self``.
        common: The common dtype, when the caller promoted operands it does not pass
            (``pow(x, 2)`` runs ``x * x`` with the dtype of ``x`` and ``2``).

    Returns:
        The output tensor.

    Raises:
        Unsupported: an input the kernels do not handle, or one torch rejects (torch's
            own kernel then raises its error); raised before any output is touched.
    """
    operands = list(operands)
    while operands and operands[-1] is None:
        operands.pop()
    if len(operands) != len(op.roles):
        raise Unsupported(f"{op.name} needs {len(op.roles)} operands, got {len(operands)}")
    key = _memo_key(op, operands, out, inplace, common)
    if key is None:
        return _decide(op, operands, out, inplace, common, None)
    recipe = _MEMO.get(key)
    if recipe is not None and recipe.op is op and recipe.vendor is current_vendor():
        done = recipe.replay(operands, out)
        if done is not None:
            witness.note()
            return done
    rec: list[Launch] = []
    given = None if out is None else (tuple(out.shape), tuple(out.stride()))
    result = _decide(op, operands, out, inplace, common, rec)
    _remember(key, op, operands, result, given, rec)
    return result


def _decide(op: PointwiseOp, operands: list[Any], out: Tensor | None, inplace: bool,
            common: torch.dtype | None, rec: list[Launch] | None) -> Tensor:
    """run's decisions, made afresh (``rec`` receives the launch, for the memo)."""
    if common is None and (out is None or inplace):
        done = _run_fast(op, operands, out, rec)
        if done is not None:
            return done
    tensors = [x for x in operands if isinstance(x, Tensor)]
    device = out.device if out is not None else None
    if device is None:
        device = next((t.device for t in tensors if t.dim() or t.device.type != "cpu"), None)
        device = device or (tensors[0].device if tensors else torch.device("cpu"))
    if device.type != device_type():
        raise Unsupported(f"a tensor on {device}; the kernels run on {device_type()}")
    for t in (*tensors, *(() if out is None else (out,))):
        if t.layout != torch.strided:
            raise Unsupported(f"layout {t.layout}")
        if t.dtype not in TL_DTYPES:
            raise Unsupported(f"dtype {t.dtype}")
        if t.device != device and (t.dim() or t.device.type != "cpu"):
            raise Unsupported(f"tensors on {t.device} and {device}")
    common, compute, result = op_dtypes(op, operands, out, common)

    # In place (a fill too), the output's shape is one of the broadcast shapes.
    shapes = [t.shape for t in tensors] + ([out.shape] if inplace and out is not None else [])
    shape = tuple(shapes[0]) if shapes else ()
    if any(s != shape for s in shapes):
        shape = broadcast_shape(shapes)
    if out is not None:
        if inplace and tuple(out.shape) != shape:
            raise Unsupported(f"in-place output of shape {tuple(out.shape)}, broadcast {shape}")
        _check_out(out, tensors)

    args: list[Any] = []
    kinds: list[int] = []
    casts: list[Casts] = []
    full: list[Tensor] = []
    for x, role in zip(operands, op.roles, strict=True):
        if role == "b" and not (isinstance(x, Tensor) and x.dtype == torch.bool):
            raise Unsupported(f"{op.name} takes a bool mask")
        checked = op.scalars == "checked"  # a Python number, not a tensor's value
        if isinstance(x, Tensor) and x.dim() == 0 and x.device.type == "cpu":
            x = x.item()  # a CPU scalar, as torch's kernels take it (is_cpu_scalar)
            checked = False
        cast = operand_casts(op, role, common, compute, not isinstance(x, Tensor))
        if isinstance(x, Tensor):
            kinds.append(LOAD if x.numel() > 1 else SINGLE)
            if x.numel() > 1:
                full.append(x)
            args.append(x)
        else:
            assert x is not None  # only trailing operands may be None, and run popped them
            value, kind = scalar_arg(x, *cast, checked)
            args.append(value)
            kinds.append(kind)
        casts.append(cast)

    # The output: flat when every full operand has its shape and one dense layout.
    strides = full[0].stride() if full else None
    flat = all(tuple(t.shape) == shape and t.stride() == strides for t in full)
    if flat and full and not full[0].is_contiguous():
        flat = _dense(shape, strides)  # type: ignore[arg-type]
    if out is None:
        # torch's layout: the first input's memory order when the inputs' layouts differ.
        out = _new_output(shape, tensors, result, device)
        if full:
            flat = flat and _same_walk(shape, out.stride(), strides)  # type: ignore[arg-type]
        else:
            flat = out.is_contiguous() or _dense(shape, out.stride())
    else:
        if tuple(out.shape) != shape:
            resize_output(out, shape, tensors)
        if not full:
            flat = out.is_contiguous() or _dense(shape, out.stride())
        else:
            flat = flat and out.stride() == strides
    if out.numel() == 0:
        return out
    while len(args) < 3:
        args.append(None)
    meta = _meta(op, kinds, casts, result, out.dtype)
    if flat:
        launch_flat(out, args, meta, rec)
    else:
        launch_strided(out, args, [*kinds, VALUE, VALUE][:3], shape, meta, rec)
    return out


def own_dtype_out(name: str, want: torch.dtype, out: Tensor | None, inplace: bool) -> None:
    """Hand back an ``out=`` (not an in-place ``self``) of a dtype other than ``want``:
    torch's kernels of some ops (neg, abs, sign, floor, the rounding family, heaviside)
    write only that dtype and raise on any other, where the rest cast the result."""
    if out is not None and not inplace and out.dtype != want:
        raise Unsupported(f"{name} writes only a {want} out=, not {out.dtype} (torch raises)")


def unary_function(record: PointwiseOp, doc: str, *,
                   same_dtype_out: bool = False) -> Callable[..., Tensor]:
    """The public function of a one-operand op: ``fn(self, *, out=None, inplace=False)``,
    named after ``record`` and documented by ``doc`` (declare it with
    :func:`gemsops.declare.op`).

    With ``same_dtype_out``, an ``out=`` of a dtype other than ``self``'s is handed back
    (torch's kernels of neg, abs, sign and floor write only their input's own dtype and
    raise on any other, where the rest cast the result into ``out``).
    """

    def fn(self: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
        if same_dtype_out:
            own_dtype_out(record.name, self.dtype, out, inplace)
        return run(record, (self,), out=out, inplace=inplace)

    fn.__name__ = fn.__qualname__ = record.name
    fn.__doc__ = doc
    return fn


def binary_function(record: PointwiseOp, doc: str) -> Callable[..., Tensor]:
    """The public function of a two-operand op: ``fn(self, other, *, out=None,
    inplace=False)``, ``other`` a tensor or a Python scalar."""

    def fn(self: Tensor, other: Tensor | Number, *, out: Tensor | None = None,
           inplace: bool = False) -> Tensor:
        return run(record, (self, other), out=out, inplace=inplace)

    fn.__name__ = fn.__qualname__ = record.name
    fn.__doc__ = doc
    return fn
