"""Property tests of the patch convolution (stride == kernel size) against torch's conv2d.

Forward and backward are compared with torch in float64 over patch sizes, channels,
batch sizes (0 included) and image sizes that leave a remainder (torch drops it; the
input gradient is zero there), with and without bias, in fp16/bf16/fp32 and with
contiguous or channels-last input and weight: the results take the memory format torch
gives them. Every other convolution is handed back to torch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.matmul import conv as C
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, target_device
from gemsops.testing.tolerance import assert_close

DEV = target_device()
LAYOUTS = ("contiguous", "channels_last_input", "channels_last_weight")


@st.composite
def patch_problems(draw: st.DrawFn) -> dict[str, Any]:
    """Input, weight and bias of a patch convolution, with the patch size and layout."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    n, c, o = draw(st.integers(0, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    h = kh * draw(st.integers(1, 3)) + draw(st.integers(0, kh - 1))
    w = kw * draw(st.integers(1, 3)) + draw(st.integers(0, kw - 1))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    layout = draw(st.sampled_from(LAYOUTS))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(n, c, h, w, generator=gen).to(DEV, dtype)
    weight = torch.randn(o, c, kh, kw, generator=gen).to(DEV, dtype)
    bias = torch.randn(o, generator=gen).to(DEV, dtype) if draw(st.booleans()) else None
    if layout == "channels_last_input":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "channels_last_weight":
        weight = weight.contiguous(memory_format=torch.channels_last)
    return {"x": x, "weight": weight, "bias": bias, "kernel": [kh, kw], "layout": layout}


