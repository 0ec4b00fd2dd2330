"""A count the host memos raise each time they keep or replay a recipe.

gemsops' native replay (:mod:`gemsops.native`) records a call only when one of the
memos took it (the pointwise plan memo or the replay memo): the memos know which calls
their ops decide from structure alone (no 0-dim CPU operand, ``when`` held, ...).
"""

from __future__ import annotations

__all__ = ["COUNT", "note"]

COUNT = [0]
"""How many times a memo kept or replayed a recipe in this process."""


def note() -> None:
    """A memo kept or replayed a recipe."""
    COUNT[0] += 1
