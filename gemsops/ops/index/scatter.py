"""scatter, scatter_add and index_add: write or add a source through an index along ``dim``.

``scatter``: ``out[p with p[dim] = index[p]] = src[p]`` (or a scalar ``value``) for every
position ``p`` of the index, into a copy of ``self``; where two positions name one
element the winner is unspecified, as in torch. ``scatter_add`` adds instead, and
``index_add`` adds ``alpha * source[..., j, ...]`` into ``self[..., index[j], ...]``.

Adds are atomic, so float sums are order-dependent, like torch's GPU kernels; under
``torch.use_deterministic_algorithms(True)`` they are left to torch. Half types
(float16/bfloat16) accumulate in a float32 copy and small integer and bool types in an
int32 copy, cast back at the end (integer sums wrap as torch's do; a bool sum is an
``or``); float32/float64/int32/int64 add in place.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.index.kernels import (
    ADD,
    STORE,
    as_bits,
    check_index,
    check_value,
    launch,
    same_device,
    wrap_dim,
)

__all__ = ["index_add", "scatter", "scatter_add"]

_ADD_ACC = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.int8: torch.int32,
    torch.uint8: torch.int32,
    torch.int16: torch.int32,
    torch.bool: torch.int32,
}
"""Dtypes added in a wider copy (atomics lack them, or round at every add)."""


def _at_least_1d(t: Tensor) -> Tensor:
    return t.reshape(1) if t.dim() == 0 else t


def _storage(t: Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _target(self: Tensor, out: Tensor | None, inplace: bool, *inputs: Tensor) -> Tensor:
    """The tensor the op writes: ``self`` (in place), ``out`` holding a copy of ``self``,
    or a new contiguous copy. Every check runs before anything is written."""
    live = [t for t in inputs if t.numel()]
    if inplace:
        if any(st == 0 and sz > 1 for st, sz in zip(self.stride(), self.shape, strict=True)):
            raise Unsupported("self has overlapping elements (torch raises)")
        if self.numel() and any(_storage(t) == _storage(self) for t in live):
            raise Unsupported("self shares storage with an input")
        return self
    if out is not None:
        if out.dtype != self.dtype or out.device != self.device or out.layout != torch.strided:
            raise Unsupported("out of another dtype, device or layout")
        if out.shape != self.shape and out.numel():
            raise Unsupported("out has another shape (torch resizes it with a warning)")
        if out.numel() and any(_storage(t) == _storage(out) for t in (self, *live)):
            raise Unsupported("out shares storage with an input")
        if out.shape != self.shape:
            out.resize_(self.shape)
        return out.copy_(self)
    return self.clone(memory_format=torch.contiguous_format)


def _check_shapes(self: Tensor, dim: int, index: Tensor, src: Tensor | None) -> int:
    """torch's scatter shape rule; ``dim`` wrapped. Unsupported where torch raises."""
    s, i = _at_least_1d(self), _at_least_1d(index)
    d = wrap_dim(dim, self.dim())
    if s.dim() != i.dim():
        raise Unsupported("index and self differ in rank (torch raises)")
    if any(i.shape[k] > s.shape[k] for k in range(i.dim()) if k != d):
        raise Unsupported("index is larger than self outside dim (torch raises)")
    if src is not None:
        r = _at_least_1d(src)
        if r.dim() != i.dim() or any(a > b for a, b in zip(i.shape, r.shape, strict=True)):
            raise Unsupported("index is larger than src (torch raises)")
    return d


def _scatter_into(target: Tensor, d: int, index: Tensor, src: Tensor, mode: int,
                  alpha: Any = 1, select: bool = False) -> None:
    """Run the kernel writing (STORE) or adding (ADD) ``src`` into ``target`` along ``d``.

    ``select``: ``index`` is index_add's vector, applied over ``src``'s positions.
    """
    t = _at_least_1d(target)
    idx = _at_least_1d(index)
    r = _at_least_1d(src)
    if select:
        shape = list(r.shape)
        idx_strides = [0] * r.dim()
        idx_strides[d] = idx.stride(0)
    else:
        shape, idx_strides = list(idx.shape), list(idx.stride())
    if mode == STORE:
        dst, source = as_bits(t), as_bits(r)
    else:
        acc = _ADD_ACC.get(t.dtype, t.dtype)
        dst = t if acc == t.dtype else t.to(acc)
        source = r
    dst_strides = list(dst.stride())
    dst_strides[d] = 0
    scale = None
    if mode == ADD and alpha != 1:
        scale = torch.full((1,), alpha, dtype=dst.dtype, device=dst.device)
    launch(mode, shape, idx, idx_strides, source, r.stride(), dst, dst_strides,
           dst.stride(d), t.shape[d], scale)
    if mode == ADD and dst is not t:
        t.copy_(dst)


def _check_add(self: Tensor, src: Tensor) -> None:
    if src.dtype != self.dtype:
        raise Unsupported("self and src dtypes differ (torch raises)")
    if torch.are_deterministic_algorithms_enabled():
        raise Unsupported("atomic accumulation is not deterministic")


