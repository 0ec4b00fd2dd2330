"""A stand-in for a compiled-mode @triton.jit function, shared by the autotune tests."""

from __future__ import annotations

from typing import Any, ClassVar


class FakeJit:
    """Stands in for a JITFunction on a GPU: records each launch's keywords (which
    Triton's JITFunction.run would hand to the backend's parse_options)."""

    arg_names: ClassVar[list[str]] = ["x", "n", "BLOCK"]

    def __init__(self) -> None:
        self.fn = lambda x, n, BLOCK: None
        self.launches: list[dict[str, Any]] = []
        self.warmups: list[dict[str, Any]] = []

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        """Record one launch's keywords (a compile without launch: in ``warmups``)."""
        (self.warmups if warmup else self.launches).append(kwargs)
