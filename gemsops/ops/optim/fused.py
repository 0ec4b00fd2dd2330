"""The fused optimizer steps: ``_fused_adamw_``, ``_fused_adam_`` and ``_fused_sgd_``.

One launch per dtype group does the whole update of every parameter: Adam(W) reads
param, grad, exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad) and its step tensor,
and writes them back; SGD reads param, grad and the momentum buffer. The element math
is torch's CUDA kernel's (``fused_adam_utils.cuh``): float32 for half, bfloat16 and
float32 params, float64 for float64; AdamW decays the parameter (``p -= lr * wd * p``)
before the moments, Adam adds ``wd * p`` to the gradient; ``maximize`` negates the
gradient after unscaling; ``eps`` is added after the bias-corrected square root. The
bias corrections ``1 - beta ** step`` are taken in float64 where the device has it (as
torch's CPU kernel does; its CUDA kernel takes them in float32), by squaring for whole
steps.

``grad_scale`` divides the gradients (and the unscaled gradients are written back, as
torch's kernels do); a ``found_inf`` of 1 skips the whole update. A tensor ``lr`` on
the device is read by the kernel; on the CPU it is read once on the host, as torch does.

Handed back to torch: empty lists, non-float or complex tensors, dtype mixes torch's
kernels do not take (Adam: params and grads of one dtype, states of it too or bfloat16
states with float32 params), tensors or step tensors off the params' device (the CPU
steps of a non-fused optimizer on an accelerator), non-contiguous or mismatched
tensors, ``grad_scale`` / ``found_inf`` / ``lr`` tensors that are not one value on the
device.
"""

from __future__ import annotations

from typing import Any

import torch
import triton.language as tl
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import check_supported
from gemsops.ops.optim import kernels as K
from gemsops.ops.optim.tables import Group, layout, plan, scalars, witness

__all__ = ["fused_adam", "fused_adamw", "fused_sgd"]

_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _wide() -> torch.dtype:
    """float64 where the device computes in it (the bias corrections), else float32."""
    if not _WIDE:
        try:
            check_supported(torch.float64)
            _WIDE.append(torch.float64)
        except Unsupported:
            _WIDE.append(torch.float32)
    return _WIDE[0]


_WIDE: list[torch.dtype] = []


def _tl(dtype: torch.dtype) -> Any:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _one_value(name: str, what: str, t: Tensor | None,
               device: torch.device) -> Tensor | None:
    """``t`` checked as a one-value float tensor on ``device`` (None stays None)."""
    if t is None:
        return None
    if t.device != device:
        raise Unsupported(f"{name}: {what} on {t.device}, the params on {device}")
    if t.numel() != 1 or not t.dtype.is_floating_point:
        raise Unsupported(f"{name}: {what} of {t.numel()} values of {t.dtype} (one float)")
    return t


def _lr(name: str, lr: float | Tensor, device: torch.device) -> tuple[float, Tensor | None]:
    """(the lr as a number, or the device tensor the kernel reads it from)."""
    if not isinstance(lr, Tensor):
        return float(lr), None
    if lr.device != device and lr.is_cpu and lr.numel() == 1:
        return float(lr.item()), None  # torch's kernels read a CPU lr on the host too
    return 0.0, _one_value(name, "lr", lr, device)


def _check_adam_dtypes(name: str, group: Group) -> None:
    param, grad, *states = group.dtypes[:-1]
    if grad != param or len(set(states)) != 1:
        raise Unsupported(f"{name}: dtypes {group.dtypes} (params and grads of one dtype, "
                          "states of one dtype)")
    if states[0] != param and not (param == torch.float32 and states[0] == torch.bfloat16):
        raise Unsupported(f"{name}: {states[0]} states with {param} params (float32 params "
                          "with bfloat16 states is the mix torch takes)")


def _adam(name: str, adamw: bool, params: list[Tensor], grads: list[Tensor],
          exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor],
          state_steps: list[Tensor], lr: float | Tensor, beta1: float, beta2: float,
          weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
          grad_scale: Tensor | None, found_inf: Tensor | None) -> None:
    if not params:
        raise Unsupported(f"{name}: an empty tensor list")
    if max_exp_avg_sqs and not amsgrad:
        raise Unsupported(f"{name}: max_exp_avg_sqs given without amsgrad")  # torch raises
    device = params[0].device
    lists = [params, grads, exp_avgs, exp_avg_sqs, *([max_exp_avg_sqs] if amsgrad else [])]
    value, lr_t = _lr(name, lr, device)
    scale = _one_value(name, "grad_scale", grad_scale, device)
    inf = _one_value(name, "found_inf", found_inf, device)
    groups, _ = plan(name, lists, side=[state_steps])
    for group in groups:
        _check_adam_dtypes(name, group)
    wide = _wide()
    shape = layout()
    s = scalars([value, float(beta1), float(beta2), float(weight_decay), float(eps)],
                wide, device)
    for group in groups:
        acc = group.acc
        key = (len(lists), adamw, amsgrad, maximize, lr_t is not None, scale is not None,
               inf is not None, acc, wide, group.aligned, shape)
        consts = _CONSTS.get(key)
        if consts is None:
            consts = _CONSTS[key] = {
                "STEP": len(lists), "ADAMW": adamw, "AMSGRAD": amsgrad, "MAXIMIZE": maximize,
                "LR_TENSOR": lr_t is not None, "HAS_SCALE": scale is not None,
                "HAS_INF": inf is not None, "ACC": _tl(acc), "WIDE": _tl(wide),
                "ALIGNED": group.aligned, "BLOCK": shape[0], "TILE": shape[1]}
        w = [witness(d, device) for d in group.dtypes]
        wx = w[4] if amsgrad else w[3]
        args = (group.table, s, s if lr_t is None else lr_t, s if scale is None else scale,
                s if inf is None else inf, w[0], w[1], w[2], w[3], wx, w[-1],
                group.tensors, group.steps)
        K.adam_kernel.launch((group.blocks,), args, consts)


