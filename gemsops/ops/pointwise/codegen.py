"""The pointwise generator: two kernel templates, specialised per op, and their launchers.

Every pointwise op is one element function from :mod:`gemsops.ops.pointwise.elementwise`
passed to a template as the constexpr ``OP``, so Triton compiles one kernel per (op,
template, operand kinds, dtypes) and caches it; no source is generated as text.

* :func:`launch_flat` (``_flat_kernel``): every full operand and the output share one
  dense layout (contiguous, or e.g. all transposed alike): a 1-D sweep over memory with
  vectorised loads. The common case.
* :func:`launch_strided` (``_tiled_kernel``): broadcasting or mixed layouts. Dims that
  are contiguous in every operand are merged first; the innermost remaining dim (the
  output's smallest stride) becomes the *columns* and up to four outer dims the *rows*
  of a 2-D problem. A program takes a tile of rows x columns: each row's offsets come
  from its index once per row (divisions per row and per program, none per element),
  the columns are a plain ``arange`` times the column stride, so unit-stride operands
  load as wide vectors. An operand broadcast along the rows (a bias row) is loaded once per tile as
  one ``[1, columns]`` vector and reused by every row of the tile; one broadcast along
  the columns (a ``[M, 1]`` scale) is loaded once per row. With more than
  :data:`MAX_RANK` dims left the operands are copied out contiguous and swept flat.

Both read their tile size ``BLOCK`` (elements per program) from the ``pointwise``
tuning entry; the tiled kernel splits it into ``BLOCK_C`` columns (at most the
launch's ``WIDTH``, a power of two chosen so the column tiles pad a row by little)
and ``BLOCK // BLOCK_C`` rows. Problems too small to be worth benchmarking launch the
entry's first config (:func:`_prune_small`).

Each operand reaches a kernel as one of the kinds below, with two casts: ``V*`` to the
common dtype (as torch casts inputs), then ``T*`` to the compute dtype (float32 for half
types: torch's "opmath"). The result is rounded to the result dtype ``R`` when the
output's dtype differs, as torch computes in the result dtype before casting to ``out``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.kernel import kernel

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
def _cast(v, VIA: tl.constexpr, TO: tl.constexpr):
    """``v`` cast to VIA (the common dtype), then to TO (the compute dtype); None: no cast."""
    if VIA is not None:
        if VIA.is_floating() and VIA.primitive_bitwidth == 16 and v.dtype != VIA:
            v = to_half(v, VIA)
        else:
            v = v.to(VIA)
    if TO is not None:
        v = v.to(TO)
    return v


@triton.jit
def _scalar(x, KIND: tl.constexpr):
    """A scalar operand's value: one element loaded (SINGLE), a float64's bits, or as is."""
    if KIND == 3:
        v = tl.load(x)
    elif KIND == 2:
        v = x.to(tl.int64).to(tl.float64, bitcast=True)
    else:
        v = x
    return v


@triton.jit
def _operand(x, offs, mask, KIND: tl.constexpr, VIA: tl.constexpr, TO: tl.constexpr):
    """One operand's values at ``offs``, cast to VIA then TO (None: no cast)."""
    if KIND == 0:
        v = _cast(tl.load(x + offs, mask=mask), VIA, TO)
    else:
        # Scalars become blocks: the splat costs nothing on a device, and the interpreter
        # mistypes comparisons of 0-d values (a bool result keeps the float dtype).
        v = tl.broadcast_to(_cast(_scalar(x, KIND), VIA, TO), offs.shape)
    return v


@triton.jit
def _apply_store(out, oo, a, b, c, mask, OP: tl.constexpr, NARGS: tl.constexpr,
                 R: tl.constexpr):
    """Apply OP to the operand values (already in the compute dtype), store at ``out + oo``."""
    if NARGS == 1:
        r = OP(a)
    elif NARGS == 2:
        r = OP(a, b)
    else:
        r = OP(a, b, c)
    if R is not None:
        if R.is_floating() and R.primitive_bitwidth == 16 and r.dtype != R:
            r = to_half(r, R)
        else:
            r = r.to(R)
    ot = out.dtype.element_ty
    if ot.is_floating() and ot.primitive_bitwidth == 16 and r.dtype != ot:
        r = to_half(r, ot)
    tl.store(out + oo, r.to(ot), mask=mask)


@triton.jit
def _evaluate_store(out, oo, x0, x1, x2, oa, ob, oc, mask,
                    OP: tl.constexpr, NARGS: tl.constexpr,
                    K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
                    V0: tl.constexpr, V1: tl.constexpr, V2: tl.constexpr,
                    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr, R: tl.constexpr):
    """Load the operands at their offsets, apply OP, store at ``out + oo``."""
    a = _operand(x0, oa, mask, K0, V0, T0)
    b = a
    c = a
    if NARGS >= 2:
        b = _operand(x1, ob, mask, K1, V1, T1)
    if NARGS == 3:
        c = _operand(x2, oc, mask, K2, V2, T2)
    _apply_store(out, oo, a, b, c, mask, OP, NARGS, R)


