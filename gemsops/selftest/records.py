"""The self-test's records: a case (one op to check) and a row (its outcome)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from gemsops.testing.strategies import FLOAT_DTYPES

__all__ = [
    "DEFAULT_EXAMPLES",
    "OUTCOMES",
    "Args",
    "Case",
    "Inputs",
    "Row",
]

DEFAULT_EXAMPLES = 10
OUTCOMES = ("passed", "failed", "handed back", "not implemented")

Args = tuple[Any, ...]
Inputs = Callable[[torch.dtype], st.SearchStrategy[Args]]


@attrs.frozen
class Case:
    """One op of the self-test: how to draw its inputs, the torch call, what serves it."""

    op: str
    inputs: Inputs
    """A strategy of the call's positional arguments, for one dtype."""
    call: Callable[..., Any]
    """The torch call, run on the drawn arguments (through gemsops, and as the reference)."""
    aten: tuple[str, ...]
    """gemsops op names (as ``gemsops ops`` lists them) that serve the call."""
    reduce: Callable[[Args], int] = lambda args: 1
    """The reduction length, which widens the tolerance."""
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    unregistered: bool = False
    """Compute the reference with gemsops' registration lifted, not only bypassed: for a
    call that torch routes differently once gemsops serves an op torch has no kernel for
    on this device (``rms_norm``'s backward on the CPU reaches ``_fused_rms_norm_backward``
    only then)."""


@attrs.frozen
class Row:
    """The outcome for one op and dtype."""

    op: str
    dtype: str
    outcome: str
    examples: int
    detail: str = ""
    example: str = ""
    """The smallest failing example (failed rows only)."""
    served: tuple[str, ...] = ()
    """The gemsops ops (as ``gemsops ops`` names them) that served some of the calls."""
