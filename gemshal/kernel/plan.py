"""A kernel's plan: how it picks a config at a size bucket, under one tuning generation.

The tuning policy (``GEMS_AUTOTUNE``) decides where a config comes from:

* unset or ``0`` (tables): the op's ``table`` row for this bucket when the tuning file
  has one; else the row of the nearest bucket (sizes compared on a log scale, rows of
  the same dtype first); else the first config the kernel's pruning keeps that the
  device can run. Nothing is benchmarked: a first call compiles one config.
* ``1``: as tables where a row covers the bucket exactly; a bucket no row covers is
  benchmarked once (a line on stderr says so) and the choice kept for the process.
* ``all``: every bucket is benchmarked (``gemsops tune`` runs with it, to write tables).

Under the Triton interpreter one config is pinned (the entry's ``interpreter`` config,
else its first), whatever the policy.

The functions here are pure (no Triton, no device), so the choice rules are tested on
the CPU; :mod:`gemshal.kernel.decorator` applies them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gemshal.errors import ConfigError
from gemshal.tune_format import TableRow, TuneConfig

__all__ = [
    "AUTOTUNE_ENV",
    "POLICIES",
    "bucket",
    "config_order",
    "nearest_row",
    "policy",
]

AUTOTUNE_ENV = "GEMS_AUTOTUNE"
POLICIES = ("tables", "uncovered", "all", "first")
"""The tuning policies, by ``GEMS_AUTOTUNE`` value: unset/``0``, ``1``, ``all``, ``first``."""


def policy(env: Mapping[str, str] | None = None) -> str:
    """The tuning policy ``GEMS_AUTOTUNE`` asks for (one of :data:`POLICIES`).

    Raises:
        ConfigError: any value other than unset, ``0``, ``1`` or ``all``.
    """
    raw = (os.environ if env is None else env).get(AUTOTUNE_ENV, "").strip()
    if raw in ("", "0"):
        return "tables"
    if raw == "1":
        return "uncovered"
    if raw == "all":
        return "all"
    if raw == "first":
        return "first"
    raise ConfigError(
        f"{AUTOTUNE_ENV} must be 0 or unset (launch the tuning tables' configs, benchmark "
        f"nothing), 1 (benchmark the buckets no table row covers), all (benchmark every "
        f"bucket, as `gemsops tune` does) or first (every bucket launches the entry's "
        f"first config: fewest compiles, as `gemsops selftest` does); got {raw!r}"
    )


def bucket(value: Any) -> Any:
    """A key value's size bucket: a positive integer (not a bool) rounded up to the next
    half octave, a power of two or three quarters of one (..., 512, 768, 1024, 1536,
    2048, 3072, ...); a function (a ``tl.constexpr`` JIT function, such as the element
    function of a pointwise template) its ``__name__``, so a table row can name it as a
    string; anything else stands for itself.

    Half octaves keep the 768-, 1536- and 3072-wide layers of GPT-2, BERT, ViT and
    Llama 3.2 3B out of the 1024, 2048 and 4096 buckets of other models: their best
    tiles differ. A call between a power of two and the half octave below it sits
    nearer (on a log scale) to the power of two above than to the one below, so
    :func:`nearest_row` over a table of powers of two picks what a power-of-two bucket
    would have had exactly.
    """
    if type(value) is int and value > 0:
        power = 1 << (value - 1).bit_length()  # the smallest power of two >= value
        three_quarters = 3 * power // 4
        if power >= 4 and value <= three_quarters:
            return three_quarters
        return power
    if callable(value):
        name = getattr(value, "__name__", None)
        if isinstance(name, str):
            return name
    return value


def _distance(row: TableRow, when: Mapping[str, Any], categories: Collection[str]) -> float | None:
    # Log-scale distance between a row's bucket and ours; None when a flag or a category
    # differs or the row names a key the kernel does not have.
    total = 0.0
    for name, value in row.when:
        if name not in when:
            return None
        mine = when[name]
        if name in categories:
            if value != mine:
                return None
        elif type(value) is int and type(mine) is int and value > 0 and mine > 0:
            total += abs(math.log2(value) - math.log2(mine))
        elif value != mine:
            return None
    return total


def nearest_row(
    rows: Sequence[TableRow],
    when: Mapping[str, Any],
    dtype: str | None,
    categories: Collection[str] = (),
) -> tuple[TableRow | None, bool]:
    """The table row for a bucket: ``(row, exact)``.

    A row covers the keys it names: one that leaves a key out stands for every value of
    it (a pointwise row without ``OP`` serves every element function; one naming
    ``OP = "_gelu"`` serves that one). ``exact`` is True when every key the row names has
    this call's bucket and its dtype is this call's (or it names none); among exact rows
    the one naming the most keys wins, then one naming the dtype, then the earlier.
    Otherwise the nearest row on a log scale of the sizes, among rows of the same dtype
    (or of any dtype when none has it), whose flags (non-integer key values) and
    ``categories`` (integer keys the kernel declares are not sizes, such as a split
    count) are the call's; the earlier row wins a tie. ``(None, False)`` when no row
    qualifies.
    """
    best: TableRow | None = None
    best_rank: tuple[int, float] | None = None
    found: TableRow | None = None
    found_rank: tuple[int, int] | None = None
    for row in rows:
        distance = _distance(row, when, categories)
        if distance is None:
            continue
        same_dtype = row.dtype is None or row.dtype == dtype
        if distance == 0 and same_dtype:
            specific = (-len(row.when), 0 if row.dtype is not None else 1)
            if found_rank is None or specific < found_rank:
                found, found_rank = row, specific
            continue
        rank = (0 if same_dtype else 1, distance)
        if best_rank is None or rank < best_rank:
            best, best_rank = row, rank
    if found is not None:
        return found, True
    return best, False


def config_order(configs: Sequence[TuneConfig], preferred: TuneConfig | None) -> list[TuneConfig]:
    """The configs to try, in order: ``preferred`` first (a table row's), then the
    entry's own list."""
    if preferred is None:
        return list(configs)
    rest = [c for c in configs if c.identity() != preferred.identity()]
    return [preferred, *rest]
