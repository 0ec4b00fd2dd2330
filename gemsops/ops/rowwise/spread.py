"""How spread out values are: var, std, std_mean and the vector p-norms, over any dims.

``var``, ``std`` and ``std_mean`` are the var_mean kernels of
:mod:`gemsops.ops.rowwise.stats` (one Welford pass, torch's ``correction``), the
standard deviation its variance's square root. ``linalg_vector_norm`` (and aten's
legacy ``norm`` overloads) is its own reduction over the (M, N) or (M, N, K) views of
:mod:`gemsops.ops.rowwise.layout`: each element is mapped in the accumulator dtype
(``|x|^2``, ``|x|``, ``x != 0`` or ``|x|^p``), the lines are summed (or their largest
or smallest ``|x|`` taken, for ``ord = +-inf``), and the sum is mapped back
(``sqrt``, ``s^(1/p)``). Half types accumulate in float32, as torch's kernels do. Long
lines with few outputs are split over programs and finished by a second launch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, acc_dtype
from gemsops.ops.outputs import write_out, write_outs
from gemsops.ops.pointwise.activation import sqrt
from gemsops.ops.rowwise.layout import (
    check_dtype,
    check_input,
    dim_list,
    part_buffer,
    part_layout,
    plan,
    reduced_shape,
    split,
    tl_dtype,
)
from gemsops.ops.rowwise.stats import _var_mean
from gemsops.ops.rowwise.tiles import chunk_tile, launch, mid_block, row_block, split_bounds
from gemsops.ops.rowwise.value import _max_nan, _min_nan

__all__ = ["linalg_vector_norm", "norm", "std", "std_mean", "var"]


# --- var, std, std_mean ------------------------------------------------------------


def _dof_warning(name: str) -> None:
    warnings.warn(
        f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than the "
        "reduction factor (input numel divided by output numel).",
        UserWarning,
        stacklevel=3,
    )


@op("var.correction")
def var(x: Tensor, dim: int | Sequence[int] | None = None, *,
        correction: float | None = None, keepdim: bool = False) -> Tensor:
    """Variance over ``dim`` (all dims when None or empty), like ``torch.var``.

    The sum of squared deviations is divided by ``max(0, N - correction)``
    (``correction`` defaults to 1); no degrees of freedom give inf or nan and torch's
    warning. Half types accumulate in float32.

    Raises:
        RuntimeError: ``x`` is not floating point (torch raises its own error).
        Unsupported: complex inputs; on the CPU, an infinite or huge input.
    """
    v, _, no_dof = _var_mean(x, dim, correction, keepdim)
    if no_dof:
        _dof_warning("var")
    return v


@op("std.correction")
def std(x: Tensor, dim: int | Sequence[int] | None = None, *,
        correction: float | None = None, keepdim: bool = False) -> Tensor:
    """Standard deviation over ``dim``: the square root of :func:`var`, like ``torch.std``."""
    v, _, no_dof = _var_mean(x, dim, correction, keepdim)
    if no_dof:
        _dof_warning("std")
    return sqrt(v, out=v, inplace=True)


@op("std_mean.correction")
def std_mean(x: Tensor, dim: int | Sequence[int] | None = None, *,
             correction: float | None = None, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` over ``dim`` in one pass, like ``torch.std_mean``."""
    v, mean, no_dof = _var_mean(x, dim, correction, keepdim)
    if no_dof:
        _dof_warning("std_mean")
    return sqrt(v, out=v, inplace=True), mean


# The out= forms are declared directly rather than derived: torch warns after writing,
# so a call the writer hands to torch (an out it would cast or resize) gets torch's
# warning alone.


@op("var.correction_out", public=False)
def _var_out(self: Tensor, dim: Sequence[int] | None = None, *,
             correction: float | None = None, keepdim: bool = False, out: Tensor) -> Tensor:
    """aten's ``var.correction_out``."""
    v, _, no_dof = _var_mean(self, dim, correction, keepdim)
    result = write_out(out, v, self)
    if no_dof:
        _dof_warning("var")
    return result


@op("std.correction_out", public=False)
def _std_out(self: Tensor, dim: Sequence[int] | None = None, *,
             correction: float | None = None, keepdim: bool = False, out: Tensor) -> Tensor:
    """aten's ``std.correction_out``."""
    v, _, no_dof = _var_mean(self, dim, correction, keepdim)
    result = write_out(out, sqrt(v, out=v, inplace=True), self)
    if no_dof:
        _dof_warning("std")
    return result


@op("std_mean.correction_out", public=False)
def _std_mean_out(self: Tensor, dim: Sequence[int] | None = None, *,
                  correction: float | None = None, keepdim: bool = False, out0: Tensor,
                  out1: Tensor) -> tuple[Tensor, Tensor]:
    """aten's ``std_mean.correction_out``."""
    v, mean, no_dof = _var_mean(self, dim, correction, keepdim)
    result = write_outs((out0, out1), (sqrt(v, out=v, inplace=True), mean), self)
    if no_dof:
        _dof_warning("std_mean")
    return result[0], result[1]


