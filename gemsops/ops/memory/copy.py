"""Copies: ``clone`` and ``cat``, on the pointwise generator's identity op.

Both are memory copies, so neither has a kernel of its own: each is the pointwise
``COPY`` op (:data:`gemsops.ops.pointwise.arith.COPY`, the identity element function)
run by :func:`gemsops.ops.pointwise.iterator.run` into a strided output. That gives
the flat kernel (one vectorised sweep) where input and output share a dense layout,
the strided kernel otherwise, and torch's dtype conversions for free.

* ``clone`` allocates exactly as aten's does (``empty_like(self, memory_format)``), so
  the result's strides are torch's, then copies into it.
* ``cat`` allocates the result in torch's memory format (channels-last when every input
  suggests it) and dtype (the promotion of every input's dtype), then copies each input
  into its slice of the output (``out.narrow(dim, offset, size)``), one launch per
  non-empty input. 1-D tensors of shape ``(0,)`` are skipped, as torch's legacy rule
  does (they take part in the dtype and memory format all the same).

Everything torch would refuse, and what the kernels do not take (complex and other
dtypes, non-strided layouts, mixed devices, channels-last ``clone``), is refused with
:class:`~gemsops.errors.Unsupported` before anything is written.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import TL_DTYPES, check_supported
from gemsops.ops.pointwise.arith import COPY
from gemsops.ops.pointwise.iterator import run
from gemsops.ops.pointwise.types import device_type

__all__ = ["cat", "clone"]

# The formats the copy keeps exactly as torch allocates them; channels-last clones are
# left to torch (a real model's backward never asks for one).
_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _check_input(t: Tensor, what: str) -> None:
    """Refuse a tensor the copy kernels cannot read as torch would."""
    if t.layout is not torch.strided:
        raise Unsupported(f"{what}: layout {t.layout}")
    if t.dtype not in TL_DTYPES:
        raise Unsupported(f"{what}: dtype {t.dtype}")
    check_supported(t.dtype)
    if t.is_neg() or t.is_conj():
        raise Unsupported(f"{what}: a lazily negated or conjugated view")
    if t.device.type != device_type():
        raise Unsupported(f"{what} on {t.device}; the kernels run on {device_type()}")


@op("clone.default")
def clone(x: Tensor, *, memory_format: torch.memory_format | None = None) -> Tensor:
    """A copy of ``x`` in new memory, laid out as ``torch.clone`` lays it out.

    Args:
        x: The tensor to copy (any strides, 0-dim and empty included).
        memory_format: ``None`` or ``torch.preserve_format`` (keep ``x``'s strides when
            it is dense, else torch's suggested format), or ``torch.contiguous_format``.

    Returns:
        The copy, of ``x``'s shape and dtype, on its device.

    Raises:
        Unsupported: another memory format, or a tensor the kernels do not take.
    """
    if memory_format not in _FORMATS:
        raise Unsupported(f"clone to {memory_format}")
    _check_input(x, "clone")
    preserve = memory_format in (None, torch.preserve_format)
    if preserve and x.is_contiguous() and x.dim():
        # The pointwise fast path allocates with empty_like(x) itself: aten's allocation.
        return run(COPY, (x,))
    out = torch.empty_like(x, memory_format=memory_format or torch.preserve_format)
    if out.numel() == 0:
        return out
    return run(COPY, (x,), out=out)


def _skipped(t: Tensor) -> bool:
    """torch's legacy rule: a 1-D tensor of shape (0,) is left out of a cat."""
    return t.dim() == 1 and t.shape[0] == 0


def _output_format(tensors: Sequence[Tensor]) -> torch.memory_format:
    """torch's cat_compute_output_memory_format: the inputs' common suggestion, or contiguous."""
    found: torch.memory_format | None = None
    for t in tensors:
        f = suggest_memory_format(t)
        if f == torch.contiguous_format or (found is not None and found != f):
            return torch.contiguous_format
        found = f
    assert found is not None
    return found


@op("cat.default")
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors joined along ``dim``, as ``torch.cat``.

    Args:
        tensors: The tensors, of one rank and equal sizes except along ``dim``; 1-D
            tensors of shape ``(0,)`` are skipped (but count in the dtype).
        dim: The dim to join along (negative counts from the end).

    Returns:
        A new tensor of the promoted dtype of all inputs, laid out contiguous (or
        channels-last when every input is).

    Raises:
        Unsupported: what torch raises on (no tensors, 0-dim inputs, mismatched sizes,
            a dim out of range) and what the kernels do not take (mixed devices, dtypes
            and layouts outside the pointwise generator's).
    """
    tensors = list(tensors)
    if not tensors:
        raise Unsupported("cat of no tensors")  # torch raises
    device = tensors[0].device
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise Unsupported(f"a 0-dim tensor (at {i}) cannot be concatenated")  # torch raises
        if t.device != device:
            raise Unsupported(f"tensors on {device} and {t.device}")
        _check_input(t, "cat")
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    check_supported(dtype)
    parts = [t for t in tensors if not _skipped(t)]
    fmt = _output_format(tensors)
    if not parts:
        return torch.empty((0,), dtype=dtype, device=device, memory_format=fmt)
    rank = parts[0].dim()
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range for {rank} dims")  # torch raises
    dim %= rank
    shape = list(parts[0].shape)
    for t in parts[1:]:
        if t.dim() != rank or any(
            a != b for k, (a, b) in enumerate(zip(t.shape, shape, strict=True)) if k != dim
        ):
            raise Unsupported(f"sizes {tuple(t.shape)} and {tuple(shape)} do not cat on {dim}")
    shape[dim] = sum(t.shape[dim] for t in parts)
    out = torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)
    if out.numel() == 0:
        return out
    offset = 0
    for t in parts:
        size = t.shape[dim]
        if size:
            run(COPY, (t,), out=out.narrow(dim, offset, size))
        offset += size
    return out

