"""gather and index_select: read ``self`` through an index along ``dim``.

``gather``: ``out[p] = self[p with p[dim] = index[p]]`` for every position ``p`` of the
index; ``index_select``: ``out[..., j, ...] = self[..., index[j], ...]``. Both copy bits
(any dtype, nan payloads and -0.0 kept) and return a contiguous result, as torch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.index.kernels import (
    GATHER,
    as_bits,
    check_index,
    check_value,
    launch,
    same_device,
    wrap_dim,
)

__all__ = ["gather", "index", "index_select"]


def _at_least_1d(t: Tensor) -> Tensor:
    return t.reshape(1) if t.dim() == 0 else t


@op("gather.default", out="gather.out")
def gather(self: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """Gather values of ``self`` along ``dim``: ``out[p] = self[p, with p[dim] = index[p]]``.

    Args:
        self: The tensor read from (any strides, float/int/bool dtypes).
        dim: The dim the index selects along (negative counts from the end).
        index: int32/int64 indices, the rank of ``self``, no larger than ``self`` in
            the other dims.
        sparse_grad: A sparse gradient (left to torch).

    Returns:
        A contiguous tensor of ``index``'s shape and ``self``'s dtype.

    Raises:
        IndexError: an index outside ``[0, self.size(dim))`` (checked on the CPU).
        Unsupported: shapes or dtypes torch refuses, or a sparse gradient.
    """
    if sparse_grad:
        raise Unsupported("sparse gradients of gather")
    same_device(self, index)
    check_value(self)
    src, idx = _at_least_1d(self), _at_least_1d(index)
    if src.dim() != idx.dim():
        raise Unsupported("index and self differ in rank (torch raises)")
    d = wrap_dim(dim, self.dim())
    if any(idx.shape[k] > src.shape[k] for k in range(idx.dim()) if k != d):
        raise Unsupported("index is larger than self outside dim (torch raises)")
    size = src.shape[d]
    check_index(idx, size)
    out = torch.empty(index.shape, dtype=self.dtype, device=self.device)
    if out.numel() == 0:
        return out
    src_strides = list(src.stride())
    src_strides[d] = 0
    o = _at_least_1d(out)
    launch(GATHER, idx.shape, idx, idx.stride(), as_bits(src), src_strides, as_bits(o),
           o.stride(), src.stride(d), size)
    return out


@op("index_select.default", out="index_select.out")
def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
    """Select slices of ``self`` along ``dim``: ``out[..., j, ...] = self[..., index[j], ...]``.

    Args:
        self: The tensor read from (any strides, float/int/bool dtypes), not 0-dim.
        dim: The dim the index selects along.
        index: A 0-dim or 1-D int32/int64 index.

    Returns:
        A contiguous tensor, ``self``'s shape with ``dim`` of ``index.numel()``.

    Raises:
        IndexError: an index outside ``[0, self.size(dim))`` (checked on the CPU).
        Unsupported: a 0-dim ``self``, an index of rank > 1, or dtypes torch refuses.
    """
    same_device(self, index)
    check_value(self)
    if self.dim() == 0:
        raise Unsupported("index_select of a 0-dim tensor")
    if index.dim() > 1:
        raise Unsupported("index_select takes a vector index (torch raises)")
    d = wrap_dim(dim, self.dim())
    size = self.shape[d]
    idx = _at_least_1d(index)
    check_index(idx, size)
    shape = list(self.shape)
    shape[d] = idx.numel()
    out = torch.empty(shape, dtype=self.dtype, device=self.device)
    if out.numel() == 0:
        return out
    # The index as a view over the output's positions: stride 0 outside dim.
    idx_strides = [0] * self.dim()
    idx_strides[d] = idx.stride(0)
    src_strides = list(self.stride())
    src_strides[d] = 0
    launch(GATHER, shape, idx, idx_strides, as_bits(self), src_strides, as_bits(out),
           out.stride(), self.stride(d), size)
    return out


@op("index.Tensor", out="index.Tensor_out")
def index(self: Tensor, indices: Sequence[Tensor | None]) -> Tensor:
    """``self[indices]`` where integer tensors index adjacent dims (``x[:, i]``,
    ``x[rows, cols]``): the index tensors broadcast together and their shape takes those
    dims' place; negative indices count from the end.

    Raises:
        Unsupported: index tensors on dims that are not adjacent (their result dims move
            to the front), a bool mask (its size needs a host sync), or more indices than
            dims (torch raises).
    """
    live = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not live:
        raise Unsupported("indexing with no index tensor")
    dims = [d for d, _ in live]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        raise Unsupported("index tensors on dims that are not adjacent")
    if any(t.dtype not in (torch.int64, torch.int32) for _, t in live):
        raise Unsupported("an index that is not int32/int64 (a bool mask)")
    first, count = dims[0], len(dims)
    if first + count > self.dim():
        raise Unsupported("more indices than dims (torch raises)")
    try:
        shape = torch.broadcast_shapes(*(t.shape for _, t in live))
    except RuntimeError:
        raise Unsupported("index tensors that do not broadcast (torch raises)") from None
    sizes = self.shape[first:first + count]
    flat: Tensor | None = None
    outside: Tensor | None = None
    for (d, t), size in zip(live, sizes, strict=True):
        if t.is_cpu and t.numel():
            # numpy: no aten op that could re-enter gemsops; torch's message.
            arr = t.detach().numpy()
            bad = [int(v) for v in (arr.min(), arr.max()) if not -size <= int(v) < size]
            if bad:
                raise IndexError(f"index {bad[0]} is out of bounds for dimension {d} "
                                 f"with size {size}")
        wrapped = torch.where(t < 0, t + size, t).expand(shape)
        if not t.is_cpu and count > 1:
            # Off the CPU nothing is checked on the host: an index outside its own dim
            # must not land on another row of the merged dims, so it is made an index
            # outside the merged dim, which index_select's kernel masks off.
            out_here = (wrapped < 0) | (wrapped >= size)
            outside = out_here if outside is None else outside | out_here
        flat = wrapped if flat is None else flat * size + wrapped
    assert flat is not None
    if outside is not None:
        flat = torch.where(outside, -1, flat)
    merged = self.reshape(*self.shape[:first], math.prod(sizes), *self.shape[first + count:])
    picked = index_select(merged, first, flat.reshape(-1))
    return picked.view(*self.shape[:first], *shape, *self.shape[first + count:])
