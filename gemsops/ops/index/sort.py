"""sort: the values of each row along a dim in order, with the indices they came from.

A program sorts ROWS rows of up to ``MAX_LENGTH`` elements in registers with a
bitonic network over (key, index) pairs. Keys are integers that order as torch orders
the values: a float's bits with the magnitude flipped when negative (so the signed key
orders as the float), every nan (any sign or payload) the largest key and -0.0 the key
of 0.0 (torch ranks them equal); integers and bool are their own keys; a descending
sort complements the key. Comparing (key, index) pairs makes every sort stable: equal
values keep their original order, ascending or descending, as torch's ``stable=True``.
Padding lanes get the largest key and indices past the row, so they sort last. The
values are then read back through the sorted indices (bits, nan payloads included).
Longer rows are handed back to torch.
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

__all__ = ["MAX_LENGTH", "sort"]

MAX_LENGTH = 4096
"""The longest row sorted; a longer one is handed back to torch."""

_TILE = 4096
"""Elements one program holds at most: short rows are sorted several to a program."""

_BITS = {torch.float16: tl.int16, torch.bfloat16: tl.int16, torch.float32: tl.int32,
         torch.float64: tl.int64}


@triton.jit
def _exchange(key, idx, SIZE: tl.constexpr, J: tl.constexpr, ROWS: tl.constexpr,
              L: tl.constexpr):
    """One compare-exchange step of the bitonic network: each position ``i`` meets
    ``i ^ J``; within blocks of SIZE the pair is put in ascending order where
    ``i & SIZE`` is 0, descending elsewhere (SIZE == L: ascending everywhere)."""
    shape: tl.constexpr = [ROWS, L // (2 * J), 2, J]
    k = tl.reshape(key, shape)
    i = tl.reshape(idx, shape)
    # The partner's key and index: the pair's sum less one's own (a wrapping integer
    # sum, exact whatever it overflows to).
    kp = tl.sum(k, 2, keep_dims=True) - k
    ip = tl.sum(i, 2, keep_dims=True) - i
    right = tl.reshape(tl.arange(0, 2), [1, 1, 2, 1])
    block = tl.reshape(tl.arange(0, L // (2 * J)) * (2 * J), [1, L // (2 * J), 1, 1])
    down = ((block & SIZE) != 0).to(tl.int32)
    bigger = (k > kp) | ((k == kp) & (i > ip))
    take = bigger != ((right ^ down) != 0)
    k = tl.where(take, kp, k)
    i = tl.where(take, ip, i)
    return tl.reshape(k, [ROWS, L]), tl.reshape(i, [ROWS, L])


@kernel("sort", key=["N"])
@triton.jit
def _sort_kernel(
    X,  # row r = (o, i): element n at o * sx_o + i * sx_i + n * sx_n
    OV,  # sorted values, (rows, N) contiguous in (o, i) order... see so_*
    OI,  # their int64 indices, laid out as OV
    R,  # rows
    N,  # row length
    inner,  # rows are (o, i) pairs, i < inner
    sx_o, sx_i, sx_n,
    so_o, so_i, so_n,
    DESCENDING: tl.constexpr,
    BITS: tl.constexpr,  # the float's same-width integer type (None: integer values)
    KEY: tl.constexpr,  # key type: int32, or int64 for 64-bit values
    KEY_BITS: tl.constexpr,
    ROWS: tl.constexpr,
    L: tl.constexpr,  # padded row length, a power of two >= 2
    LOG_L: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < R
    o = rows // inner
    i = rows % inner
    n = tl.arange(0, L)
    live = row_ok[:, None] & (n < N)[None, :]
    x_row = o * sx_o + i * sx_i
    x = tl.load(X + (x_row[:, None] + n.to(tl.int64)[None, :] * sx_n), mask=live, other=0)
    low = tl.full((1, 1), 1, KEY) << (KEY_BITS - 1)  # the key type's minimum
    top = ~low  # its maximum
    if BITS is not None:
        key = x.to(BITS, bitcast=True).to(KEY)  # sign-extended bits
        key = key ^ ((key >> (KEY_BITS - 1)) & top)
        key = tl.where(x != x, top, key)  # every nan: the largest key
        key = tl.where(x == 0, 0, key)  # -0.0 ranks as 0.0
    else:
        key = x.to(KEY)
    if DESCENDING:
        key = ~key
    key = tl.where(live, key, top)
    idx = tl.zeros((ROWS, L), tl.int32) + n[None, :]
    for s in tl.static_range(1, LOG_L + 1):
        for t in tl.static_range(s):
            key, idx = _exchange(key, idx, 1 << s, 1 << (s - 1 - t), ROWS, L)
    vals = tl.load(X + (x_row[:, None] + idx.to(tl.int64) * sx_n), mask=live)
    o_off = (o * so_o + i * so_i)[:, None] + n.to(tl.int64)[None, :] * so_n
    tl.store(OV + o_off, vals, mask=live)
    tl.store(OI + o_off, idx.to(tl.int64), mask=live)


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _consts(dtype: torch.dtype, descending: bool, rows: int, length: int) -> dict[str, Any]:
    key = (dtype, descending, rows, length)
    hit = _CONSTS.get(key)
    if hit is None:  # one dict per key, never changed, so the launcher recognises it
        wide = dtype in (torch.float64, torch.int64)
        hit = _CONSTS[key] = {
            "DESCENDING": descending, "BITS": _BITS.get(dtype),
            "KEY": tl.int64 if wide else tl.int32, "KEY_BITS": 64 if wide else 32,
            "ROWS": rows, "L": length, "LOG_L": length.bit_length() - 1}
    return hit


@op("sort.stable", out="sort.values_stable")
def sort_stable(self: Tensor, *, stable: bool | None = None, dim: int = -1,
                descending: bool = False) -> tuple[Tensor, Tensor]:
    """aten's ``sort.stable``: :func:`sort` (every sort is stable)."""
    return sort(self, dim, descending)


