"""Patch convolution: the non-overlapping 2-d convolution of a vision transformer's patch
embedding, forward and backward, as matrix products.

``nn.Conv2d(C, O, kernel_size=k, stride=k)`` cuts the image into ``kh x kw`` patches that
do not overlap, so the convolution is one matrix product: the ``[N * Ho * Wo, C * kh *
kw]`` matrix of patches (one copy of the input, rearranged) times the ``[O, C * kh * kw]``
weight, plus the bias. Rows and columns past the last whole patch are not read (torch
drops them: ``Ho = H // kh``). The products run on gemsops' matmul kernel
(:mod:`gemsops.ops.matmul.mm`):

* forward, contiguous result: one batched product ``weight @ patches[n].T`` per image,
  written straight into the ``[N, O, Ho, Wo]`` result, bias added in the epilogue;
* forward, channels-last result (the input or the weight is channels-last, as torch
  decides): ``addmm(bias, patches, weight.T)``, whose ``[N * Ho * Wo, O]`` rows already
  are the channels-last result;
* backward: ``grad_input`` is ``grad @ weight`` scattered back into the patches (zeros
  where the forward dropped rows or columns), ``grad_weight`` is ``grad.T @ patches``,
  ``grad_bias`` the sum of ``grad`` over batch and space (gemsops' ``sum``); each is
  computed only when ``output_mask`` asks for it, in torch's memory format.

Every other convolution (strides other than the kernel size, padding, dilation, groups,
transposed, 1-d or 3-d) raises :class:`~gemsops.errors.Unsupported` naming what is not
served, and torch's own kernel runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, check_supported
from gemsops.ops.matmul.mm import addmm, launch_product, mm
from gemsops.ops.rowwise.reduce import sum as reduce_sum

__all__ = ["convolution", "convolution_backward"]


def _pair(value: Sequence[int], name: str) -> tuple[int, int]:
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return values[0], values[0]
    if len(values) != 2:
        raise Unsupported(f"convolution with {len(values)} {name} values for 2 spatial dims")
    return values[0], values[1]


def _check(
    input: Tensor,
    weight: Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    *others: Tensor | None,
) -> tuple[int, int]:
    """The patch size ``(kh, kw)``, or Unsupported naming what is not a patch convolution."""
    if transposed:
        raise Unsupported("convolution with transposed=True")
    if input.dim() != 4 or weight.dim() != 4:
        raise Unsupported(f"convolution with {weight.dim() - 2} spatial dims "
                          f"({input.dim()}-d input)")
    if groups != 1:
        raise Unsupported(f"convolution with groups={groups}")
    kh, kw = weight.shape[2], weight.shape[3]
    if _pair(stride, "stride") != (kh, kw):
        raise Unsupported(f"convolution with stride {list(stride)} other than the kernel size "
                          f"{[kh, kw]} (overlapping or gapped patches)")
    if any(_pair(padding, "padding")):
        raise Unsupported(f"convolution with padding {list(padding)}")
    if _pair(dilation, "dilation") != (1, 1):
        raise Unsupported(f"convolution with dilation {list(dilation)}")
    if any(int(v) for v in output_padding):
        raise Unsupported(f"convolution with output_padding {list(output_padding)}")
    tensors = [input, weight, *(t for t in others if t is not None)]
    for t in tensors:
        if t.layout != torch.strided:
            raise Unsupported("convolution with a non-strided tensor")
        if t.device != input.device:
            raise Unsupported("convolution with tensors on different devices")
        if t.dtype != input.dtype:
            raise Unsupported("convolution with tensors of different dtypes")
    if input.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"convolution of {input.dtype}")
    check_supported(input.dtype)
    if weight.shape[1] != input.shape[1]:
        raise Unsupported(f"convolution with a weight of {weight.shape[1]} input channels "
                          f"for an input of {input.shape[1]} (torch raises)")
    if weight.numel() == 0:
        raise Unsupported("convolution with an empty weight")
    if input.shape[2] < kh or input.shape[3] < kw:
        raise Unsupported(f"convolution with a kernel {[kh, kw]} larger than the input "
                          f"{list(input.shape[2:])} (torch raises)")
    return kh, kw


def _channels_last(t: Tensor) -> bool:
    """Whether torch suggests channels-last for the 4-d ``t`` (c10's strides test, which
    settles the layouts that are both contiguous and channels-last by the strides of
    their size-1 dims)."""
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return False
        low = strides[d] * max(sizes[d], 1)
    return True


def _memory_format(input: Tensor, weight: Tensor) -> torch.memory_format:
    """torch's layout for the result and the gradients: channels-last when the input or
    the weight is (an empty input: see ``convolution``)."""
    if input.numel() and (_channels_last(input) or _channels_last(weight)):
        return torch.channels_last
    return torch.contiguous_format


def _patches(input: Tensor, kh: int, kw: int, channels_last: bool) -> Tensor:
    """The ``[N * Ho * Wo, K]`` matrix of whole patches; a patch's K elements in
    ``(C, kh, kw)`` order, or ``(kh, kw, C)`` for channels-last."""
    n, c, h, w = input.shape
    ho, wo = h // kh, w // kw
    grid = input[:, :, : ho * kh, : wo * kw].view(n, c, ho, kh, wo, kw)
    order = (0, 2, 4, 3, 5, 1) if channels_last else (0, 2, 4, 1, 3, 5)
    return grid.permute(order).reshape(n * ho * wo, c * kh * kw)


def _weight_matrix(weight: Tensor, channels_last: bool) -> Tensor:
    """The ``[O, K]`` weight, K in the patches' order (a view when the layouts agree)."""
    if channels_last:
        weight = weight.permute(0, 2, 3, 1)
    return weight.reshape(weight.shape[0], -1)


