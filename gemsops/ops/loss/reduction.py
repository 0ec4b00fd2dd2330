"""The reductions of the losses: aten's reduction codes, and one kernel that sums the
per-row losses (and the weights a mean divides by) in a fixed order, deterministic and
without atomics. Shared by :mod:`~gemsops.ops.loss.nll` and
:mod:`~gemsops.ops.loss.cross_entropy`.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.errors import Unsupported

__all__ = ["REDUCTIONS", "reduce_rows", "reduction_code"]

REDUCTIONS: dict[str, int] = {"none": 0, "mean": 1, "sum": 2}
"""``F.nll_loss``'s reduction names -> aten's codes (``at::Reduction``)."""


@kernel("loss_reduce", key=["N"])
@triton.jit
def _reduce_kernel(Loss, RowW, Out, Denom, N, MEAN: tl.constexpr, PER_ROW: tl.constexpr,
                   ACC: tl.constexpr, BLOCK: tl.constexpr):
    # One program: Out = sum(Loss) (/ sum(RowW), or / N when PER_ROW); Denom = the divisor.
    # All rows ignored gives 0 / 0 = nan for the mean, as in torch.
    acc = tl.zeros((BLOCK,), ACC)
    wsum = tl.zeros((BLOCK,), ACC)
    for i in range(0, N, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(Loss + offs, mask=offs < N, other=0.0).to(ACC)
        wsum += tl.load(RowW + offs, mask=offs < N, other=0.0).to(ACC)
    total = tl.sum(acc, 0)
    denom = tl.sum(wsum, 0)
    if PER_ROW:
        denom = N * 1.0
    if MEAN:
        total = total / denom
    tl.store(Out, total.to(Out.dtype.element_ty))
    tl.store(Denom, denom.to(Denom.dtype.element_ty))


def reduction_code(reduction: int | str) -> int:
    """aten's code of a reduction given by name (``"mean"``) or code (1).

    Raises:
        Unsupported: anything else.
    """
    code = REDUCTIONS.get(reduction, -1) if isinstance(reduction, str) else int(reduction)
    if code not in (0, 1, 2):
        raise Unsupported(f"reduction {reduction!r}")
    return code


_CONSTS: dict[tuple[bool, bool, Any], dict[str, Any]] = {}


def reduce_rows(loss: Tensor, roww: Tensor, out: Tensor, denom: Tensor, R: int, mean: bool,
                per_row: bool, acc: Any) -> None:
    """Sum ``R`` per-row losses into the 0-dim ``out`` in one program, in a fixed order.

    Args:
        loss: The [R] per-row losses.
        roww: The [R] per-row weights (summed into the mean's divisor).
        out: The 0-dim result: the sum, or the mean when ``mean``.
        denom: A 0-dim tensor that receives the divisor (the summed weights, or R).
        R: The number of rows.
        mean: Divide the sum by the divisor.
        per_row: The divisor is R (probability targets), not the summed weights.
        acc: The Triton accumulator dtype.
    """
    key = (mean, per_row, acc)
    consts = _CONSTS.get(key)
    if consts is None:
        # One dict per key, never changed.
        consts = _CONSTS[key] = {"MEAN": mean, "PER_ROW": per_row, "ACC": acc}
    _reduce_kernel.launch((1,), (loss, roww, out, denom, R), consts)