@op("_fused_adamw_.default", "_fused_adamw_.tensor_lr")
def fused_adamw(self: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor],
                state_steps: list[Tensor], *, lr: float | Tensor, beta1: float, beta2: float,
                weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
                grad_scale: Tensor | None = None, found_inf: Tensor | None = None) -> None:
    """One AdamW step over every parameter, in place (``torch.optim.AdamW(fused=True)``).

    Args:
        self: The parameters; the other lists hold one tensor per parameter.
        grads: Their gradients (unscaled in place when ``grad_scale`` is given).
        exp_avgs: First moments.
        exp_avg_sqs: Second moments.
        max_exp_avg_sqs: Running maxima of the second moments (read with amsgrad only).
        state_steps: One-value step counts (already incremented for this step).
        lr: The learning rate, a number or a one-value tensor.
        beta1: First-moment decay.
        beta2: Second-moment decay.
        weight_decay: Decoupled weight decay.
        eps: Added to the denominator.
        amsgrad: Normalize by the running maximum of the second moment.
        maximize: Ascend instead of descend.
        grad_scale: Divides the gradients (AMP).
        found_inf: 1 skips the step.

    Raises:
        Unsupported: inputs the kernel does not take (see the module docstring).
    """
    _adam("_fused_adamw_", True, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
          state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
          found_inf)


@op("_fused_adam_.default", "_fused_adam_.tensor_lr")
def fused_adam(self: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
               exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor],
               state_steps: list[Tensor], *, lr: float | Tensor, beta1: float, beta2: float,
               weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
               grad_scale: Tensor | None = None, found_inf: Tensor | None = None) -> None:
    """One Adam step over every parameter, in place (``torch.optim.Adam(fused=True)``):
    :func:`fused_adamw`'s arguments, with L2 weight decay added to the gradient."""
    _adam("_fused_adam_", False, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
          state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale,
          found_inf)


@op("_fused_sgd_.default", "_fused_sgd_.tensor_lr")
def fused_sgd(self: list[Tensor], grads: list[Tensor], momentum_buffer_list: list[Tensor], *,
              weight_decay: float, momentum: float, lr: float | Tensor, dampening: float,
              nesterov: bool, maximize: bool, is_first_step: bool,
              grad_scale: Tensor | None = None, found_inf: Tensor | None = None) -> None:
    """One SGD step over every parameter, in place (``torch.optim.SGD(fused=True)``).

    Args:
        self: The parameters.
        grads: Their gradients (unscaled in place when ``grad_scale`` is given).
        momentum_buffer_list: One buffer per parameter, or empty for no momentum.
        weight_decay: L2 penalty added to the gradient.
        momentum: Momentum factor.
        lr: The learning rate, a number or a one-value tensor.
        dampening: Dampening of the momentum.
        nesterov: Nesterov momentum.
        maximize: Ascend instead of descend.
        is_first_step: The buffers start as the gradients (their contents are not read).
        grad_scale: Divides the gradients (AMP).
        found_inf: 1 skips the step.

    Raises:
        Unsupported: inputs the kernel does not take (see the module docstring).
    """
    name = "_fused_sgd_"
    if not self:
        raise Unsupported(f"{name}: an empty tensor list")
    device = self[0].device
    has_buf = bool(momentum_buffer_list)
    lists = [self, grads, *([momentum_buffer_list] if has_buf else [])]
    value, lr_t = _lr(name, lr, device)
    scale = _one_value(name, "grad_scale", grad_scale, device)
    inf = _one_value(name, "found_inf", found_inf, device)
    groups, _ = plan(name, lists)
    shape = layout()
    for group in groups:
        if len(set(group.dtypes)) != 1:
            raise Unsupported(f"{name}: dtypes {group.dtypes} (one dtype per parameter)")
    for group in groups:
        acc = group.acc
        s = scalars([value, float(weight_decay), float(momentum), float(dampening)], acc,
                    device)
        key = (has_buf, is_first_step, nesterov, maximize, lr_t is not None,
               scale is not None, inf is not None, acc, group.aligned, shape)
        consts = _CONSTS.get(("sgd", *key))
        if consts is None:
            consts = _CONSTS[("sgd", *key)] = {
                "HAS_BUF": has_buf, "FIRST": bool(is_first_step), "NESTEROV": bool(nesterov),
                "MAXIMIZE": bool(maximize), "LR_TENSOR": lr_t is not None,
                "HAS_SCALE": scale is not None, "HAS_INF": inf is not None, "ACC": _tl(acc),
                "ALIGNED": group.aligned, "BLOCK": shape[0], "TILE": shape[1]}
        w = [witness(d, device) for d in group.dtypes]
        args = (group.table, s, s if lr_t is None else lr_t, s if scale is None else scale,
                s if inf is None else inf, w[0], w[1], w[-1], group.tensors, group.steps)
        K.sgd_kernel.launch((group.blocks,), args, consts)