SMALL = 1 << 20
"""Problems of fewer elements launch the tuning entry's first config without
benchmarking the others: the kernel takes microseconds, its launch as long."""


def _prune_small(configs: Sequence[Any], named: dict[str, Any], **_: Any) -> list[Any]:
    """The configs worth benchmarking for a launch: all of them, or the first for a
    problem under :data:`SMALL` elements (``SIZE_CLASS`` is the count's bit length)."""
    if named["SIZE_CLASS"] <= SMALL.bit_length() - 1:
        return [configs[0]]
    return list(configs)


# restore_value: where a tuning file lists several configs, benchmarking runs the kernel
# repeatedly, and an in-place op's output is also its input.
@kernel("pointwise", key=["SIZE_CLASS", "OP"], restore_value=["out"],
          prune=_prune_small)
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


@triton.jit
def _row_offsets(i1, i2, i3, i4, s1, s2, s3, s4, OUTER: tl.constexpr):
    """A view's offsets of the tile's rows, from their indices along the outer dims."""
    if OUTER == 0:  # noqa: SIM108 - a static if in Triton, not a select
        o = i1 * 0
    else:
        o = i1 * s1
    if OUTER >= 2:
        o += i2 * s2
    if OUTER >= 3:
        o += i3 * s3
    if OUTER >= 4:
        o += i4 * s4
    return o


@triton.jit
def _tile_operand(x, ro, cols, s0, row_ok, col_ok, mask,
                  KIND: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                  VIA: tl.constexpr, TO: tl.constexpr):
    """One operand's values over a tile, cast to VIA then TO.

    ``ro`` are the operand's offsets of the tile's rows and ``s0`` its column stride.
    ROWS / COLS say whether it varies along the rows / the columns: one broadcast along
    the rows is loaded once as a ``[1, BLOCK_C]`` vector, one broadcast along the columns
    once per row, and either is cast before it is broadcast over the tile.
    """
    if KIND != 0:
        v = tl.broadcast_to(_cast(_scalar(x, KIND), VIA, TO), mask.shape)
    elif ROWS and COLS:
        v = _cast(tl.load(x + (ro[:, None] + cols[None, :] * s0), mask=mask), VIA, TO)
    elif COLS:
        v = _cast(tl.load(x + cols[None, :] * s0, mask=col_ok[None, :]), VIA, TO)
        v = tl.broadcast_to(v, mask.shape)
    else:
        v = _cast(tl.load(x + ro[:, None], mask=row_ok[:, None]), VIA, TO)
        v = tl.broadcast_to(v, mask.shape)
    return v


@kernel("pointwise", key=["SIZE_CLASS", "OP"], restore_value=["out"],
          prune=_prune_small)
@triton.jit(do_not_specialize=["SIZE_CLASS"])
def _tiled_kernel(
    out, x0, x1, x2,  # as in _flat_kernel
    rows,  # rows of the 2-D problem: the product of the outer dims
    cols,  # columns: the size of the innermost dim
    SIZE_CLASS,  # the element count's bit length: the tuning key, unused in the body
    d1, d2, d3,  # outer sizes, innermost first (the outermost is implied by rows)
    so0, so1, so2, so3, so4,  # output strides: the columns', then the outer dims'
    sa0, sa1, sa2, sa3, sa4,  # operand 0 strides (0 along broadcast dims)
    sb0, sb1, sb2, sb3, sb4,  # operand 1 strides
    sc0, sc1, sc2, sc3, sc4,  # operand 2 strides
    OP: tl.constexpr, NARGS: tl.constexpr,
    K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
    V0: tl.constexpr, V1: tl.constexpr, V2: tl.constexpr,
    T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
    R: tl.constexpr,
    ROWS0: tl.constexpr, ROWS1: tl.constexpr, ROWS2: tl.constexpr,  # operand varies by row
    COLS0: tl.constexpr, COLS1: tl.constexpr, COLS2: tl.constexpr,  # ... by column
    OUTER: tl.constexpr,  # outer dims in use, 0..4
    INT64: tl.constexpr,
    WIDTH: tl.constexpr,  # the widest column tile (a power of two)
    BLOCK: tl.constexpr,  # elements per tile
):
    BLOCK_C: tl.constexpr = BLOCK if BLOCK < WIDTH else WIDTH
    BLOCK_R: tl.constexpr = BLOCK // BLOCK_C
    pid = tl.program_id(0)
    col_tiles = tl.cdiv(cols, BLOCK_C)
    tile_r = pid // col_tiles  # one division per program, by the column tile count
    tile_c = pid - tile_r * col_tiles
    if INT64:
        r = tile_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tile_c.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    else:
        r = tile_r * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tile_c * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = r < rows
    col_ok = c < cols
    mask = row_ok[:, None] & col_ok[None, :]
    # The rows' indices along the outer dims: per row, never per element.
    i1, rem = _split(r, d1, OUTER <= 1)
    i2 = i1
    i3 = i1
    i4 = i1
    if OUTER >= 2:
        i2, rem = _split(rem, d2, OUTER == 2)
    if OUTER >= 3:
        i3, rem = _split(rem, d3, OUTER == 3)
    if OUTER >= 4:
        i4 = rem
    a = _tile_operand(x0, _row_offsets(i1, i2, i3, i4, sa1, sa2, sa3, sa4, OUTER), c, sa0,
                      row_ok, col_ok, mask, K0, ROWS0, COLS0, V0, T0)
    b = a
    e = a
    if NARGS >= 2:
        b = _tile_operand(x1, _row_offsets(i1, i2, i3, i4, sb1, sb2, sb3, sb4, OUTER), c,
                          sb0, row_ok, col_ok, mask, K1, ROWS1, COLS1, V1, T1)
    if NARGS == 3:
        e = _tile_operand(x2, _row_offsets(i1, i2, i3, i4, sc1, sc2, sc3, sc4, OUTER), c,
                          sc0, row_ok, col_ok, mask, K2, ROWS2, COLS2, V2, T2)
    oo = _row_offsets(i1, i2, i3, i4, so1, so2, so3, so4, OUTER)[:, None] + c[None, :] * so0
    _apply_store(out, oo, a, b, e, mask, OP, NARGS, R)


