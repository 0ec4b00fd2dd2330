"""The inputs of the losses, read one way by :mod:`~gemsops.ops.loss.nll` and
:mod:`~gemsops.ops.loss.cross_entropy`: the checks on the input, the logits as rows of
classes, the class weight, and the class targets (checked on the host, and loaded in
the kernels by :func:`load_target`).

A target outside ``[0, C)`` other than ``ignore_index`` is an ``IndexError`` in torch:
the host raises it where checking costs no device sync (CPU tensors); in the kernels the
row is masked off (nothing is read out of bounds) and asserts under ``TRITON_DEBUG``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, check_supported

__all__ = ["TARGET_DTYPES", "check_input", "class_targets", "class_weight", "load_target",
           "rows_of"]

TARGET_DTYPES: tuple[torch.dtype, ...] = (torch.int64, torch.uint8)
"""The dtypes of class-index targets the kernels read (torch's nll_loss takes these)."""


@triton.jit
def load_target(T, rows, row_ok, stride_t, W, C, ignore_index, HAS_W: tl.constexpr,
                ACC: tl.constexpr):
    """Class targets of a block of rows: (target clamped into range, valid, its weight).

    Ignored rows (and rows past N, ``row_ok`` false) get weight 0; out-of-range targets
    assert in debug and are treated as ignored.
    """
    t = tl.load(T + rows.to(tl.int64) * stride_t, mask=row_ok, other=0).to(tl.int64)
    valid = row_ok & (t != ignore_index)
    tl.device_assert(~valid | ((t >= 0) & (t < C)), "target out of bounds")
    valid = valid & (t >= 0) & (t < C)
    t = tl.where(valid, t, 0)
    if HAS_W:
        w = tl.load(W + t, mask=valid, other=0.0).to(ACC)
    else:
        w = tl.where(valid, 1.0, 0.0).to(ACC)
    return t, valid, w


def check_input(x: Tensor, *others: Tensor | None) -> None:
    """Refuse (:class:`~gemsops.errors.Unsupported`) a loss input the kernels do not take.

    Args:
        x: The input (log-probabilities or logits): a strided tensor of a floating dtype
            the device computes in.
        *others: The other tensor arguments (targets, weight, gradients; None skipped),
            which must be strided and on ``x``'s device.
    """
    if x.layout != torch.strided or x.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"loss of a {x.layout} {x.dtype} input")
    check_supported(x.dtype)
    for t in others:
        if t is not None and (t.device != x.device or t.layout != torch.strided):
            raise Unsupported("loss arguments on different devices or layouts")


def class_weight(weight: Tensor | None, x: Tensor, C: int) -> Tensor | None:
    """The optional class weight as a contiguous [C] tensor of ``x``'s dtype.

    Raises:
        Unsupported: a weight of another shape or dtype.
    """
    if weight is None:
        return None
    if weight.dtype != x.dtype or weight.numel() != C or weight.dim() != 1:
        raise Unsupported("class weight must be a [C] tensor of the input's dtype")
    return weight.contiguous()


def class_targets(target: Tensor, R: int, C: int, ignore_index: int) -> Tensor:
    """Class targets as a flat [R] tensor, range-checked on the CPU.

    Raises:
        IndexError: a target outside ``[0, C)`` other than ``ignore_index`` (CPU
            targets), as torch raises.
        Unsupported: a dtype outside :data:`TARGET_DTYPES`, or not R targets.
    """
    if target.dtype not in TARGET_DTYPES:
        raise Unsupported(f"class targets of dtype {target.dtype}")
    flat = target if target.dim() == 1 else target.reshape(-1)
    if flat.numel() != R:
        raise Unsupported("target does not match the input's batch shape")
    if target.is_cpu and R:
        arr = flat.detach().numpy()
        bad = arr[(arr != ignore_index) & ((arr < 0) | (arr >= C))]
        if bad.size:
            raise IndexError(f"Target {int(bad[0])} is out of bounds.")
    return flat


def rows_of(x: Tensor) -> tuple[Tensor, int, int]:
    """An input as [R, C] rows of classes (class dim last; a strided view where possible),
    with R and C. A [C] input is one row; [N, C, d1, ...] has its class dim 1 moved last.

    Raises:
        Unsupported: a 0-dim input (it has no class dim).
    """
    if x.dim() == 0:
        raise Unsupported("a 0-d input has no class dim")
    if x.dim() == 1:
        return x.unsqueeze(0), 1, x.shape[0]
    C = x.shape[1]
    x2 = x if x.dim() == 2 else x.movedim(1, -1).reshape(-1, C)
    return x2, x2.shape[0], C
