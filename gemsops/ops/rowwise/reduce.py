"""The reductions' public ops: sum, mean, prod, amax, amin and max / min, over any dims.

This module holds torch's rules (result dtypes, errors) and each op's aten declaration;
the kernels and the pass planning are in :mod:`gemsops.ops.rowwise.value`. The ``out=``
overloads are derived (:mod:`gemsops.declare`): the result is computed, with every
check that refuses an input, before anything is written into ``out``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.ops.pointwise.arith import ne
from gemsops.ops.replay import replayable
from gemsops.ops.rowwise.index import max_dim, min_dim
from gemsops.ops.rowwise.layout import check_dtype, check_input, dim_list
from gemsops.ops.rowwise.value import MAX, MIN, PROD, SUM, reduce
from gemsops.ops.rowwise.value import _recipe as _reduce_recipe

__all__ = ["all", "amax", "amin", "any", "max", "mean", "min", "prod", "sum"]


def _sum_dtype(x: Tensor, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.int64 if not x.dtype.is_floating_point else x.dtype


_TORCH_NAMES = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
}


def _mean_dtype(x: Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """mean's result dtype; integer results raise torch's RuntimeError."""
    result = x.dtype if dtype is None else dtype
    if not result.is_floating_point:
        which = "Input" if dtype is None else "Optional"
        name = _TORCH_NAMES.get(result, str(result))
        raise RuntimeError(
            f"mean(): could not infer output dtype. {which} dtype must be either a floating "
            f"point or complex dtype. Got: {name}"
        )
    return result


def _one_view(x: object, dim: int | Sequence[int] | None = None, keepdim: bool = False,
              *, dtype: torch.dtype | None = None, mean: bool = False) -> bool:
    """Whether a sum or mean reads ``x`` through one view, with no torch-side copy or
    conversion first: then its launches are one pass, or a split pass into a partial
    buffer it writes whole and a pass that combines it, and a replay may allocate that
    buffer afresh (``workspaces``). Other calls (a permuted copy, a conversion, dims
    apart from each other) run as written."""
    if not isinstance(x, Tensor):
        return False
    try:
        out_dtype = _mean_dtype(x, dtype) if mean else _sum_dtype(x, dtype)
        r = _reduce_recipe(tuple(x.shape), tuple(x.stride()), x.dtype,
                           dim_list(dim, x.dim()), keepdim, SUM, out_dtype, False)
    except (RuntimeError, TypeError, ValueError, IndexError):
        return False  # the call itself raises the error
    return r.view is not None and not r.convert


def _one_view_mean(x: object, dim: int | Sequence[int] | None = None, keepdim: bool = False,
                   *, dtype: torch.dtype | None = None) -> bool:
    return _one_view(x, dim, keepdim, dtype=dtype, mean=True)


@op("sum.default", "sum.dim_IntList", out=("sum.out", "sum.IntList_out"))
@replayable(when=_one_view, workspaces=True)
def sum(
    x: Tensor,
    dim: int | Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Sum over ``dim`` (all dims when None or empty), like ``torch.sum``.

    Integer and bool inputs sum to int64; half types accumulate in float32.

    Args:
        x: Input tensor.
        dim: Dim or dims to reduce.
        keepdim: Keep reduced dims with size 1.
        dtype: Result dtype; the input is converted to it before summing.
    """
    check_input(x)
    out_dtype = _sum_dtype(x, dtype)
    check_dtype(out_dtype)
    return reduce(x, dim_list(dim, x.dim()), keepdim, SUM, out_dtype)


