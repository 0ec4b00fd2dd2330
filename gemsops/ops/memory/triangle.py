"""Triangles of matrices: ``tril`` and ``triu`` (functional, ``out=`` and in place), batched.

``tril(x, k)`` keeps the elements with ``col - row <= k`` of each matrix in the last two
dims and zeroes the rest; ``triu`` keeps ``col - row >= k``. One kernel does both: each
program takes ``BLOCK`` elements of the flattened (batch, row, col) index space, finds
each element's row and column, and stores the element or zero. Zeroed elements are never
read (the load is masked off); in place only the zeroed elements are written.

The batch dims are walked with one stride per tensor: they are merged where memory
allows (always for the contiguous result of the functional form). An input whose batch
dims do not merge is copied contiguous first; an ``out=`` or in-place tensor whose batch
dims do not merge gets the result through a contiguous buffer.

The result is contiguous (aten allocates it so); ``out=`` is resized when empty, and
torch decides an ``out`` of another shape, dtype or device, or one overlapping the input.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.grid import cdiv
from gemsops.ops.memory.copy import check_input
from gemsops.ops.pointwise.arith import COPY
from gemsops.ops.pointwise.iterator import run

__all__ = ["tril", "triu"]


# One element per lane, memory bound like the pointwise kernels; its own tuning entry
# (the pointwise entry's rows name the element function, which this kernel has not).
@kernel("triangle", key=["SIZE_CLASS"], restore_value=["Out"])
@triton.jit(do_not_specialize=["SIZE_CLASS", "K"])
def _triangle_kernel(
    X, Out,  # input and output (the same tensor in place)
    n, M, N,  # elements, rows and columns of each matrix
    K,  # the diagonal, clamped to [-M, N]
    sxb, sxm, sxn,  # input strides: batch, row, column
    sob, som, son,  # output strides
    SIZE_CLASS,  # n.bit_length(): the tuning key, unused in the body
    LOWER: tl.constexpr,  # tril (keep col - row <= K), else triu (keep col - row >= K)
    INPLACE: tl.constexpr,  # X is Out: write the zeroed elements only
    INT64: tl.constexpr,  # offsets need 64 bits
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if INT64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    col = offs % N
    rest = offs // N
    row = rest % M
    batch = rest // M
    keep = col - row <= K if LOWER else col - row >= K
    o = batch * sob + row * som + col * son
    if INPLACE:
        zero = tl.zeros((BLOCK,), Out.dtype.element_ty)
        tl.store(Out + o, zero, mask=mask & ~keep)
    else:
        v = tl.load(X + batch * sxb + row * sxm + col * sxn, mask=mask & keep, other=0)
        tl.store(Out + o, v, mask=mask)




def _batch_stride(t: Tensor) -> int | None:
    """The one stride that walks every batch dim of ``t`` (dims before the last two), or
    None when they do not merge."""
    dims = [(size, stride) for size, stride in zip(t.shape[:-2], t.stride()[:-2], strict=True)
            if size != 1]
    if not dims:
        return 0
    for (_, outer), (size, inner) in itertools.pairwise(dims):
        if outer != inner * size:
            return None
    return dims[-1][1]


def _extent(t: Tensor) -> int:
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _launch(x: Tensor, out: Tensor, k: int, lower: bool, inplace: bool) -> None:
    """Run the kernel from ``x`` into ``out`` (same shape, batch dims merging in both)."""
    sxb, sob = _batch_stride(x), _batch_stride(out)
    assert sxb is not None and sob is not None
    n = out.numel()
    M, N = out.shape[-2], out.shape[-1]
    k = max(-M, min(N, k))  # the same triangle, and a value that fits 32 bits
    int64 = max(n, _extent(x) + 1, _extent(out) + 1) >= 2**31
    _triangle_kernel.launch(
        lambda meta: (cdiv(n, meta["BLOCK"]),),
        (x, out, n, M, N, k, sxb, x.stride(-2), x.stride(-1), sob, out.stride(-2),
         out.stride(-1), n.bit_length()),
        {"LOWER": lower, "INPLACE": inplace, "INT64": int64},
    )


def _triangle(x: Tensor, diagonal: int, out: Tensor | None, inplace: bool, lower: bool,
              name: str) -> Tensor:
    check_input(x, name)
    if x.dim() < 2:
        raise Unsupported(f"{name} of a {x.dim()}-dim tensor")  # torch raises
    k = int(diagonal)
    if inplace:
        assert out is not None
        if any(st == 0 and s > 1 for s, st in zip(x.shape, x.stride(), strict=True)):
            raise Unsupported(f"{name}_ of a tensor with overlapping elements")
        if x.numel() == 0:
            return x
        if _batch_stride(x) is not None:
            _launch(x, x, k, lower, inplace=True)
        else:
            result = _triangle(x, k, None, False, lower, name)
            run(COPY, (result,), out=x, inplace=True)
        return x
    if out is not None:
        check_input(out, f"{name} out")
        if out.dtype != x.dtype or out.device != x.device:
            raise Unsupported(f"{name} out of dtype {out.dtype} on {out.device}")  # torch raises
        if out.shape != x.shape:
            if out.numel():
                raise Unsupported(f"{name} out of shape {tuple(out.shape)}: torch resizes it "
                                  "with a warning")
        elif out.numel() and x.numel() and _overlap(out, x):
            raise Unsupported(f"{name} out overlapping its input")
        if any(st == 0 and s > 1 for s, st in zip(out.shape, out.stride(), strict=True)):
            raise Unsupported(f"{name} out with overlapping elements")
        if out.shape != x.shape:
            out.resize_(x.shape)
        target = out
    else:
        target = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return target
    if _batch_stride(x) is None:
        src = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        run(COPY, (x,), out=src, inplace=True)
        x = src
    if _batch_stride(target) is None:
        buffer = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _launch(x, buffer, k, lower, inplace=False)
        run(COPY, (buffer,), out=target, inplace=True)
    else:
        _launch(x, target, k, lower, inplace=False)
    return target


def _overlap(a: Tensor, b: Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


@op("tril.default", out="tril.out", inplace="tril_.default")
def tril(x: Tensor, diagonal: int = 0, *, out: Tensor | None = None,
         inplace: bool = False) -> Tensor:
    """The lower triangle of each matrix in ``x``'s last two dims: elements with
    ``col - row <= diagonal`` kept, the rest zero.

    Args:
        x: A tensor of at least 2 dims (any strides; the leading dims are a batch).
        diagonal: 0 is the main diagonal, positive above it, negative below.
        out: An ``out=`` tensor of ``x``'s dtype (resized when empty).
        inplace: Zero the elements of ``x`` above the triangle (``out`` is ``x``).

    Returns:
        A new contiguous tensor, ``out``, or ``x`` in place.

    Raises:
        Unsupported: fewer than 2 dims (torch raises), an ``out`` torch casts, resizes
            with a warning or finds overlapping, or a tensor the kernels do not take.
    """
    return _triangle(x, diagonal, out, inplace, True, "tril")


@op("triu.default", out="triu.out", inplace="triu_.default")
def triu(x: Tensor, diagonal: int = 0, *, out: Tensor | None = None,
         inplace: bool = False) -> Tensor:
    """The upper triangle of each matrix in ``x``'s last two dims: elements with
    ``col - row >= diagonal`` kept, the rest zero.

    Args:
        x: A tensor of at least 2 dims (any strides; the leading dims are a batch).
        diagonal: 0 is the main diagonal, positive above it, negative below.
        out: An ``out=`` tensor of ``x``'s dtype (resized when empty).
        inplace: Zero the elements of ``x`` below the triangle (``out`` is ``x``).

    Returns:
        A new contiguous tensor, ``out``, or ``x`` in place.

    Raises:
        Unsupported: fewer than 2 dims (torch raises), an ``out`` torch casts, resizes
            with a warning or finds overlapping, or a tensor the kernels do not take.
    """
    return _triangle(x, diagonal, out, inplace, False, "triu")
