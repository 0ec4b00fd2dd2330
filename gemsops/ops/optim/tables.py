"""Host side of the multi-tensor launches: the checks, the grouping, the device tables.

:func:`plan` checks a call's tensor lists once (equal lengths, one device of the
vendor's type, float dtypes the device computes in, contiguous tensors, equal shapes at
each index), groups the nonempty indices by their dtypes (usually one group) and gives
each group its int64 table (see :mod:`gemsops.ops.optim.kernels` for the layout).

**Caching.** An optimizer calls with the same lists every step, so a table is kept,
keyed by its own contents (tile starts, element counts, data pointers): a hit is
exact, and costs building and hashing one tuple of ints, no allocation and no
host-to-device copy. A miss makes the table with one copy. The scalar vectors are kept
the same way, keyed by their bytes (so -0.0 and 0.0 differ), which makes the per-step
constants of Adam (lr, betas, eps) hits as well. Both caches are bounded by the bytes
they hold and drop their oldest entries first.

The checks cannot be cached: a tensor at the same address may have another shape,
dtype or layout than the last call's (a ``p.data = p.data.t()``), so they run on every
call, at C speed where Python allows (``map`` over the lists).
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, check_supported
from gemsops.ops.pointwise.types import device_type

__all__ = ["Group", "layout", "plan", "reset_layout", "scalars", "set_layout", "witness"]

_DTYPE = operator.attrgetter("dtype")
_FLOATS = frozenset(FLOAT_DTYPES)
_CACHE_BYTES = 16 << 20
"""Device bytes each cache may hold (tables; scalar vectors) before dropping old entries."""


def layout(kind: str = "fused") -> tuple[int, int]:
    """(BLOCK, TILE): elements per loop step of a program, and elements per program.

    The host lays the tables out in tiles, so both are fixed here and not tuning-file
    values: a benchmarked config of another width would not match the table (the tuning
    entries hold launch keywords only). On a device the fused steps (``kind`` "fused")
    walk ``TILE // BLOCK`` steps of 4096 elements over 16384-element tiles, so their
    fixed work (the binary search of the table, its pointers, Adam's bias corrections)
    is paid once per 16384 elements. On an H100 (``.ci/optim_ab.py``, AdamW over the
    508M Llama's 75 bf16 tensors, torch's fused step beside it in the same process) that
    layout took 3.25 and 3.34 ms in two calls, against 3.53 and 3.63 ms with 2048-element
    steps over 8192-element tiles (torch 3.37 and 3.40; docs/gpu/s16/h100-a-optim.txt).
    The foreach kernels (``kind`` "foreach": a search and a load or two per program)
    keep one 2048-element step per program, the layout they ran fastest in (7.53 ms on
    that H100 against 7.61 at 4096x16384; torch's foreach 8.88). On the interpreter one
    step per program is fastest. :func:`set_layout` applies to both kinds.
    """
    if kind not in ("fused", "foreach"):
        raise ValueError(f"layout kind {kind!r}: 'fused' or 'foreach'")
    if not _LAYOUT:
        on_cpu = gemshal.current_device().interpreter
        _LAYOUT.append({"fused": (1024, 1024) if on_cpu else (4096, 16384),
                        "foreach": (1024, 1024) if on_cpu else (2048, 2048)})
    return _LAYOUT[0][kind]


def set_layout(block: int, tile: int) -> None:
    """Use ``block``-wide steps over ``tile``-wide programs from now on (tests: several
    steps and tiles over small tensors). ``tile`` is a multiple of ``block``, both
    powers of two."""
    if block <= 0 or block & (block - 1) or tile % block or tile & (tile - 1):
        raise ValueError(f"layout ({block}, {tile}): powers of two, tile a multiple of block")
    _LAYOUT[:] = [{"fused": (block, tile), "foreach": (block, tile)}]


def reset_layout() -> None:
    """Back to the device's default :func:`layout` (chosen on the next call)."""
    _LAYOUT.clear()


_LAYOUT: list[dict[str, tuple[int, int]]] = []  # per kind; set_layout sets both


class Group:
    """The indices of one dtype signature and their device table."""

    __slots__ = ("aligned", "blocks", "dtypes", "indices", "steps", "table", "tensors")

    def __init__(self, indices: list[int] | None, dtypes: tuple[torch.dtype, ...],
                 table: Tensor, tensors: int, blocks: int, aligned: bool = False) -> None:
        self.indices = indices
        """Positions in the lists (None: every position, in order)."""
        self.dtypes = dtypes
        """One dtype per list (inputs, then the output list if any)."""
        self.table = table
        self.tensors = tensors
        self.blocks = blocks
        """Programs of the launch (the grid): tiles of the group's tensors."""
        self.steps = (tensors - 1).bit_length()
        """Halvings of the kernels' binary search."""
        self.aligned = aligned
        """Every data pointer of the lists (the side lists aside) is 16-byte aligned: the
        kernels' ``ALIGNED``, which lets them load 16 bytes at a time."""

    @property
    def acc(self) -> torch.dtype:
        """The compute dtype: float64 when a list is float64, else float32."""
        return torch.float64 if torch.float64 in self.dtypes else torch.float32

    def pick(self, values: Sequence[Any]) -> list[Any]:
        """``values`` (one per list position) at this group's positions."""
        return list(values) if self.indices is None else [values[i] for i in self.indices]


def _check(name: str, lists: Sequence[Sequence[Tensor]]) -> torch.device:
    """The device of the lists' tensors; Unsupported naming the first bad value."""
    n = len(lists[0])
    for k, lst in enumerate(lists):
        if len(lst) != n:
            raise Unsupported(f"{name}: list {k} holds {len(lst)} tensors, list 0 holds {n}")
    first = lists[0][0]
    device = first.device
    if device.type != device_type():
        raise Unsupported(f"{name}: tensors on {device}; the kernels run on {device_type()}")
    index = first.get_device()
    sizes = tuple(map(Tensor.size, lists[0]))
    for k, lst in enumerate(lists):
        devices = list(map(Tensor.get_device, lst))
        if devices.count(index) != n:  # C-speed scans: this runs for every tensor
            where = sorted({str(t.device) for t in lst})
            raise Unsupported(f"{name}: list {k} has tensors on {', '.join(where)}")
        if not all(map(Tensor.is_contiguous, lst)):
            i = next(i for i, t in enumerate(lst) if not t.is_contiguous())
            raise Unsupported(f"{name}: list {k}[{i}] is not contiguous "
                              f"(strides {tuple(lst[i].stride())})")
        if k and tuple(map(Tensor.size, lst)) != sizes:
            i = next(i for i, t in enumerate(lst) if t.shape != sizes[i])
            raise Unsupported(f"{name}: list {k}[{i}] has shape {tuple(lst[i].shape)}, "
                              f"list 0[{i}] {tuple(sizes[i])}")
    return device


def _check_side(name: str, lst: Sequence[Tensor], n: int, device: torch.device) -> None:
    if len(lst) != n:
        raise Unsupported(f"{name}: {len(lst)} step tensors for {n} parameters")
    index = device.index if device.index is not None else -1
    devices = list(map(Tensor.get_device, lst))
    if devices.count(index) != n:
        i = next(i for i, d in enumerate(devices) if d != index)
        raise Unsupported(f"{name}: state_steps[{i}] on {lst[i].device}, the tensors on {device}")
    numels = list(map(Tensor.numel, lst))
    if numels.count(1) != n:
        i = next(i for i, k in enumerate(numels) if k != 1)
        raise Unsupported(f"{name}: state_steps[{i}] holds {numels[i]} values, not 1")


def check_dtypes(name: str, dtypes: set[torch.dtype]) -> None:
    """Unsupported unless every dtype is a float dtype the device computes in."""
    for dtype in dtypes:
        if dtype not in _FLOATS:
            raise Unsupported(f"{name}: dtype {dtype} (the kernels take float16, bfloat16, "
                              "float32 and float64)")
        check_supported(dtype)


def plan(name: str, lists: Sequence[Sequence[Tensor]],
         result: Callable[[tuple[torch.dtype, ...]], torch.dtype] | None = None,
         side: Sequence[Sequence[Tensor]] = (),
         kind: str = "fused",
         ) -> tuple[list[Group], list[Tensor] | None]:
    """Check ``lists``, group their nonempty positions by dtypes, with tables.

    Args:
        name: The op, for messages.
        lists: The lists read (and written in place): at least one, equally long, not
            empty.
        result: For an op with new outputs, the output dtype of a position from its
            input dtypes: the outputs are allocated here (like the inputs) and laid out
            after ``lists`` in the tables.
        side: Lists of one-element tensors, one per position (Adam's steps), laid out
            after ``lists``; checked for their device, dtype and size only.
        kind: Whose tile width the tables use (:func:`layout`): "fused" or "foreach".

    Returns:
        The groups (none when every tensor is empty), and the outputs or None.

    Raises:
        Unsupported: a list of another length, a tensor on another device or of a dtype
            the kernels do not take, a non-contiguous tensor, shapes that differ.
    """
    device = _check(name, lists)
    for lst in side:
        _check_side(name, lst, len(lists[0]), device)
    every = [*lists, *side]
    per_list = [tuple(map(_DTYPE, lst)) for lst in every]
    check_dtypes(name, set(itertools.chain.from_iterable(per_list)))
    uniform = all(len(set(d)) == 1 for d in per_list)
    outs: list[Tensor] | None = None
    if result is not None:
        if uniform:
            dtype = result(tuple(d[0] for d in per_list))
            outs = [torch.empty_like(t, dtype=dtype) for t in lists[0]]
            per_list.append((dtype,) * len(outs))
        else:
            dtypes = [result(sig) for sig in zip(*per_list, strict=True)]
            outs = [torch.empty_like(t, dtype=d) for t, d in zip(lists[0], dtypes, strict=True)]
            per_list.append(tuple(dtypes))
        every.append(outs)
    numels = list(map(Tensor.numel, lists[0]))
    buckets: dict[tuple[torch.dtype, ...], list[int] | None] = {}
    if uniform:
        nonempty = [i for i, k in enumerate(numels) if k]
        if nonempty:
            indices = None if len(nonempty) == len(numels) else nonempty
            buckets[tuple(d[0] for d in per_list)] = indices
    else:
        for i, sig in enumerate(zip(*per_list, strict=True)):
            if numels[i]:
                held = buckets.setdefault(sig, [])
                assert held is not None
                held.append(i)
    groups = []
    width = layout(kind)[1]
    for signature, indices in buckets.items():
        ns = numels if indices is None else [numels[i] for i in indices]
        starts = list(itertools.accumulate((-(-k // width) for k in ns), initial=0))
        content = starts[:-1] + ns
        for lst in every:
            if indices is None:
                content.extend(map(Tensor.data_ptr, lst))
            else:
                content.extend(lst[i].data_ptr() for i in indices)
        t = len(ns)
        # Data pointers: the lists' (after starts and counts) and the outputs' (last); the
        # side lists' (one-element steps, between them) are read as scalars.
        data = [(2 * t, (2 + len(lists)) * t)]
        if outs is not None:
            data.append((len(content) - t, len(content)))
        table, aligned = _table(tuple(content), data, device)
        groups.append(Group(indices, signature, table, t, starts[-1], aligned))
    return groups, outs


class _Bounded:
    """A dict of device tensors, each with a flag, bounded by the tensors' total bytes;
    the oldest go first."""

    def __init__(self, limit: int) -> None:
        self.items: dict[Any, tuple[Tensor, bool]] = {}
        self.bytes = 0
        self.limit = limit

    def get(self, key: Any) -> tuple[Tensor, bool] | None:
        return self.items.get(key)

    def put(self, key: Any, value: Tensor, flag: bool = False) -> tuple[Tensor, bool]:
        size = value.numel() * value.element_size()
        while self.items and self.bytes + size > self.limit:
            old, _ = self.items.pop(next(iter(self.items)))
            self.bytes -= old.numel() * old.element_size()
        item = self.items[key] = (value, flag)
        self.bytes += size
        return item


_TABLES = _Bounded(_CACHE_BYTES)
_SCALARS = _Bounded(_CACHE_BYTES)
_WITNESSES: dict[tuple[torch.dtype, torch.device], Tensor] = {}


def _table(content: tuple[int, ...], data: Sequence[tuple[int, int]],
           device: torch.device) -> tuple[Tensor, bool]:
    """The device table of ``content``, and whether its data pointers (the slices
    ``data`` of it) are all 16-byte aligned; both kept for the next call."""
    key = (device, content)
    hit = _TABLES.get(key)
    if hit is None:
        aligned = not any(p & 15 for a, b in data for p in content[a:b])
        hit = _TABLES.put(key, torch.tensor(content, dtype=torch.int64, device=device),
                          aligned)
    return hit


def scalars(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``values`` as a device vector of ``dtype`` (rounded once, as torch casts a scalar
    to the compute type), kept for the next call with the same bits."""
    if not values:
        return witness(dtype, device)
    key = (device, dtype, struct.pack(f"{len(values)}d", *values))
    hit = _SCALARS.get(key)
    if hit is None:
        hit = _SCALARS.put(key, torch.tensor(values, dtype=dtype, device=device))
    return hit[0]


def witness(dtype: torch.dtype, device: torch.device) -> Tensor:
    """A one-element tensor of ``dtype``: a kernel casts table pointers to its pointer
    type. It is never read or written."""
    key = (dtype, device)
    hit = _WITNESSES.get(key)
    if hit is None:
        hit = _WITNESSES[key] = torch.empty(1, dtype=dtype, device=device)
    return hit


def clear() -> None:
    """Drop the kept tables and scalar vectors (tests; memory)."""
    for cache in (_TABLES, _SCALARS):
        cache.items.clear()
        cache.bytes = 0
