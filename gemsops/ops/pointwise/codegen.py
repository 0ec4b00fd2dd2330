"""The pointwise generator: two kernel templates, specialised per op, and their launchers.

Every pointwise op is one element function from :mod:`gemsops.ops.pointwise.elementwise`
passed to a template as the constexpr ``OP``, so Triton compiles one kernel per (op,
template, operand kinds, dtypes) and caches it; no source is generated as text.

* :func:`launch_flat` (``_flat_kernel``): every full operand and the output share one
  dense layout (contiguous, or e.g. all transposed alike): a 1-D sweep over memory with
  vectorised loads. The common case.
* :func:`launch_strided` (``_strided_kernel``): broadcasting or mixed layouts. Dims that
  are contiguous in every operand are merged first; up to :data:`MAX_RANK` remain, and
  each element's offsets are computed from its index. With more, the operands are copied
  out contiguous and swept flat.

Each operand reaches a kernel as one of the kinds below, with two casts: ``V*`` to the
common dtype (as torch casts inputs), then ``T*`` to the compute dtype (float32 for half
types: torch's "opmath"). The result is rounded to the result dtype ``R`` when the
output's dtype differs, as torch computes in the result dtype before casting to ``out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.autotune import autotune

__all__ = ["BITS64", "LOAD", "MAX_RANK", "SINGLE", "VALUE", "launch_flat",
           "launch_flat_planned", "launch_strided", "to_half"]

MAX_RANK = 5
LOAD, VALUE, BITS64, SINGLE = 0, 1, 2, 3
"""Operand kinds: a pointer loaded per element; a scalar argument; a float64 scalar as its
int64 bit pattern (Triton passes Python floats as float32); a pointer to one element."""

# Whether the kernels run on the Triton interpreter: gemshal's device says (asking it
# here also resolves the device before any kernel below is built).
_INTERPRETED = tl.constexpr(gemshal.current_device().interpreter)


@triton.jit
def to_half(v, DT: tl.constexpr):
    """``v`` as float16 or bfloat16, rounded to nearest even, through float32 as torch does.

    (c10 converts every type to the half types through float.) The interpreter's own
    float32 -> bfloat16 cast truncates, so there the rounding is done on the bits.
    """
    v = v.to(tl.float32)
    if tl.bfloat16 == DT and _INTERPRETED:
        bits = v.to(tl.uint32, bitcast=True)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
        rounded = tl.where(v != v, (bits >> 16) | 0x40, rounded)  # nan stays a (quiet) nan
        r = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        r = v.to(DT)
    return r


@triton.jit
def _operand(x, offs, mask, KIND: tl.constexpr, VIA: tl.constexpr, TO: tl.constexpr):
    """One operand's values at ``offs``, cast to VIA then TO (None: no cast)."""
    if KIND == 0:
        v = tl.load(x + offs, mask=mask)
    elif KIND == 3:
        v = tl.load(x)
    elif KIND == 2:
        v = x.to(tl.int64).to(tl.float64, bitcast=True)
    else:
        v = x
    if VIA is not None:
        if VIA.is_floating() and VIA.primitive_bitwidth == 16 and v.dtype != VIA:
            v = to_half(v, VIA)
        else:
            v = v.to(VIA)
    if TO is not None:
        v = v.to(TO)
    if KIND != 0:
        # Scalars become blocks: the splat costs nothing on a device, and the interpreter
        # mistypes comparisons of 0-d values (a bool result keeps the float dtype).
        v = tl.broadcast_to(v, offs.shape)
    return v


@triton.jit
def _evaluate_store(out, oo, x0, x1, x2, oa, ob, oc, mask,
                    OP: tl.constexpr, NARGS: tl.constexpr,
                    K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
                    V0: tl.constexpr, V1: tl.constexpr, V2: tl.constexpr,
                    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, R: tl.constexpr):
    """Load the operands at their offsets, apply OP, store at ``out + oo``."""
    a = _operand(x0, oa, mask, K0, V0, T0)
    if NARGS == 1:
        r = OP(a)
    elif NARGS == 2:
        r = OP(a, _operand(x1, ob, mask, K1, V1, T1))
    else:
        r = OP(a, _operand(x1, ob, mask, K1, V1, T1), _operand(x2, oc, mask, K2, V2, T2))
    if R is not None:
        if R.is_floating() and R.primitive_bitwidth == 16 and r.dtype != R:
            r = to_half(r, R)
        else:
            r = r.to(R)
    ot = out.dtype.element_ty
    if ot.is_floating() and ot.primitive_bitwidth == 16 and r.dtype != ot:
        r = to_half(r, ot)
    tl.store(out + oo, r.to(ot), mask=mask)


