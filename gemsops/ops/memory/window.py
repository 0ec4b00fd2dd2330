"""A tensor written into a window of a filled one: ``constant_pad_nd`` and the gradients of
slicing and selecting (``slice_backward``, ``select_backward``).

Each is a fill of a new tensor (the pointwise ``FILL`` op) and a strided copy (the
pointwise ``COPY`` op) into a view of it, as aten composes them:

* ``constant_pad_nd`` pads the last ``len(pad) // 2`` dims, ``pad`` listing (before,
  after) pairs from the last dim backwards. Negative pads crop the input first; with no
  positive pad the result is a clone of the cropped view (``clone``'s layout). Otherwise
  the result takes the input's suggested memory format (channels-last stays
  channels-last), filled with ``value`` converted as ``fill_`` converts it.
* ``slice_backward`` / ``select_backward``: zeros of ``input_sizes`` (contiguous, the
  gradient's dtype) with the gradient written into ``[start:end:step]`` along ``dim`` /
  into index ``index`` of ``dim``. Where the window is one run along ``dim`` (a step of
  1, a select) only the elements around it are zeroed; otherwise all, then the copy.

What torch raises on (an odd ``pad`` length, a crop past the input, a dim or index out of
range, a non-positive step, a value that does not fit the dtype) is refused with
:class:`~gemsops.errors.Unsupported` before anything is written, so torch raises its own
error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import Number
from gemsops.ops.memory.copy import check_input, clone
from gemsops.ops.pointwise.arith import COPY, FILL
from gemsops.ops.pointwise.iterator import broadcast_shape, run
from gemsops.ops.replay import replayable

__all__ = ["constant_pad_nd", "select_backward", "slice_backward"]


@op("constant_pad_nd.default")
def constant_pad_nd(x: Tensor, pad: Sequence[int], value: Number = 0) -> Tensor:
    """``x`` padded with ``value`` (``F.pad(x, pad, value=value)``); negative pads crop.

    Args:
        x: The tensor to pad (any strides, 0-dim with an empty ``pad`` included).
        pad: (before, after) pairs, the last dim's first; at most two per dim of ``x``.
        value: The fill, converted to ``x``'s dtype as ``fill_`` converts it.

    Returns:
        The padded tensor, in ``x``'s dtype, laid out as torch lays it out.

    Raises:
        Unsupported: what torch raises on (an odd ``pad`` length, more pairs than dims, a
            crop longer than the dim, a value that overflows the dtype) and what the
            kernels do not take.
    """
    check_input(x, "constant_pad_nd")
    pad = [int(p) for p in pad]
    if len(pad) % 2:
        raise Unsupported(f"pad of odd length {len(pad)}")  # torch raises
    rank, pairs = x.dim(), len(pad) // 2
    if pairs > rank:
        raise Unsupported(f"{pairs} pad pairs for {rank} dims")  # torch raises
    src, grows = x, False
    for d in range(rank - pairs, rank):
        before, after = pad[2 * (rank - d - 1)], pad[2 * (rank - d - 1) + 1]
        for start, amount in ((True, before), (False, after)):
            if amount >= 0:
                grows = grows or amount > 0
                continue
            size = src.shape[d] + amount
            if size < 0:
                raise Unsupported(f"a crop of {-amount} from dim {d} of size "
                                  f"{src.shape[d]}")  # torch raises
            src = src.narrow(d, -amount if start else 0, size)
    if not grows:
        return clone(src)
    shape = list(x.shape)
    for d in range(rank - pairs, rank):
        shape[d] += pad[2 * (rank - d - 1)] + pad[2 * (rank - d - 1) + 1]
    out = torch.empty(shape, dtype=x.dtype, device=x.device,
                      memory_format=suggest_memory_format(x))
    window = out
    for d in range(rank - pairs, rank):
        before, after = pad[2 * (rank - d - 1)], pad[2 * (rank - d - 1) + 1]
        if before > 0:
            window = window.narrow(d, before, window.shape[d] - before)
        if after > 0:
            window = window.narrow(d, 0, window.shape[d] - after)
    run(FILL, (value,), out=out, inplace=True)
    if window.numel():
        run(COPY, (src,), out=window, inplace=True)
    return out


def _zeros_around(grad: Tensor, input_sizes: Sequence[int], what: str) -> Tensor:
    """A new tensor of ``input_sizes`` in ``grad``'s dtype, on its device (not yet zeroed)."""
    check_input(grad, what)
    sizes = [int(s) for s in input_sizes]
    if any(s < 0 for s in sizes):
        raise Unsupported(f"{what}: negative size in {sizes}")  # torch raises
    return torch.empty(sizes, dtype=grad.dtype, device=grad.device)


