"""gemsops.ops.grid: the host-side grid arithmetic agrees with Triton's own helpers."""

from __future__ import annotations

import triton
from hypothesis import given
from hypothesis import strategies as st

from gemsops.ops.grid import cdiv, next_power_of_2


@given(st.integers(0, 2**40), st.integers(1, 2**20))
def test_cdiv_is_ceiling_division(a: int, b: int) -> None:
    """Property: cdiv(a, b) is the least q with q * b >= a, as triton.cdiv computes."""
    q = cdiv(a, b)
    assert q * b >= a and (q - 1) * b < a
    assert q == (a + b - 1) // b


@given(st.integers(1, 2**40))
def test_next_power_of_2_matches_triton(n: int) -> None:
    """Property: next_power_of_2(n) is the least power of two >= n, as Triton's helper."""
    p = next_power_of_2(n)
    assert p >= n and p & (p - 1) == 0 and (p == 1 or p // 2 < n)
    assert p == triton.next_power_of_2(n)
