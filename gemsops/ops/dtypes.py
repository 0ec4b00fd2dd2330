"""The dtype facts every op family shares: which dtypes exist for the kernels, what they
accumulate in, their Triton names, and whether the device computes in them.

One table each, asked the same way by every family; the device side of the question
("does this backend have float64?") is gemshal's
:meth:`~gemshal.Capabilities.supports`.
"""

from __future__ import annotations

import torch
import triton.language as tl

import gemshal
from gemsops.errors import Unsupported

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "TL_DTYPES",
    "Number",
    "acc_dtype",
    "check_supported",
    "tl_acc",
    "tl_dtype",
]

Number = bool | int | float
"""A Python number as aten's ``Scalar`` arguments arrive."""

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32,
                                         torch.float64)
"""The floating dtypes the kernels compute on, narrowest first."""

INT_DTYPES: tuple[torch.dtype, ...] = (torch.int8, torch.uint8, torch.int16, torch.int32,
                                       torch.int64)
"""The integer dtypes the kernels compute on (bool is handled by each family)."""

TL_DTYPES: dict[torch.dtype, tl.dtype] = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.float64: tl.float64,
    torch.int8: tl.int8,
    torch.uint8: tl.uint8,
    torch.int16: tl.int16,
    torch.int32: tl.int32,
    torch.int64: tl.int64,
    torch.bool: tl.int1,
}
"""torch dtype -> Triton dtype."""


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """The Triton dtype of ``dtype`` (bool is ``int1``)."""
    return TL_DTYPES[dtype]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulator of a sum, product, scan, norm or loss over ``dtype``, as torch's.

    float64 stays float64, other floating types accumulate in float32, integers and bool
    in int64.
    """
    if dtype == torch.float64:
        return torch.float64
    if dtype.is_floating_point:
        return torch.float32
    return torch.int64


def tl_acc(dtype: torch.dtype) -> tl.dtype:
    """:func:`acc_dtype` as a Triton dtype."""
    return TL_DTYPES[acc_dtype(dtype)]


_REFUSALS: dict[tuple[object, torch.dtype], str | None] = {}


def check_supported(dtype: torch.dtype) -> None:
    """Raise :class:`~gemsops.errors.Unsupported` if the device cannot compute in ``dtype``
    (float64 without fp64, bfloat16 without bf16, ...), naming the reason.

    The answer is kept per (vendor, dtype): ops ask on every call.
    """
    vendor = gemshal.current_vendor()
    try:
        reason = _REFUSALS[vendor, dtype]
    except KeyError:
        reason = _REFUSALS[vendor, dtype] = vendor.capabilities.refusal(dtype)
    if reason is not None:
        raise Unsupported(reason)