def _write_window(out: Tensor, window: Tensor, grad: Tensor,
                  span: tuple[int, int, int] | None) -> Tensor:
    """Copy ``grad`` into ``window`` (a view of ``out``) and zero the rest of ``out``.

    ``span`` is ``(dim, lo, hi)`` when the window is the whole of ``out`` but for
    ``[lo, hi)`` along ``dim``: then only the two pieces around it are zeroed; otherwise
    all of ``out`` is, before the copy.
    """
    if broadcast_shape([grad.shape, window.shape]) != tuple(window.shape):
        raise Unsupported(f"a gradient of shape {tuple(grad.shape)} for a window of "
                          f"{tuple(window.shape)}")  # torch raises
    if span is None:
        run(FILL, (0,), out=out, inplace=True)
    else:
        d, lo, hi = span
        for piece in (out.narrow(d, 0, lo), out.narrow(d, hi, out.shape[d] - hi)):
            if piece.numel():
                run(FILL, (0,), out=piece, inplace=True)
    if window.numel():
        run(COPY, (grad,), out=window, inplace=True)
    return out


def _wrap_dim(dim: int, rank: int) -> int:
    if not -max(rank, 1) <= dim < max(rank, 1):
        raise Unsupported(f"dim {dim} out of range for {rank} dims")  # torch raises
    return dim % max(rank, 1)


@op("slice_backward.default")
@replayable()
def slice_backward(grad_output: Tensor, input_sizes: Sequence[int], dim: int, start: int,
                   end: int, step: int) -> Tensor:
    """The gradient of ``x[..., start:end:step, ...]`` (along ``dim``) for ``x`` of
    ``input_sizes``: zeros, with ``grad_output`` in the sliced positions.

    Args:
        grad_output: The gradient of the slice (broadcastable to the slice's shape).
        input_sizes: The sliced tensor's shape.
        dim: The sliced dim (negative counts from the end).
        start: First index (Python's slicing rules: negative counts from the end, clamped).
        end: One past the last index (clamped likewise).
        step: A positive stride.

    Returns:
        A contiguous tensor of ``input_sizes`` in ``grad_output``'s dtype.

    Raises:
        Unsupported: a dim out of range or a non-positive step (torch raises), a shape
            mismatch, or what the kernels do not take.
    """
    out = _zeros_around(grad_output, input_sizes, "slice_backward")
    if out.dim() == 0:
        raise Unsupported("slice_backward of a 0-dim tensor")  # torch raises
    d = _wrap_dim(int(dim), out.dim())
    if int(step) <= 0:
        raise Unsupported(f"slice step {step} must be positive")  # torch raises
    lo, hi, step = slice(int(start), int(end), int(step)).indices(out.shape[d])
    hi = max(hi, lo)
    window = out[(slice(None),) * d + (slice(lo, hi, step),)]
    return _write_window(out, window, grad_output, (d, lo, hi) if step == 1 else None)


@op("select_backward.default")
def select_backward(grad_output: Tensor, input_sizes: Sequence[int], dim: int,
                    index: int) -> Tensor:
    """The gradient of ``x.select(dim, index)`` for ``x`` of ``input_sizes``: zeros, with
    ``grad_output`` at ``index`` of ``dim``.

    Args:
        grad_output: The gradient of the selection (broadcastable to its shape).
        input_sizes: The selected-from tensor's shape.
        dim: The dim selected along (negative counts from the end).
        index: The index selected (negative counts from the end).

    Returns:
        A contiguous tensor of ``input_sizes`` in ``grad_output``'s dtype.

    Raises:
        Unsupported: a dim or index out of range (torch raises), a shape mismatch, or
            what the kernels do not take.
    """
    out = _zeros_around(grad_output, input_sizes, "select_backward")
    if out.dim() == 0:
        raise Unsupported("select_backward of a 0-dim tensor")  # torch raises
    d = _wrap_dim(int(dim), out.dim())
    size, i = out.shape[d], int(index)
    if not -size <= i < size:
        raise Unsupported(f"index {i} out of range for dim {d} of size {size}")  # torch raises
    i %= size
    return _write_window(out, out.select(d, i), grad_output, (d, i, i + 1))