def _grid(n: int) -> Any:
    # Plain integer arithmetic: triton.cdiv is a jit function, slow to call on the host.
    return lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)


Launch = tuple[Any, Any, tuple[Any, ...], dict[str, Any]]
"""(kernel, grid, positional arguments, constant keywords) of one launch, as a ``rec``
list of the launch functions receives it: what the pointwise plan memo replays."""


def launch_flat(out: Tensor, args: Sequence[Any], meta: dict[str, Any],
                rec: list[Launch] | None = None) -> None:
    """Sweep ``out``'s memory once; full operands share its dense layout.

    Args:
        out: The output (non-empty, dense).
        args: Three operand arguments (tensors, scalars, or None when absent).
        meta: The constexprs: OP, NARGS, K*, V*, T*, R.
        rec: When given, the launch is appended to it before it is made.
    """
    n = out.numel()
    launch_flat_planned(out, args, n, _keywords(meta, _INT64[n >= 2**31]), rec)


_INT64 = {False: {"INT64": False}, True: {"INT64": True}}


def launch_flat_planned(out: Tensor, args: Sequence[Any], n: int, meta: dict[str, Any],
                        rec: list[Launch] | None = None) -> None:
    """:func:`launch_flat` with ``n = out.numel()`` known and ``meta`` complete (INT64 too).

    ``meta`` is passed to the kernel as it is and must not be changed afterwards: the
    fast path hands the same cached dict to every launch.
    """
    grid = _grid(n)
    call = (out, args[0], args[1], args[2], n, n.bit_length())
    if rec is not None:
        rec.append((_flat_kernel, grid, call, meta))
    _flat_kernel.launch(grid, call, meta)


WIDEST = 2048
"""The widest column tile the tiled kernel is given (``WIDTH``); wider rows take several.

4 KB of a half-type row is contiguous enough for whole memory transactions, and tiles
of ``BLOCK`` > 2048 elements then stack rows: a bias row broadcast along them is loaded
once per 2-4 rows, and a transposed operand's reads share cache lines across them."""


