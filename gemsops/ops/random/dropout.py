"""Dropout in training and in-place Bernoulli sampling, on counter-based Philox numbers.

``F.dropout`` in training reaches ``native_dropout`` on accelerators (it returns the
output and a bool mask; autograd's backward is ``native_dropout_backward``, grad times
mask times scale) and ``bernoulli_`` followed by a division and a product on the CPU.
gemsops serves all three:

* ``native_dropout(input, p, train)``: element ``i`` is kept when the uniform number
  ``u_i`` in [0, 1) of its Philox counter is ``>= p`` (probability ``1 - p``); the
  output is ``input * keep * scale`` computed in float32 with ``scale = 1 / (1 - p)``
  rounded to float32 once, then rounded to nearest even in the input dtype (through
  the pointwise family's rounding, which also rounds bfloat16 on the interpreter): the
  values torch's own kernels give for that mask (dropped infinities and nans become
  nan, as there).
  ``train=False`` and ``p == 0`` give a copy of the input and an all-true mask;
  ``p == 1`` gives zeros and an all-false mask, as torch's accelerator kernel does.
* ``native_dropout_backward(grad, mask, scale)``: ``grad * mask * scale``, the same
  float32 arithmetic.
* ``bernoulli_(p)``: ``self`` filled with 1 where ``u_i < p`` and 0 elsewhere, in
  ``self``'s dtype (floating, integer or bool).

Each program draws four numbers per Philox counter (``tl.rand4x``) and uses them for
four slices of ``_BLOCK`` elements, so the element -> (counter, lane) map depends only
on ``_BLOCK``, a fixed constant: a key gives the same mask on every device and
configuration that runs the same Philox. Keys come from torch's generators
(:mod:`gemsops.ops.random.seed`), so ``torch.manual_seed`` makes runs reproducible.

Tensors are processed as flat runs of memory: an input that is non-overlapping and
dense (contiguous, channels-last, transposed) is read in place and the outputs take its
strides, as ``torch.empty_like`` gives them; other inputs are first copied into the
output. Counters are 32-bit, which covers ``2**34`` elements; larger tensors, float64
(the kernels scale in float32) and probabilities outside [0, 1] are handed to torch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, TL_DTYPES, check_supported
from gemsops.ops.grid import cdiv
from gemsops.ops.pointwise.codegen import to_half as _round
from gemsops.ops.random.seed import philox_key
from gemsops.ops.replay import replayable

__all__ = ["bernoulli", "native_dropout", "native_dropout_backward"]

_BLOCK = 1024
"""Elements per Philox lane in one program (a program covers ``4 * _BLOCK``). Fixed:
changing it changes which counter each element draws, so the masks a seed gives."""
_MAX_NUMEL = 4 * 2**32
"""Elements the 32-bit counters cover: four numbers per counter."""
_SCALED = (torch.float16, torch.bfloat16, torch.float32)
_CONSTS = {"BLOCK": _BLOCK}
"""The launches' constant keywords (one dict: the launch key remembers it by identity).
The tuning entries (``dropout``, ``bernoulli``, ``dropout_backward``) hold one config
of launch keywords each: ``BLOCK`` fixes the masks, and a benchmark would run a launch
that reads what it writes more than once."""


@triton.jit
def _dropout_lane(X, Y, Mask, idx, u, n, p, scale):
    inside = idx < n
    keep = u >= p
    x = tl.load(X + idx, mask=inside, other=0.0).to(tl.float32)
    # (x * keep) * scale as torch computes it: a dropped inf or nan gives nan.
    y = x * keep.to(tl.float32) * scale
    tl.store(Y + idx, _round(y, Y.dtype.element_ty), mask=inside)
    tl.store(Mask + idx, keep, mask=inside)


# Not deferred: a first call served by torch while this compiled would draw torch's
# numbers, not this kernel's (runs would differ by their compile timing).
@kernel("dropout", defer=False)
@triton.jit
def _dropout_kernel(
    X,  # input, a flat run of n elements
    Y,  # output, same strides as X
    Mask,  # bool mask, same strides as X
    Key,  # 0-dim int64 Philox key on the device
    n,
    p,  # probability of dropping an element
    scale,  # 1 / (1 - p), as float32
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    counter = (pid * BLOCK + lane).to(tl.uint32)
    u0, u1, u2, u3 = tl.rand4x(tl.load(Key), counter)
    base = pid * (4 * BLOCK) + lane
    _dropout_lane(X, Y, Mask, base, u0, n, p, scale)
    _dropout_lane(X, Y, Mask, base + BLOCK, u1, n, p, scale)
    _dropout_lane(X, Y, Mask, base + 2 * BLOCK, u2, n, p, scale)
    _dropout_lane(X, Y, Mask, base + 3 * BLOCK, u3, n, p, scale)


@triton.jit
def _bernoulli_lane(Out, idx, u, n, p):
    # Through float32, as every cast into a half type here (the interpreter's own
    # bool -> bfloat16 cast is broken); 0 and 1 are exact in every dtype.
    tl.store(Out + idx, _round((u < p).to(tl.float32), Out.dtype.element_ty), mask=idx < n)


@kernel("bernoulli", defer=False)
@triton.jit
def _bernoulli_kernel(
    Out,  # a flat run of n elements, any dtype
    Key,  # 0-dim int64 Philox key on the device
    n,
    p,  # probability of a 1
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    counter = (pid * BLOCK + lane).to(tl.uint32)
    u0, u1, u2, u3 = tl.rand4x(tl.load(Key), counter)
    base = pid * (4 * BLOCK) + lane
    _bernoulli_lane(Out, base, u0, n, p)
    _bernoulli_lane(Out, base + BLOCK, u1, n, p)
    _bernoulli_lane(Out, base + 2 * BLOCK, u2, n, p)
    _bernoulli_lane(Out, base + 3 * BLOCK, u3, n, p)


@kernel("dropout_backward")
@triton.jit
def _masked_scale_kernel(G, Mask, Out, n, scale, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < n
    g = tl.load(G + idx, mask=inside, other=0.0).to(tl.float32)
    m = tl.load(Mask + idx, mask=inside, other=0).to(tl.float32)
    tl.store(Out + idx, _round(g * m * scale, Out.dtype.element_ty), mask=inside)


def _dense(t: Tensor) -> bool:
    """Whether ``t``'s elements fill one run of memory without gaps or overlaps, so the
    kernels can walk it as ``data_ptr() + 0 .. numel() - 1`` (any dim order)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True)
                               if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_layout(a: Tensor, b: Tensor) -> bool:
    """Whether same-shaped ``a`` and ``b`` put every element at the same offset (the
    strides of size-1 dims do not matter)."""
    return all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape, strict=True)
               if n != 1)


