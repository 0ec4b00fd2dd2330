"""Host-side grid arithmetic for the launch paths.

``triton.cdiv`` is a ``@triton.jit`` function in Triton 3.6: calling it on the host
goes through ``JITFunction.__call__`` and costs several microseconds per grid, more
than the rest of a small op's host work. Launch paths and grid lambdas use
:func:`cdiv` here instead; kernel bodies keep ``tl.cdiv``. The same holds for
``triton.next_power_of_2`` and :func:`next_power_of_2`.
"""

from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``), in plain Python."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``), in plain Python."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
