"""Filling tensors: ``fill_``, ``zero_``, and the factories built on them.

aten's ``zeros``, ``ones``, ``full`` (and their ``_like`` forms) are
CompositeExplicitAutograd: they allocate with ``empty`` and call ``zero_`` or
``fill_``, which are the overloads that reach a backend kernel, so those two are what
gemsops serves (:func:`fill_` and :func:`zero_` are declared for them). The fill is the
pointwise generator's flat kernel with the value as a scalar argument (or, for a 0-dim
device tensor, loaded once), converted to the tensor's dtype the way torch converts it
(``int(2.7)`` for integers, ``!= 0`` for bool). Strided tensors (``x[:, ::2].fill_(1)``)
take the strided kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import Number
from gemsops.ops.pointwise.arith import FILL
from gemsops.ops.pointwise.iterator import run

__all__ = ["fill_", "full", "ones", "zero_", "zeros"]


@op("fill_.Scalar", "fill_.Tensor")
def fill_(self: Tensor, value: Tensor | Number) -> Tensor:
    """Set every element of ``self`` to ``value`` (a number or a 0-dim tensor); returns self."""
    if isinstance(value, Tensor) and value.dim() != 0:
        raise Unsupported(f"fill_ takes a 0-dim value, got {value.dim()} dims")  # torch raises
    if isinstance(value, Tensor) and _may_overflow(value.dtype, self.dtype):
        v = value.item()
        if math.isfinite(v) and abs(v) > torch.finfo(self.dtype).max:
            # torch's own kernels differ here (CUDA refuses, the CPU gives inf): theirs decides.
            raise Unsupported(f"fill_ value {v} overflows {self.dtype}")
    return run(FILL, (value,), out=self, inplace=True)


def _may_overflow(source: torch.dtype, target: torch.dtype) -> bool:
    return (
        source.is_floating_point
        and target.is_floating_point
        and torch.finfo(source).max > torch.finfo(target).max
    )


@op("zero_.default")
def zero_(self: Tensor) -> Tensor:
    """Set every element of ``self`` to zero; returns self."""
    return run(FILL, (0,), out=self, inplace=True)


@op()
def full(
    size: Sequence[int],
    fill_value: Number,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """A new tensor of ``size`` filled with ``fill_value``.

    Without ``dtype``, the dtype follows the value as in torch: bool, int64, or the
    default float dtype.
    """
    if dtype is None:
        if isinstance(fill_value, bool):
            dtype = torch.bool
        elif isinstance(fill_value, int):
            dtype = torch.int64
        else:
            dtype = torch.get_default_dtype()
    return fill_(torch.empty(tuple(size), dtype=dtype, device=device), fill_value)


@op()
def zeros(
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """A new tensor of zeros (default float dtype unless ``dtype`` is given)."""
    return zero_(torch.empty(tuple(size), dtype=dtype, device=device))


@op()
def ones(
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """A new tensor of ones (default float dtype unless ``dtype`` is given)."""
    return fill_(torch.empty(tuple(size), dtype=dtype, device=device), 1)