def column_width(cols: int) -> int:
    """The widest column tile (a power of two) for rows of ``cols`` elements.

    Short rows take the power of two at or above them (at most half the lanes idle, and
    no index arithmetic per element). Longer ones take the widest tile whose multiples
    pad a row by at most an eighth: 1025 columns take tiles of 128 (1152 lanes), not two
    of 1024. Tiles narrower than a program's ``BLOCK`` stack several rows in a program.
    """
    top = 1 << max(cols - 1, 0).bit_length()  # the power of two at or above cols
    if cols <= 16:
        return top
    width = min(top, WIDEST)
    while width > 16 and -(-cols // width) * width * 8 > cols * 9:
        width //= 2
    return width


class _Geometry(NamedTuple):
    """How :func:`launch_strided` lays a problem out for the tiled kernel (cached)."""

    rows: int
    cols: int
    sizes: tuple[int, ...]  # the outer sizes d1, d2, d3
    strides: tuple[int, ...]  # the output's five strides, then each operand's five
    consts: dict[str, Any]  # the layout's constexprs (never changed)


@functools.lru_cache(maxsize=1024)
def _geometry(shape: tuple[int, ...], views: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
              loaded: tuple[int, ...]) -> _Geometry | None:
    """The tiled layout of ``shape`` over ``views`` (the output's, then each loaded
    operand's (shape, strides)); ``loaded`` are the operands' positions. None when more
    than :data:`MAX_RANK` dims are left after merging."""
    rank = len(shape)
    strides = []
    for vshape, vstrides in views:
        st = [0] * rank
        for k, (size, stride) in enumerate(zip(vshape, vstrides, strict=True), rank - len(vshape)):
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
        return None
    merged.reverse()  # innermost first: the columns, then the outer dims
    if not merged:
        merged = [(1, [0] * len(views))]
    pad = MAX_RANK - len(merged)
    sizes = [m[0] for m in merged] + [1] * pad
    per_view = [[m[1][v] for m in merged] + [0] * pad for v in range(len(views))]
    operand_strides = [[0] * MAX_RANK for _ in range(3)]
    vary_rows = [False] * 3
    vary_cols = [False] * 3
    for v, i in enumerate(loaded, 1):
        operand_strides[i] = per_view[v]
        vary_cols[i] = per_view[v][0] != 0
        vary_rows[i] = any(per_view[v][1:])
    n = math.prod(shape)
    reach = max(sum((s - 1) * st for s, st in zip(sizes, pv, strict=True)) for pv in per_view)
    consts = {
        "ROWS0": vary_rows[0], "ROWS1": vary_rows[1], "ROWS2": vary_rows[2],
        "COLS0": vary_cols[0], "COLS1": vary_cols[1], "COLS2": vary_cols[2],
        "OUTER": len(merged) - 1,
        "INT64": n >= 2**31 or reach >= 2**31, "WIDTH": column_width(sizes[0]),
    }
    return _Geometry(n // sizes[0], sizes[0], tuple(sizes[1:4]),
                     (*per_view[0], *operand_strides[0], *operand_strides[1],
                      *operand_strides[2]), consts)


_KEYWORDS: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}


def _keywords(meta: dict[str, Any], consts: dict[str, Any]) -> dict[str, Any]:
    """``{**meta, **consts}``, the same dict object again for the same two (kept) dicts:
    the launcher recognises keyword dicts by identity, so a fresh one per call would be
    frozen and hashed again on every launch."""
    key = (id(meta), id(consts))
    hit = _KEYWORDS.get(key)
    if hit is not None and hit[0] is meta and hit[1] is consts:
        return hit[2]
    merged = {**meta, **consts}
    if len(_KEYWORDS) >= 1024:
        _KEYWORDS.clear()
    _KEYWORDS[key] = (meta, consts, merged)
    return merged


def launch_strided(out: Tensor, args: Sequence[Any], kinds: Sequence[int],
                   shape: tuple[int, ...], meta: dict[str, Any],
                   rec: list[Launch] | None = None) -> None:
    """Compute into ``out`` (of ``shape``, any layout) from broadcast, strided operands
    (``rec`` as in :func:`launch_flat`; a problem of too many dims records nothing)."""
    loaded = tuple(i for i in range(3) if kinds[i] == LOAD)
    views = ((tuple(out.shape), out.stride()),
             *((tuple(args[i].shape), args[i].stride()) for i in loaded))
    geo = _geometry(tuple(shape), views, loaded)
    if geo is None:
        _launch_materialized(out, args, kinds, shape, meta)
        return
    cols, rows, width = geo.cols, geo.rows, geo.consts["WIDTH"]

    def grid(launch_meta: dict[str, Any]) -> tuple[int]:
        block_c = min(launch_meta["BLOCK"], width)
        return (-(-cols // block_c) * -(-rows // (launch_meta["BLOCK"] // block_c)),)

    call = (out, args[0], args[1], args[2], rows, cols, (rows * cols).bit_length(), *geo.sizes,
            *geo.strides)
    keywords = _keywords(meta, geo.consts)
    if rec is not None:
        rec.append((_tiled_kernel, grid, call, keywords))
    _tiled_kernel.launch(grid, call, keywords)


def _launch_materialized(out: Tensor, args: Sequence[Any], kinds: Sequence[int],
                         shape: tuple[int, ...], meta: dict[str, Any]) -> None:
    """More dims than the strided kernel takes: copy the operands out, sweep flat."""
    flat_args = [a.expand(shape).contiguous() if k == LOAD else a
                 for a, k in zip(args, kinds, strict=True)]
    dest = out if out.is_contiguous() else torch.empty(shape, dtype=out.dtype, device=out.device)
    launch_flat(dest, flat_args, meta)
    if dest is not out:
        out.copy_(dest)
