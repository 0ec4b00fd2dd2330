"""topk: the k largest (or smallest) values of each row along a dim, with their indices.

Values are compared as integer keys that order like torch: a float's bits, its
magnitude bits flipped when negative, so the signed key orders as the float does, with
every nan (any sign or payload) given the largest key (torch ranks nan largest);
integers are their own keys; ``largest=False`` complements the key. A program takes a
chunk of a row and picks its best key k times (a max, then the lowest index holding
it, which is retired). A row longer than one chunk is done in rounds: each chunk's k
best (value, index) candidates go to a buffer, and the next round picks from those,
until one chunk holds them all. Results are always sorted (best first); among equal
values the lower index comes first (torch leaves that order unspecified).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, check_supported
from gemsops.ops.grid import cdiv, next_power_of_2
from gemsops.ops.index.kernels import same_device, wrap_dim

__all__ = ["MAX_K", "topk"]

MAX_K = 128
"""The largest k served; a larger k is handed back to torch."""

_CHUNK = 1024
"""Elements of a row one program takes at most (at least 4 * the padded k)."""

_BITS = {torch.float16: tl.int16, torch.bfloat16: tl.int16, torch.float32: tl.int32,
         torch.float64: tl.int64}
_INF = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80, torch.float32: 0x7F800000,
        torch.float64: 0x7FF0000000000000}
_BIG = tl.constexpr(2**62)  # above every index


@kernel("topk", key=["L"])
@triton.jit
def _topk_kernel(
    X,  # values: row r = (o, i) at o * sx_o + i * sx_i, element n at + n * sx_n
    XI,  # their indices in the original row (HAS_IDX), laid out as X
    OV,  # the k best values of each chunk: at o * so_o + i * so_i + c * so_c + j * so_k
    OI,  # their int64 indices (-1 where a chunk held fewer than k)
    L,  # row length
    K,
    inner,  # rows are (o, i) pairs, i < inner
    sx_o, sx_i, sx_n,
    so_o, so_i, so_c, so_k,
    HAS_IDX: tl.constexpr,
    LARGEST: tl.constexpr,
    BITS: tl.constexpr,  # the float's same-width integer type (None: integer values)
    KEY: tl.constexpr,  # key type: int32, or int64 for 64-bit values
    KEY_BITS: tl.constexpr,
    MAG: tl.constexpr,  # a float's magnitude bits (0x7FFF for 16-bit floats)
    INF: tl.constexpr,  # inf's magnitude: a larger one is a nan
    CHUNK: tl.constexpr,
    KBLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    o = row // inner
    i = row % inner
    n = c * CHUNK + tl.arange(0, CHUNK)
    live = n < L
    x_off = o * sx_o + i * sx_i + n.to(tl.int64) * sx_n
    x = tl.load(X + x_off, mask=live, other=0)
    if HAS_IDX:
        orig = tl.load(XI + x_off, mask=live, other=-1)
        live = live & (orig >= 0)
    else:
        orig = n.to(tl.int64)
    low = tl.full((1,), 1, KEY) << (KEY_BITS - 1)  # the key type's minimum
    flip = ~low  # its magnitude bits
    if BITS is not None:
        key = x.to(BITS, bitcast=True).to(KEY)  # sign-extended bits
        # Every nan (magnitude above inf's, either sign) becomes the largest key.
        is_nan = (key & MAG) > INF
        key = key ^ ((key >> (KEY_BITS - 1)) & flip)
        key = tl.where(is_nan, tl.full((CHUNK,), 0, KEY) + flip, key)
    else:
        key = x.to(KEY)
    if not LARGEST:
        key = ~key
    floor = tl.full((CHUNK,), 0, KEY) + low
    none = tl.full((CHUNK,), _BIG, tl.int64)
    kr = tl.arange(0, KBLOCK)
    best_keys = tl.full((KBLOCK,), 0, KEY)
    best_idx = tl.full((KBLOCK,), -1, tl.int64)
    for j in range(K):
        top = tl.max(tl.where(live, key, floor), 0)
        pick = tl.min(tl.where(live & (key == top), orig, none), 0)
        best_keys = tl.where(kr == j, top, best_keys)
        best_idx = tl.where((kr == j) & (pick != _BIG), pick, best_idx)
        live = live & (orig != pick)
    # Keys back to values (the key map is its own inverse on the sign-kept bits).
    if not LARGEST:
        best_keys = ~best_keys
    if BITS is not None:
        bits = best_keys ^ ((best_keys >> (KEY_BITS - 1)) & flip)
        vals = bits.to(BITS).to(OV.dtype.element_ty, bitcast=True)
    else:
        vals = best_keys.to(OV.dtype.element_ty)
    o_off = o * so_o + i * so_i + c * so_c + kr.to(tl.int64) * so_k
    tl.store(OV + o_off, vals, mask=kr < K)
    tl.store(OI + o_off, best_idx, mask=kr < K)


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _consts(dtype: torch.dtype, has_idx: bool, largest: bool, chunk: int,
            kblock: int) -> dict[str, Any]:
    key = (dtype, has_idx, largest, chunk, kblock)
    hit = _CONSTS.get(key)
    if hit is None:
        wide = dtype in (torch.float64, torch.int64)
        hit = _CONSTS[key] = {
            "HAS_IDX": has_idx, "LARGEST": largest, "BITS": _BITS.get(dtype),
            "KEY": tl.int64 if wide else tl.int32, "KEY_BITS": 64 if wide else 32,
            "MAG": (1 << (8 * dtype.itemsize - 1)) - 1, "INF": _INF.get(dtype, 0),
            "CHUNK": chunk, "KBLOCK": kblock}
    return hit


@op("topk.default", out="topk.values")
def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values along ``dim`` and their int64 indices.

    Args:
        self: Float or integer values (any strides), at least 1-D.
        k: How many, ``0 <= k <= min(self.size(dim), 128)``.
        dim: The dim selected along.
        largest: The largest values (nan ranks above everything), else the smallest.
        sorted: Ignored: the results always come best first.

    Returns:
        ``(values, indices)``, contiguous, ``self``'s shape with ``dim`` of size ``k``.

    Raises:
        Unsupported: a 0-dim or bool input, ``k`` out of range or above 128.
    """
    same_device(self)
    if self.dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise Unsupported(f"topk of {self.dtype}")
    check_supported(self.dtype)
    if self.dim() == 0:
        raise Unsupported("topk of a 0-dim tensor")
    d = wrap_dim(dim, self.dim())
    k = int(k)
    N = self.shape[d]
    if not 0 <= k <= N:
        raise Unsupported(f"k={k} out of range for a dim of {N} (torch raises)")
    if k > MAX_K:
        raise Unsupported(f"k={k} above {MAX_K}")
    shape = list(self.shape)
    shape[d] = k
    values = torch.empty(shape, dtype=self.dtype, device=self.device)
    indices = torch.empty(shape, dtype=torch.int64, device=self.device)
    outer = 1
    for s in self.shape[:d]:
        outer *= s
    inner = 1
    for s in self.shape[d + 1:]:
        inner *= s
    rows = outer * inner
    if rows == 0 or k == 0:
        return values, indices
    x = self.reshape(outer, N, inner)  # a view where the layout allows
    kblock = next_power_of_2(k)
    chunk_max = max(_CHUNK, 4 * kblock)
    src, src_idx = x, x
    sx = (x.stride(0), x.stride(2), x.stride(1))
    L, has_idx = N, False
    while True:
        chunk = min(next_power_of_2(L), chunk_max)
        chunks = cdiv(L, chunk)
        if chunks == 1:
            ov, oi = values, indices
            so = (k * inner, 1, 0, inner)
        else:
            width = chunks * k
            ov = torch.empty((rows, width), dtype=self.dtype, device=self.device)
            oi = torch.empty((rows, width), dtype=torch.int64, device=self.device)
            so = (inner * width, width, k, 1)
        _topk_kernel.launch(
            (rows, chunks),
            (src, src_idx, ov, oi, L, k, inner, *sx, *so),
            _consts(self.dtype, has_idx, bool(largest), chunk, kblock))
        if chunks == 1:
            return values, indices
        src, src_idx = ov, oi
        sx = (inner * width, width, 1)
        L, has_idx = width, True
