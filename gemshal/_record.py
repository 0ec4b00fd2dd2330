"""Per-thread recordings of kernel launches (:func:`gemshal.kernel.recording`).

Kept apart so that :mod:`gemshal.device` (the scratch allocator) and
:mod:`gemshal.kernel.decorator` (the launch) can both note into a recording without
importing each other.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECORDERS", "Recording"]


class Recording:
    """What one thread launched inside a :func:`gemshal.kernel.recording` block.

    Attributes:
        launches: ``(kernel, grid, args, kwargs)`` of every launch, in order.
        scratch: Whether a launch asked for the scratch allocator
            (:func:`gemshal.ensure_scratch_allocator`): a replay on another thread must
            ask for it too (Triton's allocator is per thread).
    """

    __slots__ = ("launches", "scratch")

    def __init__(self) -> None:
        self.launches: list[tuple[Any, Any, tuple[Any, ...], Any]] = []
        self.scratch = False


RECORDERS: dict[int, Recording] = {}
"""The open recording of each thread that has one, by thread identity."""