# restore_value: where a tuning file lists several configs, benchmarking runs the kernel
# repeatedly, and an in-place op's output is also its input.
@autotune("pointwise", key=["SIZE_CLASS"], restore_value=["out"])
@triton.jit(do_not_specialize=["SIZE_CLASS"])
def _flat_kernel(
    out,  # output pointer (its element type is the output dtype)
    x0, x1, x2,  # operands: pointers or scalars (see K*), None when absent
    n,  # elements to write
    SIZE_CLASS,  # n.bit_length(): the tuning key, unused in the body
    OP: tl.constexpr,  # the element function
    NARGS: tl.constexpr,
    K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,  # operand kinds
    V0: tl.constexpr, V1: tl.constexpr, V2: tl.constexpr,  # cast to the common dtype
    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,  # cast to the compute dtype
    R: tl.constexpr,  # the result dtype when the output's differs (None: same)
    INT64: tl.constexpr,  # offsets need 64 bits
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if INT64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # the last program's tail
    _evaluate_store(out, offs, x0, x1, x2, offs, offs, offs, mask,
                    OP, NARGS, K0, K1, K2, V0, V1, V2, T0, T1, T2, R)


@triton.jit
def _split(rem, d, LAST: tl.constexpr):
    """The index along one dim of size d, and what is left for the outer dims."""
    if LAST:
        i = rem
    else:
        i = rem % d
        rem = rem // d
    return i, rem


@autotune("pointwise", key=["SIZE_CLASS"], restore_value=["out"])
@triton.jit(do_not_specialize=["SIZE_CLASS"])
def _strided_kernel(
    out, x0, x1, x2,  # as in _flat_kernel
    n, SIZE_CLASS,
    d0, d1, d2, d3,  # sizes, innermost dim first (the outermost size is implied by n)
    so0, so1, so2, so3, so4,  # output strides, innermost first (unused when OUT_LINEAR)
    sa0, sa1, sa2, sa3, sa4,  # operand 0 strides (0 along broadcast dims)
    sb0, sb1, sb2, sb3, sb4,  # operand 1 strides
    sc0, sc1, sc2, sc3, sc4,  # operand 2 strides
    OP: tl.constexpr, NARGS: tl.constexpr,
    K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
    V0: tl.constexpr, V1: tl.constexpr, V2: tl.constexpr,
    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
    R: tl.constexpr,
    RANK: tl.constexpr,  # dims in use, 1..5
    OUT_LINEAR: tl.constexpr,  # the output is contiguous in this dim order
    INT64: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if INT64:
        idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    i, rem = _split(idx, d0, RANK == 1)
    oo = i * so0
    oa = i * sa0
    ob = i * sb0
    oc = i * sc0
    if RANK >= 2:
        i, rem = _split(rem, d1, RANK == 2)
        oo += i * so1
        oa += i * sa1
        ob += i * sb1
        oc += i * sc1
    if RANK >= 3:
        i, rem = _split(rem, d2, RANK == 3)
        oo += i * so2
        oa += i * sa2
        ob += i * sb2
        oc += i * sc2
    if RANK >= 4:
        i, rem = _split(rem, d3, RANK == 4)
        oo += i * so3
        oa += i * sa3
        ob += i * sb3
        oc += i * sc3
    if RANK >= 5:
        oo += rem * so4
        oa += rem * sa4
        ob += rem * sb4
        oc += rem * sc4
    if OUT_LINEAR:
        oo = idx
    _evaluate_store(out, oo, x0, x1, x2, oa, ob, oc, mask,
                    OP, NARGS, K0, K1, K2, V0, V1, V2, T0, T1, T2, R)


def _grid(n: int) -> Any:
    # Plain integer arithmetic: triton.cdiv is a jit function, slow to call on the host.
    return lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)


def launch_flat(out: Tensor, args: Sequence[Any], meta: dict[str, Any]) -> None:
    """Sweep ``out``'s memory once; full operands share its dense layout.

    Args:
        out: The output (non-empty, dense).
        args: Three operand arguments (tensors, scalars, or None when absent).
        meta: The constexprs: OP, NARGS, K*, V*, T*, R.
    """
    n = out.numel()
    launch_flat_planned(out, args, n, {**meta, "INT64": n >= 2**31})


def launch_flat_planned(out: Tensor, args: Sequence[Any], n: int, meta: dict[str, Any]) -> None:
    """:func:`launch_flat` with ``n = out.numel()`` known and ``meta`` complete (INT64 too).

    ``meta`` is passed to the kernel as it is and must not be changed afterwards: the
    fast path hands the same cached dict to every launch.
    """
    with gemshal.device_guard(out):
        _flat_kernel.launch(_grid(n), (out, args[0], args[1], args[2], n, n.bit_length()), meta)


def launch_strided(out: Tensor, args: Sequence[Any], kinds: Sequence[int],
                   shape: tuple[int, ...], meta: dict[str, Any]) -> None:
    """Compute into ``out`` (of ``shape``, any layout) from broadcast, strided operands."""
    rank = len(shape)
    loaded = [i for i in range(3) if kinds[i] == LOAD]
    views = [out] + [args[i] for i in loaded]
    strides = []
    for t in views:
        st = [0] * rank
        for k, (size, stride) in enumerate(zip(t.shape, t.stride(), strict=True), rank - t.dim()):
            st[k] = stride if size != 1 else 0
        strides.append(st)
    # Iterate with the output's smallest stride innermost, so the writes stay together.
    dims = sorted((k for k in range(rank) if shape[k] != 1), key=lambda k: -strides[0][k])
    merged: list[tuple[int, list[int]]] = []  # (size, strides per view), outermost first
    for k in dims:
        size, col = shape[k], [st[k] for st in strides]
        if merged and all(p == c * size for p, c in zip(merged[-1][1], col, strict=True)):
            merged[-1] = (merged[-1][0] * size, col)
        else:
            merged.append((size, col))
    if len(merged) > MAX_RANK:
        _launch_materialized(out, args, kinds, shape, meta)
        return
    merged.reverse()  # innermost first
    pad = MAX_RANK - len(merged)
    sizes = [m[0] for m in merged] + [1] * pad
    per_view = [[m[1][v] for m in merged] + [0] * pad for v in range(len(views))]
    operand_strides = [[0] * MAX_RANK for _ in range(3)]
    for v, i in enumerate(loaded, 1):
        operand_strides[i] = per_view[v]
    n = out.numel()
    expected = 1
    linear = True
    for size, stride in zip(sizes[: len(merged)], per_view[0], strict=False):
        linear = linear and stride == expected
        expected *= size
    reach = max(sum((s - 1) * st for s, st in zip(sizes, pv, strict=True)) for pv in per_view)
    with gemshal.device_guard(out):
        _strided_kernel[_grid(n)](
            out, args[0], args[1], args[2], n, n.bit_length(),
            *sizes[:4], *per_view[0], *operand_strides[0], *operand_strides[1],
            *operand_strides[2], **meta, RANK=max(1, len(merged)), OUT_LINEAR=linear,
            INT64=n >= 2**31 or reach >= 2**31,
        )


def _launch_materialized(out: Tensor, args: Sequence[Any], kinds: Sequence[int],
                         shape: tuple[int, ...], meta: dict[str, Any]) -> None:
    """More dims than the strided kernel takes: copy the operands out, sweep flat."""
    flat_args = [a.expand(shape).contiguous() if k == LOAD else a
                 for a, k in zip(args, kinds, strict=True)]
    dest = out if out.is_contiguous() else torch.empty(shape, dtype=out.dtype, device=out.device)
    launch_flat(dest, flat_args, meta)
    if dest is not out:
        out.copy_(dest)
