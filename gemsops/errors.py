"""Errors and signals raised by gemsops."""

from __future__ import annotations

__all__ = ["GemsopsError", "UnknownOpError", "Unsupported"]


class GemsopsError(Exception):
    """Base class of every error raised by gemsops."""


class UnknownOpError(GemsopsError, LookupError):
    """An op name given to enable()/use_gems() is not one gemsops implements."""


class Unsupported(GemsopsError):
    """An input a gemsops kernel does not handle; the call goes to torch's own kernel.

    Raised by op implementations *before* they touch any output, with a short
    reason ("float64 on a device without fp64", "sparse layout"). The registry
    catches it, counts the fallback with the reason and calls torch's kernel.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