def _memory_format(t: Tensor) -> torch.memory_format:
    """Channels-last for a channels-last 4-d (5-d) tensor, else contiguous: the layout
    torch's dropout backward gives its result."""
    if not t.is_contiguous():
        for dims, fmt in ((4, torch.channels_last), (5, torch.channels_last_3d)):
            if t.dim() == dims and t.is_contiguous(memory_format=fmt):
                return fmt
    return torch.contiguous_format


def _check_tensor(t: Tensor, what: str) -> None:
    if t.layout != torch.strided:
        raise Unsupported(f"{what} of a non-strided tensor")
    if t.numel() >= _MAX_NUMEL:
        raise Unsupported(f"{what} of {t.numel()} elements (32-bit Philox counters cover "
                          f"{_MAX_NUMEL})")


def _check_scaled(t: Tensor, what: str) -> None:
    _check_tensor(t, what)
    if t.dtype not in _SCALED:
        raise Unsupported(f"{what} of {t.dtype}")
    check_supported(t.dtype)


def _check_probability(p: float, what: str) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:  # nan included: torch decides (it raises or computes nan)
        raise Unsupported(f"{what} probability {p} outside [0, 1]")
    return p


def _programs(n: int) -> tuple[int]:
    return (cdiv(n, 4 * _BLOCK),)


@op("native_dropout.default", out="native_dropout.out")
def native_dropout(input: Tensor, p: float, train: bool | None = None) -> tuple[Tensor, Tensor]:
    """Dropout: zero each element with probability ``p`` and scale the rest by
    ``1 / (1 - p)``.

    Args:
        input: A float16, bfloat16 or float32 tensor.
        p: The probability of dropping an element, in [0, 1].
        train: False for evaluation (the input is copied, the mask is all true); None
            or True for training.

    Returns:
        ``(output, mask)``: the output in the input's dtype and the bool mask of the
        kept elements, both with the input's shape (and its strides when it is dense).
        The mask is drawn from the input device's default generator.
    """
    _check_scaled(input, "dropout")
    p = _check_probability(p, "dropout")
    if train is False or p == 0.0 or input.numel() == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1.0:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    out = torch.empty_like(input)
    mask = torch.empty_like(input, dtype=torch.bool)
    # An input that is not one dense run is first gathered into out, then read in place.
    in_place = _dense(input) and _same_layout(input, out)
    source = input if in_place else out.copy_(input)
    key = philox_key(input.device)
    scale = 1.0 / (1.0 - p)
    n = input.numel()
    _dropout_kernel.launch(_programs(n), (source, out, mask, key, n, p, scale), _CONSTS)
    return out, mask


