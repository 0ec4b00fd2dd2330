"""Host-side grid arithmetic for the launch paths.

``triton.cdiv`` is a ``@triton.jit`` function in Triton 3.6: calling it on the host
goes through ``JITFunction.__call__`` and costs several microseconds per grid, more
than the rest of a small op's host work. Launch paths and grid lambdas use
:func:`cdiv` here instead; kernel bodies keep ``tl.cdiv``.
"""

from __future__ import annotations

__all__ = ["cdiv"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``), in plain Python."""
    return -(-a // b)