# --- vector norms ------------------------------------------------------------------

TWO, ONE, MAX, MIN, COUNT, POWER = 0, 1, 2, 3, 4, 5
"""The KIND codes of the norm kernels: ord 2, 1, inf, -inf, 0 and any other p."""


@triton.jit
def _pow(a, p):
    # a >= 0 (or nan): a ** p as exp2(p log2 a); 0 and inf come out as the limits
    # (0 ** p is 0 for p > 0 and inf for p < 0).
    return tl.exp2(tl.log2(a) * p)


@triton.jit
def _element(x, P, KIND: tl.constexpr):
    """What one element adds to its line's norm (``x`` in the accumulator dtype)."""
    if KIND == 0:
        r = x * x
    elif KIND == 4:
        r = (x != 0).to(x.dtype)  # nan counts: it is not zero
    elif KIND == 5:
        r = _pow(tl.abs(x), P)
    else:
        r = tl.abs(x)
    return r


@triton.jit
def _fold(acc, r, KIND: tl.constexpr):
    if KIND == 2:
        out = _max_nan(acc, r)
    elif KIND == 3:
        out = _min_nan(acc, r)
    else:
        out = acc + r
    return out


@triton.jit
def _fold_axis(acc, AXIS: tl.constexpr, KIND: tl.constexpr):
    if KIND == 2:
        out = tl.reduce(acc, AXIS, _max_nan)
    elif KIND == 3:
        out = tl.reduce(acc, AXIS, _min_nan)
    else:
        out = tl.sum(acc, AXIS)
    return out


@triton.jit
def _finish(s, INV_P, KIND: tl.constexpr, FINAL: tl.constexpr):
    """The norm from a line's fold (only on the final pass)."""
    if FINAL:
        if KIND == 0:
            s = tl.sqrt(s)
        elif KIND == 5:
            s = _pow(s, INV_P)
    return s


