"""What torch's TensorIterator does on the host, for the pointwise generator.

An op is data (:class:`PointwiseOp`). :func:`run` promotes dtypes, broadcasts, turns
Python numbers and 0-dim CPU tensors into kernel scalars, checks and allocates the
output, and hands :mod:`gemsops.ops.pointwise_codegen` a flat or a strided launch.
Everything a kernel cannot do as torch would is refused with
:class:`~gemsops.errors.Unsupported` before the output is touched.

The common call (same-shape contiguous tensors, no ``out=``) takes a fast path whose
dtype decisions are cached per (op, operand dtypes).
"""

from __future__ import annotations

import enum
import functools
import math
import struct
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.pointwise_codegen import (
    BITS64,
    LOAD,
    SINGLE,
    TL_DTYPES,
    VALUE,
    launch_flat,
    launch_strided,
)

__all__ = ["ALL_DTYPES", "FLOAT_DTYPES", "PointwiseOp", "Promotion", "broadcast_shape",
           "has_fp64", "overflows", "result_type", "run"]

Number = bool | int | float
ALL_DTYPES = frozenset(TL_DTYPES)
FLOAT_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


class Promotion(enum.Enum):
    """How an op's result dtype follows from its operands (torch's promotion kinds)."""

    DEFAULT = "default"  # the common dtype
    INT_TO_FLOAT = "int_to_float"  # integer and bool results become the default float
    ALWAYS_BOOL = "always_bool"  # comparisons and logic
    FIRST = "first"  # operand 0's dtype (masked_fill, threshold)
    OUTPUT = "output"  # the output's dtype (fill_)


@attrs.frozen(cache_hash=True)  # a key of the fast path's plan cache
class PointwiseOp:
    """One pointwise op as data.

    Attributes:
        name: The op's name, for messages.
        body: The ``@triton.jit`` element function; it takes one value per role.
        roles: One letter per operand. ``p``: takes part in type promotion; ``a``: a
            scalar parameter converted straight to the compute dtype (alpha); ``v``:
            a value converted to the common dtype first (a fill value); ``b``: a bool
            mask, passed through.
        promotion: How the result dtype is found.
        dtypes: The common dtypes torch accepts for the op.
        scalars: How a scalar operand is converted, as torch's kernel for the op does:
            ``"compute"``, straight to the compute dtype (arithmetic: ``x_fp16 * 0.1``
            multiplies by float32 0.1); ``"common"``, to the common dtype first
            (comparisons, pow); ``"checked"``, to the common dtype refusing values out of
            its range, as ``Scalar.to<T>()`` (clamp, fill values).
    """

    name: str
    body: Any
    roles: str
    promotion: Promotion = Promotion.DEFAULT
    dtypes: frozenset[torch.dtype] = ALL_DTYPES
    scalars: str = "compute"


# --- dtypes -----------------------------------------------------------------------


def _scalar_dtype(value: Number) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.get_default_dtype()


@functools.cache
def _probe(dtype: torch.dtype) -> Tensor:
    return torch.empty((), dtype=dtype)


