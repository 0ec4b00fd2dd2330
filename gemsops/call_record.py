"""What gemsops counts about a call: ``record()`` and the marker of its own work.

A served aten call (gemsops.registry's wrapper) counts itself, served or handed back
with the reason, in every open :func:`record` block, and marks its thread as inside
gemsops while it runs, so the aten calls its machinery makes go straight to torch.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

import attrs

__all__ = [
    "COMPILING",
    "INSIDE",
    "OPEN_RECORDS",
    "CallRecord",
    "in_gemsops",
    "note_handed_back",
    "record",
    "running",
]


@attrs.define
class CallRecord:
    """Per aten overload: calls served by gemsops, and calls handed to torch with the reason.

    Attributes:
        served: Calls served by gemsops, by overload.
        fallbacks: Calls handed to torch, by (overload, reason).
        overrides: Overload -> the vendor override that served its calls
            (``"plugin.module.fn [vendor]"``), for the served overloads a vendor's own
            implementation serves instead of the portable one; their counts are in
            ``served``.
    """

    served: Counter[str] = attrs.field(factory=Counter)
    fallbacks: Counter[tuple[str, str]] = attrs.field(factory=Counter)
    overrides: dict[str, str] = attrs.field(factory=dict)

    def summary(self) -> str:
        """The record as text: one line per overload served (naming the vendor override
        that served it, if one did) and per (overload, reason) handed back."""
        lines = []
        for op, count in sorted(self.served.items()):
            by = f"  by vendor override {self.overrides[op]}" if op in self.overrides else ""
            lines.append(f"{op}: {count} served{by}")
        for (op, reason), count in sorted(self.fallbacks.items()):
            lines.append(f"{op}: {count} handed back to torch ({reason})")
        return "\n".join(lines) or "no calls"

    def fallback_ops(self) -> dict[str, list[str]]:
        """Overload -> the distinct reasons it was handed back to torch."""
        out: dict[str, list[str]] = {}
        for op, reason in self.fallbacks:
            out.setdefault(op, []).append(reason)
        return out


OPEN_RECORDS: list[CallRecord] = []
"""The records of the ``record()`` blocks open now, innermost last; a served call
counts itself in each."""


@contextlib.contextmanager
def record() -> Iterator[CallRecord]:
    """Count, inside the block, which aten calls gemsops served and which it handed back."""
    rec = CallRecord()
    OPEN_RECORDS.append(rec)
    from gemsops import native

    start = native.hit_counts()
    try:
        yield rec
    finally:
        # Calls the native replay served (gemsops.native) never reach Python.
        for overload, hits in native.hit_counts().items():
            if hits > start.get(overload, 0):
                rec.served[overload] += hits - start.get(overload, 0)
        # By identity: records compare by value, and nested blocks may hold equal ones.
        for i, open_rec in enumerate(OPEN_RECORDS):
            if open_rec is rec:
                del OPEN_RECORDS[i]
                break


def note_handed_back(name: str, reason: str) -> None:
    """Count, in every open ``record()``, one piece of work torch did instead of gemsops
    outside a served aten call (a backward of a gemsops autograd function)."""
    for rec in OPEN_RECORDS:
        rec.fallbacks[(name, reason)] += 1


class _Inside(threading.local):
    """Whether this thread is inside a gemsops implementation right now, and whether
    the last served call was served (True) or handed back to torch (False)."""

    depth = 0
    served = False


INSIDE = _Inside()
"""This thread's marker: the served-call wrapper and the native replay set it."""


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Mark the block as gemsops' own work, as while a served aten call runs.

    Aten calls made inside go straight to torch's kernels, uncounted. The backward of a
    gemsops autograd function (run by autograd, outside any served call) uses it.
    """
    before = INSIDE.depth
    INSIDE.depth = before + 1
    try:
        yield
    finally:
        INSIDE.depth = before


def in_gemsops() -> bool:
    """Whether this thread is running gemsops' own work (a served call, or ``running()``)."""
    return INSIDE.depth > 0


COMPILING = "compiling in the background"
"""The fallback reason of a call served by torch while its kernel compiles."""