def _in_its_layout(grad_output: object, mask: object, *_args: object, **_kw: object) -> bool:
    # A gradient or mask in another layout than the result's is first copied with a torch
    # call, which a replay would skip: replayed only when both are read as they are.
    if not isinstance(grad_output, Tensor) or not isinstance(mask, Tensor):
        return False
    fmt = _memory_format(grad_output)
    return grad_output.is_contiguous(memory_format=fmt) and mask.is_contiguous(
        memory_format=fmt)


@op("native_dropout_backward.default", out="native_dropout_backward.out")
@replayable(when=_in_its_layout)
def native_dropout_backward(grad_output: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Dropout's backward: ``grad_output * mask * scale``.

    Args:
        grad_output: The float16, bfloat16 or float32 gradient of dropout's output.
        mask: The bool mask dropout returned, same shape.
        scale: The forward's ``1 / (1 - p)`` (1 after an evaluation-mode forward).

    Returns:
        The gradient of dropout's input, in ``grad_output``'s dtype, contiguous (or
        channels-last where ``grad_output`` is), as torch's kernel lays it out.
    """
    _check_scaled(grad_output, "dropout backward")
    if mask.dtype != torch.bool:
        raise Unsupported(f"dropout backward with a {mask.dtype} mask")
    if mask.shape != grad_output.shape or mask.layout != torch.strided:
        raise Unsupported("dropout backward with a mask of another shape or layout")
    if mask.device != grad_output.device:
        raise Unsupported("dropout backward with a mask on another device")
    scale = float(scale)
    if not math.isfinite(scale):
        raise Unsupported(f"dropout backward scale {scale}")
    fmt = _memory_format(grad_output)
    out = torch.empty_like(grad_output, memory_format=fmt)
    n = out.numel()
    if n == 0:
        return out
    grad = grad_output if _same_layout(grad_output, out) else grad_output.contiguous(
        memory_format=fmt)
    keep = mask if _same_layout(mask, out) else mask.contiguous(memory_format=fmt)
    if not (_dense(out) and _same_layout(grad, out) and _same_layout(keep, out)):
        raise Unsupported("dropout backward operands that do not share one dense layout")
    _masked_scale_kernel.launch((cdiv(n, _BLOCK),), (grad, keep, out, n, scale), _CONSTS)
    return out


@op(inplace="bernoulli_.float")
def bernoulli(self: Tensor, p: float = 0.5, *, generator: torch.Generator | None = None,
              out: Tensor | None = None, inplace: bool = False) -> Tensor:
    """Bernoulli samples: 1 with probability ``p``, else 0, for every element of ``self``.

    Args:
        self: The tensor whose shape the samples take.
        p: The probability of a 1, in [0, 1].
        generator: The generator to draw the Philox key from; the default generator of
            ``self``'s device when None.
        out: Where to write the samples (any floating, integer or bool dtype, ``self``'s
            shape): ``self`` for ``bernoulli_``. A new tensor like ``self`` when None.
        inplace: Set by the in-place overload, which passes ``out=self``.

    Returns:
        The samples: ``out`` (``self`` when in place), or a new tensor of ``self``'s dtype.
    """
    _check_tensor(self, "bernoulli")
    p = _check_probability(p, "bernoulli")
    target = torch.empty_like(self) if out is None else out
    if target is not self and (target.shape != self.shape or target.device != self.device):
        raise Unsupported("bernoulli into an out of another shape or device")
    if target.layout != torch.strided or target.dtype not in TL_DTYPES:
        raise Unsupported(f"bernoulli into a {target.layout} {target.dtype} tensor")
    if target.dtype in FLOAT_DTYPES:
        check_supported(target.dtype)
    if any(stride == 0 and size > 1 for stride, size in zip(target.stride(), target.shape,
                                                             strict=True)):
        raise Unsupported("bernoulli into a tensor whose elements share memory")
    if target.numel() == 0:
        return target
    key = philox_key(target.device, generator)
    dense = _dense(target)
    flat = target if dense else torch.empty_like(target, memory_format=torch.contiguous_format)
    n = flat.numel()
    _bernoulli_kernel.launch(_programs(n), (flat, key, n, p), _CONSTS)
    if not dense:
        target.copy_(flat)  # a sliced target: written through its strides
    return target
