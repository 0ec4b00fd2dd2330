"""The strided index kernel that gather, index_select, scatter, scatter_add and index_add
share, and the host-side checks and launch that feed it.

The kernel walks the positions of an *iteration shape* (the index's shape for
gather/scatter, the output's for index_select, the source's for index_add), reading
three tensors through their own strides: the index, the tensor read from and the tensor
written to. The one tensor addressed through the index (``self`` of gather, the target
of scatter) has stride 0 at ``dim`` in the iteration and its ``dim`` stride separate.
Before launching, dims all three tensors lay out alike are merged, so contiguous inputs
of any rank become at most three dims (those before ``dim``, ``dim``, those after).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, check_supported
from gemsops.ops.grid import cdiv

__all__ = ["INDEX_DTYPES", "MAX_RANK", "VALUE_DTYPES", "as_bits", "check_index",
           "check_value", "launch", "merge_dims", "same_device", "wrap_dim"]

INDEX_DTYPES = (torch.int32, torch.int64)
"""The index dtypes torch's gather, scatter, index_select and index_add take."""

VALUE_DTYPES: tuple[torch.dtype, ...] = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
"""The dtypes these kernels move or add (complex is torch's)."""

MAX_RANK = 4
"""Dims the kernel addresses after merging; more is handed back to torch."""

