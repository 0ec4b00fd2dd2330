"""Copies: ``clone``, ``cat``, dtype conversions (``_to_copy``) and ``copy_``, on the
pointwise generator's identity op.

All are memory copies, so none has a kernel of its own: each is the pointwise
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
* ``_to_copy`` (what ``x.to(dtype)``, ``x.float()``, ``x.to(memory_format=...)`` reach)
  allocates as aten's does (preserve: ``x``'s strides when it is dense, else its dense
  stride order; or the requested format) and copies with the cast. Another device,
  pinned memory or another layout is torch's business.
* ``copy_`` writes ``src`` into ``self``, broadcast and cast to ``self``'s dtype.

The casts are torch's (c10's ``static_cast``): floats truncate into integers, nonzero is
``True``, half types round through float32, and a float becomes ``uint8`` through
``int64`` (so ``-1.0`` is 255, as torch has it on every device).

Everything torch would refuse, and what the kernels do not take (complex and other
dtypes, non-strided layouts, mixed devices, channels-last ``clone``), is refused with
:class:`~gemsops.errors.Unsupported` before anything is written.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

import gemshal
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import TL_DTYPES, check_supported
from gemsops.ops.pointwise.arith import COPY
from gemsops.ops.pointwise.iterator import run
from gemsops.ops.pointwise.types import device_type
from gemsops.ops.replay import replayable

__all__ = ["cat", "check_input", "clone", "copy_", "to_copy"]

# The formats the copy keeps exactly as torch allocates them; channels-last clones are
# left to torch (a real model's backward never asks for one).
_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def check_input(t: Tensor, what: str) -> None:
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
@replayable()
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
    check_input(x, "clone")
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
@replayable()
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
        check_input(t, "cat")
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



# --- casts: _to_copy and copy_ ----------------------------------------------------


def cast_into(out: Tensor, src: Tensor) -> Tensor:
    """Write ``src`` (broadcast to ``out``'s shape) into ``out``, cast as torch's copy casts.

    Raises:
        Unsupported: shapes that do not broadcast to ``out``'s, an output with
            overlapping elements or one partly overlapping ``src`` (torch raises), or a
            dtype the kernels do not take.
    """
    if src.dtype == out.dtype:
        common = None
    elif out.dtype == torch.uint8 and src.dtype.is_floating_point:
        common = torch.int64  # c10 converts floats to uint8 through int64 (-1.0 -> 255)
    else:
        common = out.dtype  # any cast: the source is converted to the output's dtype
    # A 0-dim source is read as a one-element tensor: the generator would take a 0-dim
    # CPU tensor as a Python number, which skips the cast to the common dtype.
    if src.dim() == 0:
        src = src.view(1)
    run(COPY, (src,), out=out.view(1) if out.dim() == 0 else out, inplace=True, common=common)
    return out


def _same_device(x: Tensor, device: torch.device | str | int | None) -> bool:
    """Whether ``device`` (``None``, or a device with or without an index) is ``x``'s."""
    if device is None:
        return True
    target = torch.device(device)
    if target.type != x.device.type:
        return False
    index: int | None = x.device.index
    wanted: int | None = target.index
    if wanted is None:  # aten's ensure_has_index: the current device
        return index is None or gemshal.current_device().index == index
    return wanted == (index or 0)


_CHANNELS_RANK = {torch.channels_last: 4, torch.channels_last_3d: 5}


def _no_device(*_args: Any, **kwargs: Any) -> bool:
    # A device argument may name the current device (no index): not a structural choice.
    return kwargs.get("device") is None


@op("_to_copy.default", name="to_copy")
@replayable(when=_no_device)
def to_copy(x: Tensor, *, dtype: torch.dtype | None = None, layout: torch.layout | None = None,
            device: torch.device | str | None = None, pin_memory: bool | None = None,
            non_blocking: bool = False,
            memory_format: torch.memory_format | None = None) -> Tensor:
    """A copy of ``x`` converted to ``dtype`` and laid out as aten's ``_to_copy`` lays it out.

    Args:
        x: The tensor to convert (any strides, 0-dim and empty included).
        dtype: The result dtype (``x``'s when None).
        layout: ``None`` or ``torch.strided``.
        device: ``None`` or ``x``'s own device (an index-less name means the current one).
        pin_memory: ``None`` or ``False``.
        non_blocking: Accepted: a copy on one device is ordered on its stream anyway.
        memory_format: ``None`` or ``torch.preserve_format`` (``x``'s strides when it is
            non-overlapping and dense, else dense strides in ``x``'s memory order),
            ``torch.contiguous_format``, ``torch.channels_last`` (4-D) or
            ``torch.channels_last_3d`` (5-D).

    Returns:
        The converted copy (see the module docstring for the casts).

    Raises:
        Unsupported: another device, pinned memory, another layout or memory format, a
            channels-last format of the wrong rank (torch raises), or a dtype the kernels
            do not take.
    """
    if layout is not None and layout != torch.strided:
        raise Unsupported(f"_to_copy to layout {layout}")
    check_input(x, "_to_copy")
    if pin_memory:
        raise Unsupported("_to_copy into pinned memory")
    if not _same_device(x, device):
        raise Unsupported(f"_to_copy from {x.device} to {device}")
    target = x.dtype if dtype is None else dtype
    if target not in TL_DTYPES:
        raise Unsupported(f"_to_copy to dtype {target}")
    check_supported(target)
    fmt = torch.preserve_format if memory_format is None else memory_format
    if fmt == torch.preserve_format:
        # torch's own rule (its _to_copy allocates this way), empty tensors included.
        out = torch.empty_like(x, dtype=target, memory_format=torch.preserve_format)
    elif fmt == torch.contiguous_format or x.dim() == _CHANNELS_RANK.get(fmt):
        out = torch.empty(x.shape, dtype=target, device=x.device, memory_format=fmt)
    else:
        raise Unsupported(f"_to_copy of a {x.dim()}-dim tensor to {fmt}")
    if out.numel():
        cast_into(out, x)
    return out


@op("copy_.default")
def copy_(self: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    """Write ``src`` into ``self``, broadcast to ``self``'s shape and cast to its dtype.

    Args:
        self: The tensor written (any strides without overlapping elements).
        src: The values, on ``self``'s device, broadcastable to ``self``'s shape.
        non_blocking: Accepted: a copy on one device is ordered on its stream anyway.

    Returns:
        ``self``.

    Raises:
        Unsupported: ``src`` on another device (torch copies across devices), shapes
            that do not broadcast to ``self``'s, an output with overlapping elements or
            partly overlapping ``src`` (torch raises), or dtypes the kernels do not take.
    """
    check_input(self, "copy_")
    check_input(src, "copy_ source")
    if src.device != self.device:
        raise Unsupported(f"copy_ from {src.device} to {self.device}")
    if src is self or (
        src.dtype == self.dtype and src.data_ptr() == self.data_ptr()
        and src.shape == self.shape and src.stride() == self.stride()
    ):
        return self  # the same elements: aten returns at once
    cast_into(self, src)
    return self