def _same_layout(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """``ours`` is laid out as torch laid out ``theirs`` (strides of size-1 dims aside)."""
    def order(t: torch.Tensor) -> list[int]:
        return sorted((d for d in range(t.dim()) if t.shape[d] > 1), key=lambda d: -t.stride(d))

    assert ours.shape == theirs.shape
    assert order(ours) == order(theirs), (ours.stride(), theirs.stride())


def _torch_float32(fn: Any, *args: Any) -> Any:
    """torch's own result in float32 with the operands' strides (their layout decides
    the result's)."""
    return fn(*(a.float() if isinstance(a, torch.Tensor) else a for a in args))


def _conv_args(kernel: list[int]) -> tuple[Any, ...]:
    return (kernel, [0, 0], [1, 1], False, [0, 0], 1)


@settings(max_examples=40)
@given(problem=patch_problems())
def test_forward_matches_torch(problem: dict[str, Any]) -> None:
    """Property: the patch convolution equals torch's conv2d with stride = kernel size,
    in torch's memory format, for any patch size, channels, batch, odd H/W and bias."""
    x, weight, bias, kernel = problem["x"], problem["weight"], problem["bias"], problem["kernel"]
    out = C.convolution(x, weight, bias, *_conv_args(kernel))
    expected = reference(F.conv2d, x, weight, bias, stride=kernel)
    assert out.dtype == x.dtype
    _same_layout(out, _torch_float32(F.conv2d, x, weight, bias, kernel))
    k = weight[0].numel()
    assert_close(out, expected, reduce_size=k * 4)


@settings(max_examples=40)
@given(problem=patch_problems(), mask=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_backward_matches_torch(problem: dict[str, Any], mask: tuple[bool, bool, bool]) -> None:
    """Property: convolution_backward gives torch's input, weight and bias gradients for
    the ones output_mask asks for (None for the others), zero input gradient over the
    dropped remainder, in torch's memory format."""
    x, weight, bias, kernel = problem["x"], problem["weight"], problem["bias"], problem["kernel"]
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(n, o, h // kh, w // kw, generator=gen).to(DEV, x.dtype)
    bias_sizes = None if bias is None else [o]
    # Autograd asks for a bias gradient only where there is a bias (torch's CPU kernel
    # aborts on an empty batch asked for one without bias_sizes).
    mask = (mask[0], mask[1], mask[2] and bias is not None)
    got = C.convolution_backward(grad, x, weight, bias_sizes, *_conv_args(kernel), list(mask))
    expected = reference(torch.ops.aten.convolution_backward, grad, x, weight, bias_sizes,
                         *_conv_args(kernel), list(mask))
    layouts = _torch_float32(torch.ops.aten.convolution_backward, grad, x, weight, bias_sizes,
                             *_conv_args(kernel), list(mask))
    spatial = n * (h // kh) * (w // kw)
    sizes = (o, max(spatial, 1), max(spatial, 1))
    for which, (ours, theirs, size) in enumerate(zip(got, expected, sizes, strict=True)):
        if not mask[which]:
            assert ours is None
            continue
        assert ours is not None and ours.dtype == x.dtype
        if which < 2:
            _same_layout(ours, layouts[which])
        assert_close(ours, theirs, reduce_size=size * 4)
    if mask[0] and got[0] is not None:
        assert bool((got[0][:, :, (h // kh) * kh:, :] == 0).all())
        assert bool((got[0][:, :, :, (w // kw) * kw:] == 0).all())


def test_patch_embedding_under_use_gems_with_autograd() -> None:
    """A ViT patch embedding (nn.Conv2d with stride = kernel size) under use_gems: forward
    and backward are served by gemsops and match torch's."""
    torch.manual_seed(0)
    embed = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4).to(DEV)
    x = torch.randn(2, 3, 18, 17, device=DEV, requires_grad=True)
    grad = torch.randn(2, 8, 4, 4, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        out = embed(x)
        out.backward(grad)
    assert rec.served["convolution.default"] == 1
    assert rec.served["convolution_backward.default"] == 1
    ours = (out.detach(), x.grad, embed.weight.grad, embed.bias.grad)
    x.grad = embed.weight.grad = embed.bias.grad = None
    embed(x).backward(grad)
    theirs = (embed(x).detach(), x.grad, embed.weight.grad, embed.bias.grad)
    for a, b, size in zip(ours, theirs, (48, 8, 32, 32), strict=True):
        assert a is not None and b is not None
        assert_close(a, b.double(), reduce_size=size * 4)


OTHER_CONVOLUTIONS = {
    "stride": (lambda x, w: F.conv2d(x, w, stride=2), "convolution with stride"),
    "padding": (lambda x, w: F.conv2d(x, w, stride=4, padding=1), "convolution with padding"),
    "dilation": (lambda x, w: F.conv2d(x, w, stride=4, dilation=2), "convolution with dilation"),
    "groups": (lambda x, w: F.conv2d(x, w[:, :1].repeat(3, 1, 1, 1), stride=4, groups=3),
               "convolution with groups"),
    "transposed": (lambda x, w: F.conv_transpose2d(x[:, :, :4, :4], w.transpose(0, 1),
                                                   stride=4),
                   "convolution with transposed"),
    "conv1d": (lambda x, w: F.conv1d(x[:, :, 0], w[:, :, 0], stride=4),
               "convolution with 1 spatial dims"),
    "conv3d": (lambda x, w: F.conv3d(x[:, :, None], w[:, :, None], stride=(1, 4, 4)),
               "convolution with 3 spatial dims"),
}


@pytest.mark.parametrize("case", sorted(OTHER_CONVOLUTIONS))
def test_other_convolutions_are_handed_back(case: str) -> None:
    """Every convolution but the patch one goes to torch, the reason naming what differs,
    and gives torch's result."""
    fn, reason = OTHER_CONVOLUTIONS[case]
    x = torch.randn(2, 3, 12, 12, device=DEV)
    w = torch.randn(5, 3, 4, 4, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        out = fn(x, w)
    reasons = rec.fallback_ops().get("convolution.default", [])
    assert any(reason in r for r in reasons), rec.summary()
    assert "convolution.default" not in rec.served
    torch.testing.assert_close(out, fn(x, w))


def test_backward_of_other_convolutions_is_handed_back() -> None:
    """convolution_backward of a strided-but-overlapping convolution goes to torch."""
    x = torch.randn(1, 2, 9, 9, device=DEV, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, device=DEV, requires_grad=True)
    with gemsops.use_gems(), gemsops.record() as rec:
        F.conv2d(x, w, stride=2).sum().backward()
    assert "convolution_backward.default" in rec.fallback_ops(), rec.summary()


def test_mismatched_inputs_raise_unsupported() -> None:
    """Inputs torch rejects (channel mismatch, kernel larger than the image, mixed dtypes)
    raise Unsupported before anything is computed, so torch's own error reaches the caller."""
    x = torch.randn(1, 3, 8, 8, device=DEV)
    for weight, inp in ((torch.randn(4, 2, 4, 4, device=DEV), x),
                        (torch.randn(4, 3, 4, 4, device=DEV), x[:, :, :3]),
                        (torch.randn(4, 3, 4, 4, device=DEV, dtype=torch.float16), x)):
        with pytest.raises(Unsupported, match="convolution with"):
            C.convolution(inp, weight, None, *_conv_args([4, 4]))


def test_out_overload_writes_the_given_tensor() -> None:
    """convolution.out (derived through the shared writer) is served and fills ``out``."""
    x = torch.randn(2, 3, 9, 8, device=DEV)
    w = torch.randn(4, 3, 4, 4, device=DEV)
    b = torch.randn(4, device=DEV)
    out = torch.empty(2, 4, 2, 2, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        torch.ops.aten.convolution.out(x, w, b, *_conv_args([4, 4]), out=out)
    assert rec.served["convolution.out"] == 1, rec.summary()
    assert_close(out, reference(F.conv2d, x, w, b, stride=4), reduce_size=48 * 4)


@pytest.mark.parametrize("weight_channels_last", [False, True])
@pytest.mark.parametrize("shape", [(0, 2, 1, 2), (0, 2, 3, 3), (0, 1, 2, 2), (0, 2, 2, 1)])
def test_empty_input_is_laid_out_as_torch_lays_it(shape: tuple[int, ...],
                                                  weight_channels_last: bool) -> None:
    """An empty batch gives an empty result in torch's layout: the input's where the
    result's shape is the input's (2 output channels here), contiguous otherwise."""
    for o in (2, 3):
        x = torch.randn(*shape).to(DEV, torch.float16)
        weight = torch.randn(o, shape[1], 1, 1).to(DEV, torch.float16)
        if weight_channels_last:
            weight = weight.contiguous(memory_format=torch.channels_last)
        else:
            x = x.contiguous(memory_format=torch.channels_last)
        out = C.convolution(x, weight, None, *_conv_args([1, 1]))
        assert out.shape == (0, o, shape[2], shape[3]) and out.dtype == torch.float16
        _same_layout(out, _torch_float32(F.conv2d, x, weight, None, [1, 1]))
