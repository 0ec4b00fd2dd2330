"""The pointwise family's op records and torch's type rules for them.

:class:`PointwiseOp` describes an op as data. The functions here decide dtypes the way
torch's TensorIterator and ``c10`` do: the result type of any number of operands (with
the weaker promotion of 0-dim tensors and Python numbers), the compute dtype ("opmath":
float32 for half types), the kernel argument a Python number becomes, and the checked
conversion (``Scalar.to<T>()``) some ops apply to their scalars.
"""

from __future__ import annotations

import enum
import functools
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import TL_DTYPES, Number, check_supported
from gemsops.ops.pointwise.codegen import BITS64, VALUE
from gemsops.promotion import combine, promote

__all__ = [
    "ALL_DTYPES",
    "NO_BOOL",
    "PointwiseOp",
    "Promotion",
    "casts",
    "device_type",
    "holds_large",
    "op_dtypes",
    "overflows",
    "result_type",
    "scalar_arg",
]

ALL_DTYPES: frozenset[torch.dtype] = frozenset(TL_DTYPES)
"""Every dtype the kernels take (those :data:`gemsops.ops.dtypes.TL_DTYPES` names)."""
NO_BOOL: frozenset[torch.dtype] = ALL_DTYPES - {torch.bool}
"""The kernels' dtypes but bool (ops torch refuses bool for: sub, neg, clamp...)."""


class Promotion(enum.Enum):
    """How an op's result dtype follows from its operands (torch's promotion kinds)."""

    DEFAULT = "default"  # the common dtype
    INT_TO_FLOAT = "int_to_float"  # integer and bool results become the default float
    ALWAYS_BOOL = "always_bool"  # comparisons and logic
    FIRST = "first"  # operand 0's dtype (masked_fill, threshold)
    OUTPUT = "output"  # the output's dtype (fill_)


def _dtype_set(dtypes: Iterable[torch.dtype]) -> frozenset[torch.dtype]:
    return frozenset(dtypes)


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
        dtypes: The common dtypes torch accepts for the op (any collection of them,
            e.g. :data:`gemsops.ops.dtypes.FLOAT_DTYPES`; kept as a frozenset).
        scalars: How a scalar operand is converted, as torch's kernel for the op does:
            ``"compute"``, straight to the compute dtype (arithmetic: ``x_fp16 * 0.1``
            multiplies by float32 0.1); ``"common"``, to the common dtype first
            (comparisons, pow); ``"checked"``, to the common dtype refusing values out of
            its range, as ``Scalar.to<T>()`` (clamp, fill values).
        half_body: A cheaper element function for float16 and bfloat16 results, whose
            error stays far below half an ulp of those types; None: ``body`` always.
        keeps_strides: The result takes its input's strides, size-1 dims included, as
            aten's ``empty_like`` gives them (a copy: clone, ``_to_copy``); otherwise
            TensorIterator's layout.
    """

    name: str
    body: Any
    roles: str
    promotion: Promotion = Promotion.DEFAULT
    dtypes: frozenset[torch.dtype] = attrs.field(default=ALL_DTYPES, converter=_dtype_set)
    scalars: str = "compute"
    half_body: Any = None
    keeps_strides: bool = False


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


def result_type(values: Sequence[Tensor | Number]) -> torch.dtype:
    """torch's result type of tensors and Python numbers (any count, unlike torch.result_type)."""
    if len(values) == 1:
        (v,) = values
        return v.dtype if isinstance(v, Tensor) else _scalar_dtype(v)
    if len(values) == 2:
        a, b = values
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype:
            return a.dtype
        return torch.result_type(a, b)
    dim = zero = wrapped = None
    for v in values:
        if not isinstance(v, Tensor):
            wrapped = promote(wrapped, _scalar_dtype(v))
        elif v.dim() > 0:
            dim = promote(dim, v.dtype)
        elif v.device.type == "cpu" and _is_wrapped(v):
            wrapped = promote(wrapped, _scalar_dtype(v.item()))
        else:
            zero = promote(zero, v.dtype)
    found = combine(dim, combine(zero, wrapped))
    assert found is not None
    return found


@functools.cache
def device_type() -> str:
    """The torch device type the kernels run on (``"cpu"`` under the interpreter)."""
    return gemshal.current_vendor().device_type


def op_dtypes(op: PointwiseOp, operands: Sequence[Any], out: Tensor | None,
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
    # The device computes in every dtype involved (gemshal's capabilities: float64
    # without fp64 is handed to torch).
    check_supported(common)
    for x in operands:
        if isinstance(x, Tensor) and x.dtype != common:
            check_supported(x.dtype)
    if out is not None and out.dtype != common:
        check_supported(out.dtype)
    return common, compute, result


def holds_large(x: Tensor, limit: float) -> bool:
    """Whether a CPU floating tensor holds an infinity or a finite value of magnitude >= limit.

    nan does not count. Read through numpy (no torch op, so no re-entry into gemsops);
    bfloat16 through its bits, with ``limit`` rounded down (a few more values count).
    """
    import numpy as np

    t = x.detach()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view(np.uint16) & 0x7FFF
        low = int(np.array(limit, dtype=np.float32).view(np.uint32)) >> 16
        return bool(((bits >= low) & (bits <= 0x7F80)).any())
    if limit > torch.finfo(t.dtype).max:
        limit = math.inf  # only the infinities
    return bool((np.abs(t.numpy()) >= limit).any())


# --- scalars ----------------------------------------------------------------------


def overflows(value: Number, dtype: torch.dtype) -> bool:
    """c10's ``overflows<T>(value)``, which torch's checked ``Scalar.to<T>()`` raises on."""
    if dtype == torch.bool or isinstance(value, bool):
        return False
    if dtype.is_complex:
        return math.isfinite(abs(value)) and abs(value) > torch.finfo(dtype).max
    if dtype.is_floating_point:
        return math.isfinite(value) and abs(value) > torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    if isinstance(value, float):
        return not info.min <= value <= info.max  # nan and inf too
    if info.min == 0 and value < 0:
        return -value > info.max  # unsigned types take negatives that wrap (uint8: -255..)
    return not info.min <= value <= info.max


def scalar_arg(value: Number, via: torch.dtype | None, to: torch.dtype | None,
               checked: bool) -> tuple[Any, int]:
    """A Python number as a kernel argument, and its kind (VALUE, or BITS64 for float64).

    ``via``/``to``: the casts the kernel applies (see :func:`casts`); ``checked``: refuse
    values out of ``via``'s range, as torch's checked conversion does.
    """
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


def casts(op: PointwiseOp, role: str, common: torch.dtype, compute: torch.dtype,
          scalar: bool) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(cast to the common dtype, cast to the compute dtype) for one operand; None: none."""
    if role == "b":
        return None, None
    if role == "a" or (scalar and role == "p" and op.scalars == "compute"):
        return None, compute
    return common, compute