def _is_wrapped(t: Tensor) -> bool:
    """Whether a 0-dim CPU tensor is a wrapped Python number (which promotes more weakly).

    Python cannot read the flag, but torch.result_type can: a wrapped float next to a
    0-dim int32 gives the default float dtype, a real float64 tensor gives float64.
    """
    if t.dtype == torch.float64:
        return torch.result_type(_probe(torch.int32), t) != torch.float64
    if t.dtype == torch.int64:
        return torch.result_type(_probe(torch.int8), t) == torch.int8
    return False


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    # torch's combine_categories: a lower-priority operand only counts across categories.
    if higher is None:
        return lower
    if lower is None or higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def _promote(acc: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    return dtype if acc is None else torch.promote_types(acc, dtype)


def result_type(values: Sequence[Tensor | Number]) -> torch.dtype:
    """torch's result type of tensors and Python numbers (any count, unlike torch.result_type)."""
    if len(values) == 1:
        (v,) = values
        return v.dtype if isinstance(v, Tensor) else _scalar_dtype(v)
    if len(values) == 2:
        a, b = values
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype:
            return a.dtype
        return torch.result_type(a, b)  # type: ignore[arg-type]
    dim = zero = wrapped = None
    for v in values:
        if not isinstance(v, Tensor):
            wrapped = _promote(wrapped, _scalar_dtype(v))
        elif v.dim() > 0:
            dim = _promote(dim, v.dtype)
        elif v.device.type == "cpu" and _is_wrapped(v):
            wrapped = _promote(wrapped, _scalar_dtype(v.item()))
        else:
            zero = _promote(zero, v.dtype)
    found = _combine(dim, _combine(zero, wrapped))
    assert found is not None
    return found


@functools.cache
def has_fp64() -> bool:
    """Whether the device's Triton backend handles float64."""
    return bool(gemshal.current_device().vendor.capabilities.fp64)


def _dtypes(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None,
            common: torch.dtype | None) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(common dtype operands are cast to, compute dtype, result dtype), checked.

    Half types compute in float32 for every kind; bool computes in int32 (``True + True``
    is ``True`` after the cast back).
    """
    if common is None:
        if op.promotion is Promotion.FIRST:
            common = operands[0].dtype
        elif op.promotion is Promotion.OUTPUT:
            if out is None:
                raise Unsupported(f"{op.name} needs an output tensor")
            common = out.dtype
        else:
            promoted = [x for x, r in zip(operands, op.roles, strict=True)
                        if r == "p" and x is not None]
            common = result_type(promoted)
    if common not in op.dtypes:
        raise Unsupported(f"{op.name} does not take {common}")
    if op.promotion is Promotion.INT_TO_FLOAT and not common.is_floating_point:
        common = torch.get_default_dtype()
    if common in (torch.float16, torch.bfloat16):
        compute = torch.float32
    elif common == torch.bool:
        compute = torch.int32
    else:
        compute = common
    result = torch.bool if op.promotion is Promotion.ALWAYS_BOOL else common
    if out is not None and not torch.can_cast(result, out.dtype):
        raise Unsupported(f"a {result} result cannot be cast to a {out.dtype} output")
    if not has_fp64() and (
        common == torch.float64
        or any(isinstance(x, Tensor) and x.dtype == torch.float64 for x in operands)
        or (out is not None and out.dtype == torch.float64)
    ):
        raise Unsupported("float64 on a device without fp64")
    return common, compute, result


# --- scalars ----------------------------------------------------------------------


def overflows(value: Number, dtype: torch.dtype) -> bool:
    """c10's ``overflows<T>(value)``, which torch's checked ``Scalar.to<T>()`` raises on."""
    if dtype == torch.bool or isinstance(value, bool):
        return False
    if dtype.is_floating_point:
        return math.isfinite(value) and abs(value) > torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    if isinstance(value, float):
        return not info.min <= value <= info.max  # nan and inf too
    if info.min == 0 and value < 0:
        return -value > info.max  # unsigned types take negatives that wrap (uint8: -255..)
    return not info.min <= value <= info.max


def _scalar(value: Number, via: torch.dtype | None, to: torch.dtype | None,
            checked: bool) -> tuple[Any, int]:
    """A Python number as a kernel argument, and its kind."""
    if checked and via is not None and overflows(value, via):
        raise Unsupported(f"{value} overflows {via}")  # torch raises
    if via == torch.bool:
        value = bool(value)  # nan and inf are true, as in C
    elif via is not None and not via.is_floating_point and isinstance(value, float):
        if not math.isfinite(value):
            raise Unsupported(f"{value} cannot be converted to {via}")
        value = int(value)  # C casts truncate
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise Unsupported(f"{value} does not fit in int64")
    if isinstance(value, float) and torch.float64 in (via, to):
        return struct.unpack("<q", struct.pack("<d", value))[0], BITS64
    if isinstance(value, float) and to is not None and not to.is_floating_point:
        raise Unsupported(f"a float scalar cannot take part in a {to} computation")
    return value, VALUE


def _casts(op: PointwiseOp, role: str, common: torch.dtype, compute: torch.dtype,
           scalar: bool) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(cast to the common dtype, cast to the compute dtype) for one operand; None: none."""
    if role == "b":
        return None, None
    if role == "a" or (scalar and role == "p" and op.scalars == "compute"):
        return None, compute
    return common, compute


def _tl(dtype: torch.dtype | None) -> Any:
    return None if dtype is None else TL_DTYPES[dtype]


def _meta(op: PointwiseOp, kinds: Sequence[int], casts: Sequence[tuple[Any, Any]],
          result: torch.dtype, out_dtype: torch.dtype) -> dict[str, Any]:
    kinds = [*kinds, VALUE, VALUE, VALUE][:3]
    casts = [*casts, (None, None), (None, None)][:3]
    return {
        "OP": op.body, "NARGS": len(op.roles),
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


# --- run --------------------------------------------------------------------------


class _Plan:
    """The cached decisions of the fast path for one (op, operand dtypes) key."""

    __slots__ = ("casts", "checked", "meta", "result")

    def __init__(self, meta: dict[str, Any], result: torch.dtype,
                 casts: list[tuple[Any, Any]], checked: bool) -> None:
        self.meta = meta
        self.result = result
        self.casts = casts
        self.checked = checked


_PLANS: dict[tuple[Any, ...], _Plan | None] = {}


def _plan(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None) -> _Plan | None:
    try:
        common, compute, result = _dtypes(op, operands, out, None)
    except Unsupported:
        return None  # the general path raises with the reason
    casts = [_casts(op, r, common, compute, not isinstance(x, Tensor))
             for x, r in zip(operands, op.roles, strict=True)]
    kinds = []
    for x, (via, to) in zip(operands, casts, strict=True):
        if isinstance(x, Tensor):
            kinds.append(LOAD)
        else:
            kinds.append(BITS64 if isinstance(x, float) and torch.float64 in (via, to) else VALUE)
    out_dtype = out.dtype if out is not None else result
    return _Plan(_meta(op, kinds, casts, result, out_dtype), result, casts,
                 op.scalars == "checked")


def _run_fast(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None) -> Tensor | None:
    """Same-shape contiguous device tensors (and numbers), functional or in place on self.

    Returns None where the general path must decide.
    """
    first: Tensor | None = None
    key: list[Any] = [op, None if out is None else out.dtype]
    for x in operands:
        if isinstance(x, Tensor):
            if x.layout is not torch.strided or not x.is_contiguous():
                return None
            if first is None:
                first = x
                if x.dim() == 0:
                    return None
            elif x.shape != first.shape or x.get_device() != first.get_device():
                return None
            key.append(x.dtype)
        else:
            key.append(type(x))
    if first is None or (out is not None and out is not operands[0]):
        return None
    k = tuple(key)
    plan = _PLANS.get(k, _MISSING)
    if plan is _MISSING:
        plan = _PLANS[k] = _plan(op, operands, out)
    if plan is None:
        return None
    args: list[Any] = [None, None, None]
    for i, x in enumerate(operands):
        if isinstance(x, Tensor):
            args[i] = x
            if out is not None and x is not out and x.data_ptr() != out.data_ptr():
                (lo, hi), (xlo, xhi) = _span(out), _span(x)
                if xlo < hi and lo < xhi:
                    return None  # partial overlap: the general path refuses it
        else:
            args[i] = _scalar(x, *plan.casts[i], plan.checked)[0]
    if out is None:
        out = torch.empty_like(first, dtype=plan.result)
    if out.numel():
        launch_flat(out, args, plan.meta)
    return out


_MISSING: Any = object()


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
    if common is None and (out is None or inplace):
        done = _run_fast(op, operands, out)
        if done is not None:
            return done
    tensors = [x for x in operands if isinstance(x, Tensor)]
    device = out.device if out is not None else None
    if device is None:
        device = next((t.device for t in tensors if t.dim() or t.device.type != "cpu"), None)
        device = device or (tensors[0].device if tensors else torch.device("cpu"))
    for t in (*tensors, *(() if out is None else (out,))):
        if t.layout != torch.strided:
            raise Unsupported(f"layout {t.layout}")
        if t.dtype not in TL_DTYPES:
            raise Unsupported(f"dtype {t.dtype}")
        if t.device != device and (t.dim() or t.device.type != "cpu"):
            raise Unsupported(f"tensors on {t.device} and {device}")
    common, compute, result = _dtypes(op, operands, out, common)

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
    casts: list[tuple[Any, Any]] = []
    full: list[Tensor] = []
    for x, role in zip(operands, op.roles, strict=True):
        if role == "b" and not (isinstance(x, Tensor) and x.dtype == torch.bool):
            raise Unsupported(f"{op.name} takes a bool mask")
        checked = op.scalars == "checked"  # a Python number, not a tensor's value
        if isinstance(x, Tensor) and x.dim() == 0 and x.device.type == "cpu":
            x = x.item()  # a CPU scalar, as torch's kernels take it (is_cpu_scalar)
            checked = False
        cast = _casts(op, role, common, compute, not isinstance(x, Tensor))
        if isinstance(x, Tensor):
            kinds.append(LOAD if x.numel() > 1 else SINGLE)
            if x.numel() > 1:
                full.append(x)
            args.append(x)
        else:
            value, kind = _scalar(x, *cast, checked)
            args.append(value)
            kinds.append(kind)
        casts.append(cast)

    # The output: flat when every full operand has its shape and one dense layout.
    strides = full[0].stride() if full else None
    flat = all(tuple(t.shape) == shape and t.stride() == strides for t in full)
    if flat and full and not full[0].is_contiguous():
        flat = _dense(shape, strides)  # type: ignore[arg-type]
    if out is None:
        if flat and full and not full[0].is_contiguous():
            out = torch.empty_strided(shape, strides, dtype=result, device=device)  # type: ignore[arg-type]
        else:
            out = torch.empty(shape, dtype=result, device=device)
    else:
        if tuple(out.shape) != shape:
            out.resize_(shape)
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
        launch_flat(out, args, meta)
    else:
        launch_strided(out, args, [*kinds, VALUE, VALUE][:3], shape, meta)
    return out