@op("mean.default", "mean.dim", out=("mean.dtype_out", "mean.out"))
@replayable(when=_one_view_mean, workspaces=True)
def mean(
    x: Tensor,
    dim: int | Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Mean over ``dim`` (all dims when None or empty); floating results only, like torch.

    The mean of an empty reduction is nan.
    """
    check_input(x)
    out_dtype = _mean_dtype(x, dtype)
    check_dtype(out_dtype)
    dims = dim_list(dim, x.dim())
    count = math.prod(x.shape[d] for d in dims)
    return reduce(x, dims, keepdim, SUM, out_dtype, count=count)


@op("prod.default", "prod.dim_int", out=("prod.out", "prod.int_out"))
def prod(
    x: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> Tensor:
    """Product over ``dim`` (all dims when None), like ``torch.prod``; empty gives 1."""
    check_input(x)
    out_dtype = _sum_dtype(x, dtype)
    check_dtype(out_dtype)
    dims = dim_list(None, x.dim()) if dim is None else dim_list(int(dim), x.dim())
    return reduce(x, dims, keepdim if dim is not None else False, PROD, out_dtype)


def _extremum(
    name: str, op: int, x: Tensor, dim: int | Sequence[int] | None, keepdim: bool
) -> Tensor:
    check_input(x)
    dims = dim_list(dim, x.dim())
    everything = dim is None or (not isinstance(dim, int) and len(dim) == 0)
    if x.numel() == 0:
        if everything:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        for d in dims:
            if x.shape[d] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
    return reduce(x, dims, keepdim, op, x.dtype)


@op("amax.default", out="amax.out")
def amax(x: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Largest value over ``dim`` (all dims when empty); nan wins, like ``torch.amax``.

    Raises:
        IndexError: a reduced dim has size 0.
        RuntimeError: ``dim`` is empty and ``x`` has no elements.
    """
    return _extremum("amax", MAX, x, dim, keepdim)


@op("amin.default", out="amin.out")
def amin(x: Tensor, dim: int | Sequence[int] = (), keepdim: bool = False) -> Tensor:
    """Smallest value over ``dim`` (all dims when empty); nan wins, like ``torch.amin``."""
    return _extremum("amin", MIN, x, dim, keepdim)


def _truth_reduce(name: str, how: int, x: Tensor, dim: int | Sequence[int] | None,
                  keepdim: bool) -> Tensor:
    check_input(x)
    if not x.numel():
        # Nothing to reduce: all's identity is True, any's False (torch's, over every
        # reduced dim; the result's shape is what torch's meta kernel gives).
        dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        meta = torch.empty(x.shape, dtype=torch.bool, device="meta")
        shape = torch.ops.aten.all.dims(meta, dims, keepdim).shape
        dtype = torch.uint8 if x.dtype == torch.uint8 else torch.bool
        return torch.full(shape, name == "all", dtype=dtype, device=x.device)
    truth = x if x.dtype == torch.bool else ne(x, 0)
    result = _extremum(name, how, truth, () if dim is None else dim, keepdim)
    # torch keeps uint8 for uint8 inputs (its pre-bool convention); bool otherwise.
    return result.to(torch.uint8) if x.dtype == torch.uint8 else result


@op("all.default", "all.dim", "all.dims", out=("all.out", "all.dims_out", "all.all_out"))
def all(x: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Whether every element over ``dim`` (all dims when None) is nonzero, as torch.all.

    Raises:
        Unsupported: an input the reduction kernels do not take.
    """
    return _truth_reduce("all", MIN, x, dim, keepdim)


@op("any.default", "any.dim", "any.dims", out=("any.out", "any.dims_out", "any.all_out"))
def any(x: Tensor, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
    """Whether some element over ``dim`` (all dims when None) is nonzero, as torch.any.

    Raises:
        Unsupported: an input the reduction kernels do not take.
    """
    return _truth_reduce("any", MAX, x, dim, keepdim)


@op("max.default", out="max.unary_out")
def max(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """``torch.max``: the largest value of ``x``, or ``(values, indices)`` over ``dim``.

    aten's ``max.dim`` is :func:`gemsops.ops.rowwise.index.max_dim`.
    """
    if dim is None:
        return _extremum("max", MAX, x, None, False)
    return max_dim(x, dim, keepdim)


@op("min.default", out="min.unary_out")
def min(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """``torch.min``: the smallest value of ``x``, or ``(values, indices)`` over ``dim``."""
    if dim is None:
        return _extremum("min", MIN, x, None, False)
    return min_dim(x, dim, keepdim)