GATHER, STORE, ADD = 0, 1, 2
"""Kernel modes: read through the index, write through it, add through it (atomics)."""

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@kernel("index_strided", key=["n"])
@triton.jit
def _index_kernel(
    Idx,  # the index, read through si*
    Src,  # read through ss* (+ Idx * stride_dim in GATHER mode)
    Dst,  # written through sd* (+ Idx * stride_dim in STORE / ADD modes)
    Alpha,  # [1] scale of the added source (ADD mode with HAS_ALPHA)
    n,  # positions in the iteration shape
    S1, S2, S3,  # iteration sizes of dims 1..3 (dim 0 is n / (S1 * S2 * S3))
    si0, si1, si2, si3,
    ss0, ss1, ss2, ss3,
    sd0, sd1, sd2, sd3,
    stride_dim,  # the indexed tensor's stride along dim
    size_dim,  # its size along dim: indices must lie in [0, size_dim)
    MODE: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    i3 = offs % S3
    rest = offs // S3
    i2 = rest % S2
    rest = rest // S2
    i1 = rest % S1
    i0 = rest // S1
    idx = tl.load(Idx + (i0 * si0 + i1 * si1 + i2 * si2 + i3 * si3), mask=live, other=0)
    idx = idx.to(tl.int64)
    tl.device_assert(~live | ((idx >= 0) & (idx < size_dim)), "index out of bounds")
    # An out-of-range index touches nothing (torch raises there; see the package notes).
    ok = live & (idx >= 0) & (idx < size_dim)
    src = Src + (i0 * ss0 + i1 * ss1 + i2 * ss2 + i3 * ss3)
    dst = Dst + (i0 * sd0 + i1 * sd1 + i2 * sd2 + i3 * sd3)
    if MODE == 0:
        vals = tl.load(src + idx * stride_dim, mask=ok)
        tl.store(dst, vals, mask=live)
    elif MODE == 1:
        vals = tl.load(src, mask=ok)
        tl.store(dst + idx * stride_dim, vals, mask=ok)
    else:
        vals = tl.load(src, mask=ok, other=0).to(Dst.dtype.element_ty)
        if HAS_ALPHA:
            vals = vals * tl.load(Alpha)
        tl.atomic_add(dst + idx * stride_dim, vals, mask=ok)


def wrap_dim(dim: int, rank: int) -> int:
    """``dim`` in ``[0, rank)`` (a 0-dim tensor counts as rank 1), or Unsupported."""
    rank = max(rank, 1)
    if not -rank <= dim < rank:
        raise Unsupported(f"dim {dim} out of range for rank {rank} (torch raises)")
    return dim % rank


def same_device(*tensors: Tensor) -> None:
    """Unsupported unless every tensor is strided and on the first one's device."""
    device = tensors[0].device
    for t in tensors:
        if t.layout != torch.strided or t.device != device:
            raise Unsupported("tensors on different devices or of a non-strided layout")


def check_value(t: Tensor) -> None:
    """Unsupported for a dtype these kernels do not move (complex, float8, ...)."""
    if t.dtype not in VALUE_DTYPES:
        raise Unsupported(f"indexing a tensor of {t.dtype}")
    check_supported(t.dtype)


def check_index(index: Tensor, size: int) -> None:
    """Unsupported for an index dtype torch refuses; IndexError for an index outside
    ``[0, size)`` on the CPU (no device sync there; elsewhere lanes are masked)."""
    if index.dtype not in INDEX_DTYPES:
        raise Unsupported(f"index of dtype {index.dtype} (torch takes int32/int64)")
    if index.is_cpu and index.numel():
        # numpy: no aten op that could re-enter gemsops.
        arr = index.detach().numpy()
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= size:
            bad = lo if lo < 0 else hi
            raise IndexError(f"index {bad} is out of bounds for dimension with size {size}")


def as_bits(t: Tensor) -> Tensor:
    """``t`` viewed as the integer dtype of its width: a copy moves bits, never values."""
    return t.view(_BITS[t.element_size()]) if t.dtype != _BITS[t.element_size()] else t


def merge_dims(shape: Sequence[int], strides: Sequence[Sequence[int]]
               ) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours every tensor lays out alike.

    Returns:
        The merged sizes and each tensor's strides for them (at least one dim).
    """
    keep = [d for d, s in enumerate(shape) if s != 1]
    sizes: list[int] = []
    out: list[list[int]] = [[] for _ in strides]
    for d in keep:
        if sizes and all(st[d] * shape[d] == o[-1] for st, o in zip(strides, out, strict=True)):
            sizes[-1] *= shape[d]
            for st, o in zip(strides, out, strict=True):
                o[-1] = st[d]
            continue
        sizes.append(shape[d])
        for st, o in zip(strides, out, strict=True):
            o.append(st[d])
    if not sizes:
        return [1], [[0] for _ in strides]
    return sizes, out


def launch(mode: int, shape: Sequence[int], index: Tensor, idx_strides: Sequence[int],
           src: Tensor, src_strides: Sequence[int], dst: Tensor, dst_strides: Sequence[int],
           stride_dim: int, size_dim: int, alpha: Tensor | None = None) -> None:
    """Run the strided index kernel over ``shape`` (see the module docstring).

    Raises:
        Unsupported: more than :data:`MAX_RANK` dims left after merging.
    """
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return
    sizes, (si, ss, sd) = merge_dims(shape, (idx_strides, src_strides, dst_strides))
    if len(sizes) > MAX_RANK:
        raise Unsupported(f"{len(sizes)} dims of differing layouts (the kernel takes "
                          f"{MAX_RANK})")
    pad = MAX_RANK - len(sizes)
    sizes = [1] * pad + sizes
    si, ss, sd = ([0] * pad + si, [0] * pad + ss, [0] * pad + sd)
    consts = _CONSTS[(mode, alpha is not None)]
    _index_kernel.launch(
        lambda meta: (cdiv(n, meta["BLOCK"]),),
        (index, src, dst, alpha if alpha is not None else dst, n, *sizes[1:],
         *si, *ss, *sd, stride_dim, size_dim),
        consts,
    )


_CONSTS: dict[tuple[int, bool], dict[str, Any]] = {
    (mode, has_alpha): {"MODE": mode, "HAS_ALPHA": has_alpha}
    for mode in (GATHER, STORE, ADD) for has_alpha in (False, True)
}  # one dict per key, never changed, so the launcher recognises it