@kernel("vector_norm_rows", key=["M", "N"])
@triton.jit
def _norm_rows_kernel(
    X,  # x[m, n] at X + m * stride_m + n * stride_n (partial folds when not MAP)
    OUT,  # (M, S) contiguous, S = programs per row (grid axis 1)
    M,
    N,
    stride_m,
    stride_n,
    CHUNK,  # elements of a row one split covers (N when a row is not split)
    P,  # the norm's order (KIND == POWER)
    INV_P,  # 1 / P
    KIND: tl.constexpr,
    ACC: tl.constexpr,
    INIT: tl.constexpr,  # the fold's identity (0, or inf for the -inf norm)
    MAP: tl.constexpr,  # map raw elements (first pass), else fold partial results
    FINAL: tl.constexpr,  # finish the norm (sqrt, 1/p power) and store it
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, row_ok = row_block(M, BLOCK_M)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    row_ptr = X + rows.to(tl.int64)[:, None] * stride_m
    cols = tl.arange(0, BLOCK_N)
    acc = tl.full((BLOCK_M, BLOCK_N), INIT, ACC)
    step_n = tl.cast(stride_n, tl.int64)
    for start in range(lo, hi, BLOCK_N):
        _, _, mask, ptr = chunk_tile(start, cols, hi, row_ptr, row_ok, step_n, stride_n, 1)
        x = tl.load(ptr, mask=mask, other=0.0).to(ACC)
        if MAP:
            x = _element(x, P, KIND)
        acc = _fold(acc, tl.where(mask, x, INIT), KIND)
    res = _finish(_fold_axis(acc, 1, KIND), INV_P, KIND, FINAL)
    tl.store(OUT + rows.to(tl.int64) * parts + part, res, mask=row_ok)


@kernel("vector_norm_mid", key=["M", "N", "K"])
@triton.jit
def _norm_mid_kernel(
    X,  # x[m, n, k] at X + m * stride_m + n * stride_n + k
    OUT,  # (M, S, K) contiguous
    M,
    N,
    K,
    stride_m,
    stride_n,
    CHUNK,
    P,
    INV_P,
    KIND: tl.constexpr,
    ACC: tl.constexpr,
    INIT: tl.constexpr,
    MAP: tl.constexpr,
    FINAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    m, ks, k_ok = mid_block(K, BLOCK_K)
    part, parts, lo, hi = split_bounds(CHUNK, N)
    base = X + m * stride_m + ks[None, :]
    ns = tl.arange(0, BLOCK_N)
    acc = tl.full((BLOCK_N, BLOCK_K), INIT, ACC)
    step_n = tl.cast(stride_n, tl.int64)
    for start in range(lo, hi, BLOCK_N):
        _, _, mask, ptr = chunk_tile(start, ns, hi, base, k_ok, step_n, stride_n, 0)
        x = tl.load(ptr, mask=mask, other=0.0).to(ACC)
        if MAP:
            x = _element(x, P, KIND)
        acc = _fold(acc, tl.where(mask, x, INIT), KIND)
    res = _finish(_fold_axis(acc, 0, KIND), INV_P, KIND, FINAL)
    tl.store(OUT + (m * parts + part) * K + ks, res, mask=k_ok)


_CONSTS: dict[tuple[int, torch.dtype, bool, bool], dict[str, Any]] = {}


def _consts(kind: int, acc: torch.dtype, map_: bool, final: bool) -> dict[str, Any]:
    key = (kind, acc, map_, final)
    hit = _CONSTS.get(key)
    if hit is None:  # one dict per key, never changed, so the launcher recognises it
        hit = _CONSTS[key] = {"KIND": kind, "ACC": tl_dtype(acc),
                              "INIT": math.inf if kind == MIN else 0.0, "MAP": map_,
                              "FINAL": final}
    return hit


def _kind(ord: float) -> int:
    if ord == 2:
        return TWO
    if ord == 1:
        return ONE
    if ord == math.inf:
        return MAX
    if ord == -math.inf:
        return MIN
    if ord == 0:
        return COUNT
    return POWER


def _order(ord: Any) -> float:
    if isinstance(ord, (complex, Tensor)) or ord is None:
        raise Unsupported(f"norm order {ord!r}")
    p = float(ord)
    if math.isnan(p):
        raise Unsupported("a nan norm order")
    return p


def _norm(x: Tensor, p: float, dim: int | Sequence[int] | None, keepdim: bool,
          dtype: torch.dtype | None, name: str) -> Tensor:
    check_input(x)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. "
                           f"Got {x.dtype}")
    out_dtype = x.dtype if dtype is None else dtype
    if out_dtype not in FLOAT_DTYPES:
        raise Unsupported(f"norm result dtype {out_dtype}")
    if dtype is not None and torch.promote_types(x.dtype, dtype) != dtype:
        raise RuntimeError(f"{name}: the dtype of the input ({x.dtype}) should be convertible "
                           f"without narrowing to the specified dtype ({dtype})")
    check_dtype(out_dtype)
    if x.dim() == 0:
        x, keepdim = x.reshape(1), False
    dims = dim_list(dim, x.dim())
    kind = _kind(p)
    if (kind in (MIN, MAX) or p < 0) and any(x.shape[d] == 0 for d in dims):
        raise RuntimeError(f"{name} cannot compute the {p} norm on an empty dimension "
                           "because the operation does not have an identity")
    out = torch.empty(reduced_shape(x.shape, dims, keepdim), dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    acc = acc_dtype(out_dtype)
    lay = plan(x, dims)
    assert lay is not None  # copy=True (the default)
    inv = 1.0 / p if kind == POWER else 1.0
    parts, chunk = split(lay)
    if parts == 1:
        launch(_norm_rows_kernel, _norm_mid_kernel, lay, (out,), (lay.N, p, inv),
               _consts(kind, acc, True, True), 1)
        return out
    partial = part_buffer(lay, parts, acc)
    launch(_norm_rows_kernel, _norm_mid_kernel, lay, (partial,), (chunk, p, inv),
           _consts(kind, acc, True, False), parts)
    launch(_norm_rows_kernel, _norm_mid_kernel, part_layout(lay, partial), (out,),
           (parts, p, inv), _consts(kind, acc, False, True), 1)
    return out


@op("linalg_vector_norm.default", out="linalg_vector_norm.out")
def linalg_vector_norm(x: Tensor, ord: Any = 2, dim: int | Sequence[int] | None = None,
                       keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Tensor:
    """The vector ``ord``-norm over ``dim`` (all dims when None or empty), like
    ``torch.linalg.vector_norm``: ``sum(|x|^ord)^(1/ord)``, the largest or smallest ``|x|``
    for ``ord = +-inf``, the count of nonzeros for ``ord = 0``.

    Args:
        x: Floating-point input (any strides).
        ord: The order (a real number or +-inf).
        dim: Dim or dims to reduce.
        keepdim: Keep reduced dims with size 1.
        dtype: Result dtype (at least as wide as ``x``'s); ``x`` is converted first.

    Raises:
        RuntimeError: an integer input, a narrowing ``dtype``, or a norm without an
            identity (``ord`` negative or infinite) over an empty dim (torch raises).
        Unsupported: complex inputs or a complex order.
    """
    return _norm(x, _order(ord), dim, keepdim, dtype, "linalg.vector_norm")


@op("norm.ScalarOpt_dim", "norm.ScalarOpt_dim_dtype", "norm.Scalar", "norm.ScalarOpt_dtype",
    out=("norm.out", "norm.dtype_out", "norm.Scalar_out"), public=False)
def norm(x: Tensor, p: Any = 2, dim: Sequence[int] | None = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> Tensor:
    """aten's legacy ``norm`` overloads (``p=None`` is 2): :func:`linalg_vector_norm`."""
    return _norm(x, 2.0 if p is None else _order(p), dim, keepdim, dtype, "norm")
