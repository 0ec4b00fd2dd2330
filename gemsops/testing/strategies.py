"""Hypothesis strategies shared by the kernel tests and the conformance kit.

Sizes are governed by :data:`MAX_NUMEL`, which the ``gpu`` hypothesis profile raises
(see tests/conftest.py) so the same tests draw larger tensors on a real device.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
from hypothesis import strategies as st

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "MAX_NUMEL",
    "any_layout",
    "broadcast_pair",
    "dims_for",
    "shapes",
    "target_device",
    "tensors",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INT_DTYPES = (torch.int32, torch.int64)
MAX_NUMEL = int(os.environ.get("GEMSOPS_TEST_MAX_NUMEL", "512"))

SPECIALS = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    1e30,
    -1e30,
    1e-30,
)


@st.composite
def shapes(
    draw: st.DrawFn, *, min_rank: int = 0, max_rank: int = 4, max_numel: int | None = None
) -> tuple[int, ...]:
    """Shapes of rank ``min_rank..max_rank``: 0-size, 1-element and odd sizes included."""
    limit = MAX_NUMEL if max_numel is None else max_numel
    rank = draw(st.integers(min_rank, max_rank))
    dims: list[int] = []
    for _ in range(rank):
        budget = max(1, limit // max(1, math.prod(d for d in dims if d)))
        small = [d for d in (0, 1, 2, 3, 5, 7, 16, 33, 64, 100, 127) if d <= budget]
        dims.append(
            draw(st.sampled_from(small)) if budget < 128 else draw(st.integers(0, min(budget, 300)))
        )
    return tuple(dims)


def _fill(
    draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype, specials: bool
) -> torch.Tensor:
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    if not dtype.is_floating_point:
        low = 0 if dtype == torch.uint8 else -50  # unsigned types hold no negatives
        return torch.randint(low, 50, tuple(shape), generator=gen, dtype=dtype)
    t = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    if specials and t.numel():
        n = draw(st.integers(0, min(4, t.numel())))
        flat = t.view(-1)
        for _ in range(n):
            flat[draw(st.integers(0, t.numel() - 1))] = draw(st.sampled_from(SPECIALS))
    return t.to(dtype)


def target_device() -> torch.device:
    """Where property tests put their tensors: the current gemshal device (the CPU in CI)."""
    import gemshal

    return gemshal.current_device().torch_device


def to_target(x: torch.Tensor) -> torch.Tensor:
    """``x`` on :func:`target_device` with its strides kept (a sliced view stays sliced)."""
    device = target_device()
    if x.device == device:
        return x
    y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device)
    return y.copy_(x)


@st.composite
def tensors(
    draw: st.DrawFn,
    *,
    shape: Sequence[int] | None = None,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    specials: bool = False,
    layouts: bool = True,
    min_rank: int = 0,
    max_rank: int = 4,
) -> torch.Tensor:
    """A tensor on :func:`target_device` of a drawn dtype; maybe transposed or sliced.

    The values are reproducible from the drawn seed; ``specials`` plants inf, nan,
    -0.0, huge and tiny values.
    """
    dtype = draw(st.sampled_from(list(dtypes)))
    shp = tuple(shape) if shape is not None else draw(shapes(min_rank=min_rank, max_rank=max_rank))
    layout = (
        draw(st.sampled_from(["contiguous", "transposed", "sliced"])) if layouts else "contiguous"
    )
    if layout == "transposed" and len(shp) >= 2:
        base = _fill(draw, (*shp[:-2], shp[-1], shp[-2]), dtype, specials)
        return base.to(target_device()).transpose(-1, -2)
    if layout == "sliced" and len(shp) >= 1:
        base = _fill(draw, (*shp[:-1], shp[-1] * 2), dtype, specials)
        return base.to(target_device())[..., ::2]
    return _fill(draw, shp, dtype, specials).to(target_device())


@st.composite
def any_layout(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with special values, laid out as
    :func:`tensors` lays out (contiguous, transposed, sliced), channels-last (4-dim), or
    expanded (stride 0 along the first dim: every row reads the same memory)."""
    shape = tuple(shape)
    kind = draw(st.sampled_from(["kit", "channels_last", "expanded"]))
    if kind == "channels_last" and len(shape) == 4:
        x = draw(tensors(shape=shape, dtypes=[dtype], specials=True, layouts=False))
        return x.to(memory_format=torch.channels_last)
    if kind == "expanded" and shape:
        row = draw(tensors(shape=(1, *shape[1:]), dtypes=[dtype], specials=True))
        return row.expand(shape)
    return draw(tensors(shape=shape, dtypes=[dtype], specials=True))


@st.composite
def broadcast_pair(
    draw: st.DrawFn, *, max_rank: int = 4
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast together (some dims set to 1 or dropped on either side)."""
    full = draw(shapes(max_rank=max_rank))
    a, b = list(full), list(full)
    for i in range(len(full)):
        choice = draw(st.integers(0, 3))
        if choice == 1:
            a[i] = 1
        elif choice == 2:
            b[i] = 1
    drop = draw(st.integers(0, len(b)))
    return tuple(a), tuple(b[drop:])


@st.composite
def dims_for(draw: st.DrawFn, rank: int) -> tuple[int, ...]:
    """A non-empty set of distinct dims of a tensor of ``rank`` (negative indices too)."""
    if rank == 0:
        return ()
    picked = draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))
    return tuple(sorted(d - rank if draw(st.booleans()) else d for d in picked))