@op("convolution.default", out="convolution.out")
def convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Tensor:
    """2-d convolution with ``stride == kernel_size``: the patch embedding's convolution.

    Args:
        input: ``[N, C, H, W]``; rows and columns past the last whole patch are dropped.
        weight: ``[O, C, kh, kw]``, same dtype and device.
        bias: ``[O]`` or None.
        stride: Must equal ``[kh, kw]``.
        padding: Must be zeros.
        dilation: Must be ones.
        transposed: Must be False.
        output_padding: Must be zeros.
        groups: Must be 1.

    Returns:
        ``[N, O, H // kh, W // kw]``, contiguous, or channels-last when the input or the
        weight is.

    Raises:
        Unsupported: any other convolution, naming what is not served.
    """
    kh, kw = _check(input, weight, stride, padding, dilation, transposed, output_padding,
                    groups, bias)
    n, _, h, w = input.shape
    o = weight.shape[0]
    ho, wo = h // kh, w // kw
    if bias is not None and tuple(bias.shape) != (o,):
        raise Unsupported(f"convolution with a bias of shape {list(bias.shape)} for {o} "
                          "output channels (torch raises)")
    if input.numel() == 0:
        # An empty input gives an empty result (an empty weight is refused above). torch's
        # empty path lays it out as the input where the shapes agree, else contiguous.
        if tuple(input.shape) == (n, o, ho, wo):
            return torch.empty_like(input)
        return input.new_empty((n, o, ho, wo))
    channels_last = _memory_format(input, weight) == torch.channels_last
    patches = _patches(input, kh, kw, channels_last)
    w2 = _weight_matrix(weight, channels_last)
    if channels_last:
        # [N * Ho * Wo, O] rows are the channels-last result's memory.
        rows = addmm(bias, patches, w2.t()) if bias is not None else mm(patches, w2.t())
        return rows.view(n, ho, wo, o).permute(0, 3, 1, 2)
    out = torch.empty((n, o, ho, wo), dtype=input.dtype, device=input.device)
    length, k = ho * wo, w2.shape[1]
    # out[b] = weight @ patches[b].T (+ bias per output channel): one batched product,
    # the weight read with batch stride 0, the bias broadcast along space.
    bias3 = None if bias is None else bias.view(1, o, 1).expand(n, o, length)
    launch_product(w2.expand(n, o, k), patches.view(n, length, k).transpose(1, 2),
                   out.view(n, o, length), bias3, 1.0, 1.0)
    return out


