"""index_put: write (or add) values into ``self[indices]``, the setter of ``x[idx] = v``.

Integer index tensors on adjacent dims (``x[i] = v``, ``x[:, rows, cols] += v``)
broadcast together; their positions become one flat index into those dims merged, and
the values, broadcast to the indexed shape, are written through the strided index
kernel as ``scatter`` writes (``accumulate=False``) or added as ``index_add`` adds
(``accumulate=True``: atomic, duplicates summed). Where duplicate positions are written
without accumulating, one of the values wins, as in torch. Bool masks (their count
needs a host sync), index tensors on dims that are not adjacent, and values of another
dtype are handed back to torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.index.kernels import check_value, same_device
from gemsops.ops.index.scatter import index_add, scatter

__all__ = ["index_put", "masked_scatter"]


def _flat_index(indices: Sequence[Tensor], sizes: Sequence[int],
                shape: tuple[int, ...]) -> Tensor:
    """The positions of ``indices`` (broadcast to ``shape``) in their dims merged.

    On the CPU an index outside ``[-size, size)`` raises torch's IndexError; elsewhere
    it becomes -1, which the kernel masks (no device sync).
    """
    flat: Tensor | None = None
    bad: Tensor | None = None
    for t, size in zip(indices, sizes, strict=True):
        if t.is_cpu:
            if t.numel():
                arr = t.detach().numpy()  # numpy: no aten op that could re-enter gemsops
                lo, hi = int(arr.min()), int(arr.max())
                if lo < -size or hi >= size:
                    bad_value = lo if lo < -size else hi
                    raise IndexError(f"index {bad_value} is out of bounds for dimension "
                                     f"with size {size}")
        else:
            out = ((t < -size) | (t >= size)).expand(shape)
            bad = out if bad is None else bad | out
        wrapped = torch.where(t < 0, t + size, t).to(torch.int64).expand(shape)
        flat = wrapped if flat is None else flat * size + wrapped
    assert flat is not None
    return flat if bad is None else torch.where(bad, -1, flat)


def _put(self: Tensor, indices: Sequence[Tensor | None], values: Tensor, accumulate: bool,
         target: Tensor) -> Tensor:
    """Write ``values`` into ``target[indices]`` (``target`` holds ``self``'s values)."""
    live = [(d, t) for d, t in enumerate(indices) if t is not None]
    if not live:
        raise Unsupported("index_put with no index tensor")
    if any(t.dtype not in (torch.int64, torch.int32) for _, t in live):
        raise Unsupported("an index that is not int32/int64 (a bool mask)")
    dims = [d for d, _ in live]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        raise Unsupported("index tensors on dims that are not adjacent")
    first, count = dims[0], len(dims)
    if first + count > self.dim():
        raise Unsupported("more indices than dims (torch raises)")
    same_device(self, values, *(t for _, t in live))
    check_value(self)
    if values.dtype != self.dtype:
        raise Unsupported("values of another dtype than self (torch raises)")
    try:
        bshape = tuple(torch.broadcast_shapes(*(t.shape for _, t in live)))
    except RuntimeError:
        raise Unsupported("index tensors that do not broadcast (torch raises)") from None
    pre, post = tuple(self.shape[:first]), tuple(self.shape[first + count:])
    sizes = tuple(self.shape[first:first + count])
    result_shape = (*pre, *bshape, *post)
    try:
        vals = values.expand(result_shape)
    except RuntimeError:
        raise Unsupported("values that do not broadcast to the indexed shape "
                          "(torch raises)") from None
    flat = _flat_index([t for _, t in live], sizes, bshape)
    nsel = math.prod(bshape)
    merged_shape = (*pre, math.prod(sizes), *post)
    try:
        merged = target.view(merged_shape)
    except RuntimeError:
        merged = None
    work = merged if merged is not None else target.contiguous().view(merged_shape)
    if nsel and math.prod(result_shape):
        src = vals.reshape(*pre, nsel, *post)
        if accumulate:
            index_add(work, first, flat.reshape(nsel), src, inplace=True)
        else:
            idx = flat.reshape(nsel).view(*([1] * len(pre)), nsel, *([1] * len(post)))
            scatter(work, first, idx.expand(src.shape), src=src, inplace=True)
    if merged is None:
        target.copy_(work.view(target.shape))
    return target


@op("index_put.default", out="index_put.out")
def index_put(self: Tensor, indices: Sequence[Tensor | None], values: Tensor,
              accumulate: bool = False) -> Tensor:
    """A copy of ``self`` with ``values`` written (or, with ``accumulate``, added) at
    ``self[indices]``, as ``torch.index_put``.

    Args:
        self: The tensor written into (a copy of it).
        indices: int32/int64 index tensors on adjacent dims (None for a full slice
            before them), broadcasting together; negative indices count from the end.
        values: ``self``'s dtype, broadcasting to the indexed shape.
        accumulate: Add (duplicates summed) instead of writing.

    Raises:
        IndexError: an index out of range (checked on the CPU).
        Unsupported: a bool mask, index tensors on dims that are not adjacent, values
            of another dtype, shapes torch refuses, or deterministic algorithms with
            ``accumulate``.
    """
    target = self.clone(memory_format=torch.contiguous_format)
    return _put(self, indices, values, accumulate, target)


def _inplace(self: Tensor, indices: Sequence[Tensor | None], values: Tensor,
             accumulate: bool) -> Tensor:
    if any(st == 0 and sz > 1 for st, sz in zip(self.stride(), self.shape, strict=True)):
        raise Unsupported("self has overlapping elements (torch raises)")
    ptr = self.untyped_storage().data_ptr()
    if self.numel() and any(t is not None and t.numel() and t.untyped_storage().data_ptr() == ptr
                            for t in (values, *indices)):
        raise Unsupported("values or an index share storage with self")
    return _put(self, indices, values, accumulate, self)


@op("index_put_.default", public=False)
def index_put_(self: Tensor, indices: Sequence[Tensor | None], values: Tensor,
               accumulate: bool = False) -> Tensor:
    """aten's ``index_put_``: :func:`index_put` into ``self``."""
    return _inplace(self, indices, values, accumulate)


@op("_index_put_impl_.default", public=False)
def _index_put_impl_(self: Tensor, indices: Sequence[Tensor | None], values: Tensor,
                     accumulate: bool = False, unsafe: bool = False) -> Tensor:
    """aten's ``_index_put_impl_`` (what ``x[idx] = v`` reaches): :func:`index_put` into
    ``self``; ``unsafe`` (skip the bounds checks) changes nothing here."""
    return _inplace(self, indices, values, accumulate)


@op("_index_put_impl.default", out="_index_put_impl.out", public=False)
def _index_put_impl(self: Tensor, indices: Sequence[Tensor | None], values: Tensor,
                    accumulate: bool = False, unsafe: bool = False) -> Tensor:
    """aten's functional ``_index_put_impl``: :func:`index_put`."""
    return index_put(self, indices, values, accumulate)


def _masked_scatter(self: Tensor, mask: Tensor, source: Tensor, shape: tuple[int, ...]
                    ) -> Tensor:
    """``self`` (broadcast to ``shape``) with the masked positions, in order, taking
    ``source``'s leading elements: a prefix count of the mask gives each its element."""
    from gemsops.ops.index.gather import index_select
    from gemsops.ops.pointwise.arith import where
    from gemsops.ops.rowwise.scan import cumsum

    if mask.dtype != torch.bool:
        raise Unsupported(f"a mask of {mask.dtype} (torch takes bool)")
    if source.dtype != self.dtype:
        raise Unsupported("source of another dtype than self (torch raises)")
    same_device(self, mask, source)
    check_value(self)
    m = mask.expand(shape)
    base = self.expand(shape)
    if m.numel() == 0:
        return base.clone(memory_format=torch.contiguous_format)
    pos = cumsum(m.reshape(-1), 0)  # int64: how many masked positions up to each
    if m.is_cpu:
        ones = int(pos.detach().numpy()[-1])  # numpy: no aten op re-entering gemsops
        if ones > source.numel():
            raise Unsupported("fewer source elements than masked positions (torch raises)")
    if source.numel() == 0:
        if not m.is_cpu:
            raise Unsupported("an empty source off the CPU (its check needs a sync)")
        return base.clone(memory_format=torch.contiguous_format)
    # A position's element is source[count - 1]; unmasked ones read a clamped index.
    pick = (pos - 1).clamp(0, source.numel() - 1)
    taken = index_select(source.reshape(-1), 0, pick).view(shape)
    return where(m, taken, base)


@op("masked_scatter.default", out="masked_scatter.out")
def masked_scatter(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``self`` with the positions where ``mask`` holds taking ``source``'s elements in
    order, as ``torch.masked_scatter`` (``self`` and ``mask`` broadcast together).

    Raises:
        Unsupported: a mask that is not bool, a source of another dtype, shapes that do
            not broadcast, or (on the CPU, where counting costs no sync) fewer source
            elements than masked positions (torch raises).
    """
    try:
        shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
    except RuntimeError:
        raise Unsupported("self and mask do not broadcast (torch raises)") from None
    return _masked_scatter(self, mask, source, shape)


@op("masked_scatter_.default", public=False)
def masked_scatter_(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """aten's ``masked_scatter_``: :func:`masked_scatter` into ``self`` (the mask
    broadcasts to ``self``'s shape)."""
    try:
        shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
    except RuntimeError:
        shape = ()
    if shape != tuple(self.shape):
        raise Unsupported("a mask that does not broadcast to self's shape (torch raises)")
    ptr = self.untyped_storage().data_ptr()
    if self.numel() and any(t.numel() and t.untyped_storage().data_ptr() == ptr
                            for t in (mask, source)):
        raise Unsupported("mask or source share storage with self")
    result = _masked_scatter(self, mask, source, shape)
    return self.copy_(result)
