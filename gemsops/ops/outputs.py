"""Writing a computed result into aten's ``out=`` tensors and into ``self`` for in-place ops.

These are the two writers :mod:`gemsops.declare` derives an op's ``out=`` and in-place
overloads with, when the implementation does not write there itself. They hand the call
to torch (raise :class:`~gemsops.errors.Unsupported`) wherever torch would cast, warn or
raise, before anything is written, so torch's own kernel decides those cases.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from gemsops.errors import Unsupported

__all__ = ["prepare_out", "warn_resize", "write_inplace", "write_out", "write_outs"]


def write_out(out: Tensor, result: Tensor, *inputs: Tensor) -> Tensor:
    """Copy a computed ``result`` into an aten ``out=`` tensor, or hand the call to torch.

    ``out`` must have the result's dtype, device and shape, or be empty (aten resizes
    an empty ``out``). Anything else (torch casts, warns while resizing, or raises) and
    ``out`` sharing storage with an input raise :class:`Unsupported` before ``out`` is
    touched, so torch's own kernel decides.

    Args:
        out: The tensor aten's caller passed as ``out``.
        result: The computed result.
        *inputs: The op's tensor inputs (checked for overlap with ``out``).

    Returns:
        ``out``.
    """
    _check_out(out, result, inputs)
    if out.shape != result.shape:
        out.resize_(result.shape)
    out.copy_(result)
    return out


def write_outs(outs: Sequence[Tensor], results: Sequence[Tensor],
               *inputs: Tensor) -> tuple[Tensor, ...]:
    """:func:`write_out` for an overload with several ``out`` tensors (``max.dim_max``).

    Every pair is checked before any is written, so a refusal leaves all of them as
    they were.
    """
    if len(outs) != len(results):
        raise Unsupported(f"{len(outs)} out tensors for {len(results)} results")
    for out, result in zip(outs, results, strict=True):
        _check_out(out, result, inputs)
    live = [out for out in outs if out.numel()]
    if len({out.untyped_storage().data_ptr() for out in live}) < len(live):
        raise Unsupported("two out tensors share storage")  # torch raises
    for out, result in zip(outs, results, strict=True):
        if out.shape != result.shape:
            out.resize_(result.shape)
        out.copy_(result)
    return tuple(outs)


def write_inplace(self: Tensor, result: Tensor) -> Tensor:
    """Copy a computed ``result`` into ``self``, as aten's in-place overloads write.

    ``result`` must have ``self``'s shape (an in-place op cannot grow ``self``), and its
    dtype must cast to ``self``'s under torch's rule (no float into an integer tensor).

    Returns:
        ``self``.
    """
    if result.shape != self.shape:
        raise Unsupported(f"result shape {tuple(result.shape)} differs from self's "
                          f"{tuple(self.shape)} (torch raises)")
    if not torch.can_cast(result.dtype, self.dtype):
        raise Unsupported(f"result dtype {result.dtype} cannot be cast to self's {self.dtype}")
    if _overlaps(self, (result,)) and result.data_ptr() != self.data_ptr():
        result = result.clone()
    self.copy_(result)
    return self


def _check_out(out: Tensor, result: Tensor, inputs: Sequence[Tensor]) -> None:
    _check(out, tuple(result.shape), result.dtype, result.device, inputs)


def _check(out: Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
           inputs: Sequence[Tensor], resizes: bool = False) -> None:
    if out.dtype != dtype:
        raise Unsupported(f"out dtype {out.dtype} differs from the result's {dtype}")
    if out.device != device or out.layout != torch.strided:
        raise Unsupported("out on another device or layout")
    if tuple(out.shape) != shape and out.numel() and not resizes:
        raise Unsupported("out has another shape (torch resizes it with a warning)")
    if out.numel() and _overlaps(out, inputs):
        raise Unsupported("out shares storage with an input")


def prepare_out(out: Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                *inputs: Tensor) -> Tensor:
    """Check an ``out=`` tensor a kernel writes into directly, as :func:`write_out`
    checks it (hand-backs included), and resize it to ``shape``: silently when it is
    empty, with torch's deprecation warning when it had elements.

    Returns:
        ``out``, ready to be written.
    """
    _check(out, shape, dtype, inputs[0].device if inputs else out.device, inputs, True)
    if tuple(out.shape) != shape:
        if out.numel():
            warn_resize(out, shape)
        out.resize_(shape)
    return out


def warn_resize(out: Tensor, shape: Sequence[int]) -> None:
    """torch's warning when an ``out=`` tensor that had elements is resized."""
    warnings.warn(
        f"An output with one or more elements was resized since it had shape "
        f"{list(out.shape)}, which does not match the required output shape {list(shape)}. "
        "This behavior is deprecated, and in a future PyTorch release outputs will not be "
        "resized unless they have zero elements. You can explicitly reuse an out tensor t "
        "by resizing it, inplace, to zero elements with t.resize_(0).",
        UserWarning,
        stacklevel=4,
    )


def _overlaps(out: Tensor, inputs: Sequence[Tensor]) -> bool:
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(t, Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs)