@op("convolution_backward.default")
def convolution_backward(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_sizes: Sequence[int] | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of :func:`convolution` (a patch convolution) that ``output_mask``
    asks for.

    Args:
        grad_output: ``[N, O, H // kh, W // kw]``, the gradient of the result.
        input: The forward's ``[N, C, H, W]`` input.
        weight: The forward's ``[O, C, kh, kw]`` weight.
        bias_sizes: The bias's shape, or None (the bias gradient is computed whenever
            ``output_mask[2]`` asks for it, as torch does).
        stride, padding, dilation, transposed, output_padding, groups: As for
            :func:`convolution`.
        output_mask: Which of (input, weight, bias) gradients to compute.

    Returns:
        ``(grad_input, grad_weight, grad_bias)``, None where ``output_mask`` is false;
        ``grad_input`` is zero over the rows and columns the forward dropped. The input
        and weight gradients are contiguous, or channels-last when the input or the weight
        is.

    Raises:
        Unsupported: any other convolution, naming what is not served.
    """
    kh, kw = _check(input, weight, stride, padding, dilation, transposed, output_padding,
                    groups, grad_output)
    n, c, h, w = input.shape
    o = weight.shape[0]
    ho, wo = h // kh, w // kw
    if tuple(grad_output.shape) != (n, o, ho, wo):
        raise Unsupported(f"convolution backward with grad_output of shape "
                          f"{list(grad_output.shape)} for a result of {[n, o, ho, wo]}")
    if bias_sizes is not None and tuple(int(s) for s in bias_sizes) != (o,):
        raise Unsupported(f"convolution backward with bias_sizes {list(bias_sizes)}")
    want_input, want_weight, want_bias = (bool(m) for m in output_mask)
    if input.numel() == 0:
        # torch's empty path: zeros laid out as the input and the weight.
        return (torch.zeros_like(input) if want_input else None,
                torch.zeros_like(weight) if want_weight else None,
                input.new_zeros((o,)) if want_bias else None)
    fmt = _memory_format(input, weight)
    channels_last = fmt == torch.channels_last
    grad_input = grad_weight = grad_bias = None
    if want_input or want_weight:
        # [N * Ho * Wo, O]: a view of a channels-last gradient, one copy of a contiguous one.
        g2 = grad_output.permute(0, 2, 3, 1).reshape(n * ho * wo, o)
        k_shape = (kh, kw, c) if channels_last else (c, kh, kw)
        # patch (b, i, j)'s K index -> input dims: back to [N, C, Ho, kh, Wo, kw]
        scatter = (0, 5, 1, 3, 2, 4) if channels_last else (0, 3, 1, 4, 2, 5)
        if want_input:
            rows = mm(g2, _weight_matrix(weight, channels_last))  # [N * Ho * Wo, K]
            grad_input = torch.empty((n, c, h, w), dtype=input.dtype, device=input.device,
                                     memory_format=fmt)
            grid = grad_input[:, :, : ho * kh, : wo * kw].view(n, c, ho, kh, wo, kw)
            grid.copy_(rows.view(n, ho, wo, *k_shape).permute(scatter))
            if h != ho * kh:
                grad_input[:, :, ho * kh:, :].zero_()
            if w != wo * kw:
                grad_input[:, :, : ho * kh, wo * kw:].zero_()
        if want_weight:
            flat = mm(g2.t(), _patches(input, kh, kw, channels_last))  # [O, K]
            grad_weight = flat.view(o, *k_shape)
            if channels_last:
                grad_weight = grad_weight.permute(0, 3, 1, 2)
    if want_bias:
        grad_bias = reduce_sum(grad_output, [0, 2, 3])
    return grad_input, grad_weight, grad_bias