@op("sort.default", out="sort.values")
def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """The values of ``self`` sorted along ``dim``, and the int64 indices they came from.

    Stable: equal values keep their order (also when descending). nan ranks above
    every value, as in torch; -0.0 and 0.0 rank equal.

    Args:
        self: Float, integer or bool values (any strides).
        dim: The dim sorted along.
        descending: Largest first.

    Returns:
        ``(values, indices)``, contiguous, ``self``'s shape.

    Raises:
        Unsupported: a dtype without a kernel (complex), or a row longer than
            ``MAX_LENGTH``.
    """
    same_device(self)
    if self.dtype not in (*FLOAT_DTYPES, *INT_DTYPES, torch.bool):
        raise Unsupported(f"sort of {self.dtype}")
    check_supported(self.dtype)
    d = wrap_dim(dim, self.dim())
    N = self.shape[d] if self.dim() else 1
    if N > MAX_LENGTH:
        raise Unsupported(f"sort of rows of {N} elements (the kernel sorts up to {MAX_LENGTH})")
    values = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    indices = torch.empty(self.shape, dtype=torch.int64, device=self.device)
    if self.numel() == 0:
        return values, indices
    shape = self.shape if self.dim() else (1,)
    outer = 1
    for s in shape[:d]:
        outer *= s
    inner = self.numel() // (outer * N)
    x = self.reshape(outer, N, inner)  # a view where the layout allows
    src = x.view(torch.uint8) if x.dtype == torch.bool else x
    ov = values.view(torch.uint8) if values.dtype == torch.bool else values
    length = next_power_of_2(max(N, 2))
    rows = outer * inner
    per = min(max(1, _TILE // length), next_power_of_2(rows))
    _sort_kernel.launch(
        (cdiv(rows, per),),
        (src, ov, indices, rows, N, inner, x.stride(0), x.stride(2), x.stride(1),
         N * inner, 1, inner),
        _consts(self.dtype, bool(descending), per, length))
    return values, indices
