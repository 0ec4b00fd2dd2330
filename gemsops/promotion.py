"""torch's type-promotion rules that Python cannot ask torch for directly.

torch promotes operands in three levels (tensors with dims, 0-dim tensors, wrapped
Python numbers) and joins the levels with c10's ``combine_categories``: a lower level
only counts when it brings a new category (bool < integer < floating < complex). The
pointwise ops use these rules to find their result dtypes, and the registry uses them
to hand Python numbers back to torch as tensors that promote the same way. No Triton
here: the registry imports it before any kernel module.
"""

from __future__ import annotations

import torch

__all__ = ["FLOAT_TO_COMPLEX", "combine", "promote"]

FLOAT_TO_COMPLEX = {
    torch.float16: torch.complex32,
    torch.float32: torch.complex64,
    torch.float64: torch.complex128,
}
"""The complex dtype a floating dtype becomes when a complex operand joins it."""


def combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """c10's ``combine_categories``: how a lower promotion level joins a higher one."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return FLOAT_TO_COMPLEX.get(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def promote(acc: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    """``torch.promote_types`` with None as the empty start."""
    return dtype if acc is None else torch.promote_types(acc, dtype)