@op("scatter.src", "scatter.value", out=("scatter.src_out", "scatter.value_out"),
    inplace=("scatter_.src", "scatter_.value"))
def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | None = None,
            value: Any = None, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """Write ``src`` (or the scalar ``value``) into a copy of ``self`` through ``index``.

    Args:
        self: The tensor written (a copy of it, or itself with ``inplace``).
        dim: The dim the index selects along.
        index: int32/int64 indices, the rank of ``self``, no larger than ``src`` in any
            dim nor than ``self`` outside ``dim``.
        src: Values, ``self``'s dtype; the positions of ``index`` are read.
        value: A scalar written instead of ``src`` (cast to ``self``'s dtype).
        out: Optional result tensor (``self``'s dtype; resized when empty).
        inplace: Write into ``self`` (the in-place overloads pass ``out=self``).

    Returns:
        The written tensor.

    Raises:
        IndexError: an index outside ``[0, self.size(dim))`` (checked on the CPU).
        Unsupported: shapes or dtypes torch refuses, or overlapping outputs.
    """
    if inplace:
        out = None
    if (src is None) == (value is None):
        raise Unsupported("scatter takes src or value")
    check_value(self)
    if src is not None:
        same_device(self, index, src)
        if src.dtype != self.dtype:
            raise Unsupported("self and src dtypes differ (torch raises)")
    else:
        same_device(self, index)
        if isinstance(value, (Tensor, complex)):
            raise Unsupported("a tensor or complex value")
    d = _check_shapes(self, dim, index, src)
    check_index(index, _at_least_1d(self).shape[d])
    inputs = (index,) if src is None else (index, src)
    target = _target(self, out, inplace, *inputs)
    if index.numel():
        if src is None:
            # The scalar as a tensor of one element read with stride 0 everywhere.
            one = torch.full((1,), value, dtype=self.dtype, device=self.device)
            src = one.expand(index.shape) if index.dim() else one.view(())
        _scatter_into(target, d, index, src, STORE)
    return target


@op("scatter_add.default", out="scatter_add.out", inplace="scatter_add_.default")
def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor, *,
                out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """Add ``src`` into a copy of ``self`` through ``index`` (the backward of gather).

    Args:
        self: The tensor added to (a copy of it, or itself with ``inplace``).
        dim: The dim the index selects along.
        index: int32/int64 indices, shaped as for :func:`scatter`.
        src: Values added, ``self``'s dtype.
        out: Optional result tensor.
        inplace: Add into ``self``.

    Returns:
        The summed tensor (float sums in an order that may vary between runs).

    Raises:
        IndexError: an index outside ``[0, self.size(dim))`` (checked on the CPU).
        Unsupported: shapes or dtypes torch refuses, or deterministic algorithms.
    """
    if inplace:
        out = None
    check_value(self)
    same_device(self, index, src)
    _check_add(self, src)
    d = _check_shapes(self, dim, index, src)
    check_index(index, _at_least_1d(self).shape[d])
    target = _target(self, out, inplace, index, src)
    if index.numel():
        _scatter_into(target, d, index, src, ADD)
    return target


@op("index_add.default", out="index_add.out", inplace="index_add_.default")
def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1,
              out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """Add ``alpha * source[..., j, ...]`` into ``self[..., index[j], ...]`` (of a copy).

    Args:
        self: The tensor added to (not 0-dim).
        dim: The dim the index selects along.
        index: A 0-dim or 1-D int32/int64 index, one entry per slice of ``source``.
        source: ``self``'s shape outside ``dim``, ``index.numel()`` along it.
        alpha: Scale of ``source`` (integral for integer tensors).
        out: Optional result tensor.
        inplace: Add into ``self``.

    Returns:
        The summed tensor (float sums in an order that may vary between runs).

    Raises:
        IndexError: an index outside ``[0, self.size(dim))`` (checked on the CPU).
        Unsupported: shapes, dtypes or an ``alpha`` torch refuses, or deterministic
            algorithms.
    """
    if inplace:
        out = None
    check_value(self)
    same_device(self, index, source)
    _check_add(self, source)
    if self.dim() == 0 or index.dim() > 1:
        raise Unsupported("index_add of a 0-dim tensor or with a non-vector index")
    if isinstance(alpha, (complex, Tensor)):
        raise Unsupported("a complex or tensor alpha")
    if not self.dtype.is_floating_point and isinstance(alpha, float):
        raise Unsupported("a float alpha for an integer tensor (torch raises)")
    if self.dtype == torch.bool and alpha != 1:
        raise Unsupported("index_add of bool with alpha other than True")
    d = wrap_dim(dim, self.dim())
    src = _at_least_1d(source)
    shape = list(self.shape)
    shape[d] = index.numel()
    if list(src.shape) != shape:
        raise Unsupported("source does not match self outside dim or the index (torch raises)")
    check_index(index, self.shape[d])
    target = _target(self, out, inplace, index, source)
    if index.numel():
        _scatter_into(target, d, index, src, ADD, alpha=alpha, select=True)
    return target
