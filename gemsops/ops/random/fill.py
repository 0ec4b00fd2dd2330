"""In-place random fills: ``uniform_``, ``normal_``, ``random_`` and ``exponential_``.

What model initialisation calls (``nn.init`` and ``nn.Linear``'s reset reach
``uniform_`` and ``normal_``, ``torch.randint`` reaches ``random_.from``). Every value
comes from a counter-based Philox number keyed from torch's generator
(:mod:`gemsops.ops.random.seed`): ``torch.manual_seed`` makes a fill reproducible and each
call advances the generator by one draw. The values follow torch's distributions and
ranges but are not torch's own stream.

Element ``i`` of the fill's memory run takes its numbers from Philox counter
``i // BLOCK``-lane arithmetic alone (four 32-bit numbers per counter, used for four
slices of :data:`_BLOCK` elements; two 64-bit numbers for float64 and ``random_``), so
a key gives the same values on every device and launch configuration.

Ranges, exactly as torch's accelerator kernels give them:

* ``uniform_(from, to)``: ``u * (to - from) + from`` in float32 (float64 for float64),
  with ``u`` a 24-bit (53-bit) uniform in [0, 1) and ``from``, ``to`` and ``to - from``
  first rounded to the dtype, as torch does; the value is rounded to the dtype once, and
  a value that rounds up to ``to`` (or past it) is ``from``, the rule torch's CUDA kernel
  applies (pytorch issues 16706, 96947), so every value lies in ``[from, to)`` of the
  dtype. (Torch's CPU kernel can return ``to`` for half types; gemsops never does.) Bounds
  torch refuses (``from > to``, outside the dtype, ``to - from`` above its max) and
  integer tensors are handed back, so torch raises its own error.
* ``normal_(mean, std)``: Box-Muller on two uniforms, ``z * std + mean`` in float32
  (float64), rounded once; ``std < 0`` (or nan) is handed back (torch raises).
* ``random_``: integers, ``(v % span) + from`` of a 64-bit Philox number ``v``:
  ``random_(from, to)`` is ``[from, to - 1]``; ``random_(from)`` (``to=None``) and
  ``random_()`` go up to the dtype's largest integer (``2**digits`` for floating dtypes:
  2048 for float16, 256 for bfloat16, ``2**24``, ``2**53``; 1 for bool), and
  ``random_(-2**63)`` of an int64 takes all 64 bits. For floating dtypes only bounds within
  ``[-2**digits, 2**digits]`` are served (every integer there is exact; torch warns and
  rounds the bounds outside it); bounds torch refuses are handed back.
* ``exponential_(lambd)``: ``-log(u) / lambd`` with ``u`` in (0, 1], and ``log(u)``
  replaced by ``-eps / 2`` of the dtype where ``u >= 1 - eps / 2``, as torch's accelerator
  kernel does, so no value is 0 before rounding.

Tensors of any strides are filled: a dense one (contiguous, transposed, channels-last)
in place, through its memory run; others through a contiguous buffer copied back.
Tensors whose elements share memory, and more elements than the 32-bit counters cover,
are handed back.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, check_supported
from gemsops.ops.grid import cdiv
from gemsops.ops.pointwise.codegen import to_half as _round
from gemsops.ops.random.dropout import _dense
from gemsops.ops.random.seed import philox_key

__all__ = ["exponential_", "normal_", "random_", "uniform_"]

_BLOCK = 1024
"""Elements per Philox lane in one program. Fixed: changing it changes the values a key
gives."""
_UNIFORM, _NORMAL, _RANDOM, _EXPONENTIAL = 0, 1, 2, 3
_MAX_COUNTERS = 2**32
_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}
_RANDOM_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)


@triton.jit
def _out(v, DT: tl.constexpr):
    """``v`` in the output dtype DT, rounded once (half types through float32)."""
    if tl.int1 == DT:
        r = v != 0
    elif DT.is_floating() and DT.primitive_bitwidth == 16:
        r = _round(v, DT)
    else:
        r = v.to(DT)
    return r


@triton.jit
def _u24(r, OPEN: tl.constexpr):
    """A 32-bit number's top 24 bits as a float32 uniform: [0, 1), or (0, 1] (OPEN)."""
    x = (r >> 8).to(tl.float32)
    if OPEN:
        x = x + 1.0
    return x * 5.9604644775390625e-08  # 2**-24


@triton.jit
def _u53(v, OPEN: tl.constexpr):
    """A 64-bit number's top 53 bits as a float64 uniform: [0, 1), or (0, 1] (OPEN)."""
    x = (v >> 11).to(tl.float64)
    if OPEN:
        x = x + 1.0
    return x * 1.1102230246251565e-16  # 2**-53


@triton.jit
def _join(hi, lo):
    return (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)


@triton.jit
def _f64(bits):
    """A float64 passed as its int64 bit pattern (Triton passes Python floats as fp32)."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _uniform(u, a, b, c, DT: tl.constexpr):
    # a = from, b = to, c = to - from, all values of DT; u * c + a rounded once to DT.
    y = _out(u * c + a, DT)
    return tl.where(y.to(a.dtype) >= b, a.to(DT), y)


@triton.jit
def _exponential(u, c, EPS: tl.constexpr, DT: tl.constexpr):
    # c = -1 / lambd; log(u) of u in (0, 1], kept below 0 as torch's accelerator kernel.
    log = tl.where(u >= 1.0 - EPS / 2, -EPS / 2, tl.log(u))
    return _out(c * log, DT)


@triton.jit
def _normals(u1, u2, a, b, DT: tl.constexpr):
    # Box-Muller: u1 in (0, 1], u2 in [0, 1); a = mean, b = std.
    radius = tl.sqrt(-2.0 * tl.log(u1))
    theta = 6.283185307179586 * u2
    return _out(radius * tl.cos(theta) * b + a, DT), _out(radius * tl.sin(theta) * b + a, DT)


@triton.jit
def _integer(v, low, span, FULL: tl.constexpr, DT: tl.constexpr):
    # (v % span) + low over 64 bits (wrapping, exact in the result's range); FULL: v itself.
    if FULL:
        x = v
    else:
        x = v % span.to(tl.int64).to(tl.uint64)
        x = x + low.to(tl.int64).to(tl.uint64)
    return _out(x.to(tl.int64, bitcast=True), DT)


# Not deferred: who serves the call decides the numbers (see the dropout kernel).
@kernel("random_fill", defer=False)
@triton.jit(do_not_specialize=["a", "b", "c", "low", "span"])
def _fill_kernel(
    Out,  # a flat run of n elements
    Key,  # 0-dim int64 Philox key on the device
    n,
    a, b, c,  # float64 bit patterns: the mode's parameters (see the callers)
    low, span,  # random_: the lowest value and the number of values (int64 bits)
    MODE: tl.constexpr,
    WIDE: tl.constexpr,  # two 64-bit numbers per counter (float64, random_), else four 32-bit
    FULL: tl.constexpr,  # random_ over all 64 bits
    EPS: tl.constexpr,  # exponential_: the dtype's epsilon
    BLOCK: tl.constexpr,
):
    DT = Out.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    counter = (pid * BLOCK + lane).to(tl.uint32)
    r0, r1, r2, r3 = tl.randint4x(tl.load(Key), counter)
    r0 = r0.to(tl.uint32, bitcast=True)
    r1 = r1.to(tl.uint32, bitcast=True)
    r2 = r2.to(tl.uint32, bitcast=True)
    r3 = r3.to(tl.uint32, bitcast=True)
    if WIDE:
        i0 = pid * (2 * BLOCK) + lane
        i1 = i0 + BLOCK
        v0 = _join(r0, r1)
        v1 = _join(r2, r3)
        if MODE == 2:
            y0 = _integer(v0, low, span, FULL, DT)
            y1 = _integer(v1, low, span, FULL, DT)
        elif MODE == 1:
            y0, y1 = _normals(_u53(v0, True), _u53(v1, False), _f64(a), _f64(b), DT)
        elif MODE == 3:
            y0 = _exponential(_u53(v0, True), _f64(c), EPS, DT)
            y1 = _exponential(_u53(v1, True), _f64(c), EPS, DT)
        else:
            y0 = _uniform(_u53(v0, False), _f64(a), _f64(b), _f64(c), DT)
            y1 = _uniform(_u53(v1, False), _f64(a), _f64(b), _f64(c), DT)
        tl.store(Out + i0, y0, mask=i0 < n)
        tl.store(Out + i1, y1, mask=i1 < n)
    else:
        i0 = pid * (4 * BLOCK) + lane
        fa = _f64(a).to(tl.float32)
        fb = _f64(b).to(tl.float32)
        fc = _f64(c).to(tl.float32)
        if MODE == 1:
            y0, y1 = _normals(_u24(r0, True), _u24(r1, False), fa, fb, DT)
            y2, y3 = _normals(_u24(r2, True), _u24(r3, False), fa, fb, DT)
        elif MODE == 3:
            y0 = _exponential(_u24(r0, True), fc, EPS, DT)
            y1 = _exponential(_u24(r1, True), fc, EPS, DT)
            y2 = _exponential(_u24(r2, True), fc, EPS, DT)
            y3 = _exponential(_u24(r3, True), fc, EPS, DT)
        else:
            y0 = _uniform(_u24(r0, False), fa, fb, fc, DT)
            y1 = _uniform(_u24(r1, False), fa, fb, fc, DT)
            y2 = _uniform(_u24(r2, False), fa, fb, fc, DT)
            y3 = _uniform(_u24(r3, False), fa, fb, fc, DT)
        tl.store(Out + i0, y0, mask=i0 < n)
        tl.store(Out + i0 + BLOCK, y1, mask=i0 + BLOCK < n)
        tl.store(Out + i0 + 2 * BLOCK, y2, mask=i0 + 2 * BLOCK < n)
        tl.store(Out + i0 + 3 * BLOCK, y3, mask=i0 + 3 * BLOCK < n)


_CONSTS: dict[tuple[int, bool, bool, float], dict[str, object]] = {}


def _consts(mode: int, wide: bool, full: bool, eps: float) -> dict[str, object]:
    """The constant keywords of one launch, one dict per set (the launch key remembers
    it by identity)."""
    key = (mode, wide, full, eps)
    hit = _CONSTS.get(key)
    if hit is None:
        hit = _CONSTS[key] = {"MODE": mode, "WIDE": wide, "FULL": full, "EPS": eps,
                              "BLOCK": _BLOCK}
    return hit


def _bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _as_int64(value: int) -> int:
    """An unsigned 64-bit value as the int64 of the same bits."""
    return value - 2**64 if value >= 2**63 else value


def _check(self: Tensor, what: str, dtypes: tuple[torch.dtype, ...]) -> None:
    if self.layout != torch.strided or self.dtype not in dtypes:
        raise Unsupported(f"{what} of a {self.layout} {self.dtype} tensor")
    check_supported(self.dtype)
    if any(stride == 0 and size > 1 for stride, size in zip(self.stride(), self.shape,
                                                             strict=True)):
        raise Unsupported(f"{what} of a tensor whose elements share memory")


def _in_dtype(value: float, dtype: torch.dtype) -> Tensor:
    """``value`` rounded to ``dtype``, a CPU scalar (torch's conversion of a double)."""
    return torch.tensor(value, dtype=torch.float64).to(dtype)


def _fill(self: Tensor, generator: torch.Generator | None, mode: int, *, a: float = 0.0,
          b: float = 0.0, c: float = 0.0, low: int = 0, span: int = 0,
          full: bool = False) -> Tensor:
    n = self.numel()
    if n == 0:
        return self  # torch returns at once too: the generator does not move
    wide = mode == _RANDOM or self.dtype == torch.float64
    per = 2 if wide else 4
    if n > per * _MAX_COUNTERS:
        raise Unsupported(f"a random fill of {n} elements (32-bit Philox counters cover "
                          f"{per * _MAX_COUNTERS})")
    eps = torch.finfo(self.dtype).eps if self.dtype.is_floating_point else 0.0
    key = philox_key(self.device, generator)
    dense = _dense(self)
    flat = self if dense else torch.empty_like(self, memory_format=torch.contiguous_format)
    _fill_kernel.launch(
        (cdiv(n, per * _BLOCK),),
        (flat, key, n, _bits(a), _bits(b), _bits(c), _as_int64(low), _as_int64(span)),
        _consts(mode, wide, full, eps))
    if not dense:
        self.copy_(flat)  # written back through self's strides
    return self


@op("uniform_.default", args={"from": "low"})
def uniform_(self: Tensor, low: float = 0.0, to: float = 1.0, *,
             generator: torch.Generator | None = None) -> Tensor:
    """Fill ``self`` in place with uniform values in ``[from, to)`` of its dtype.

    Args:
        self: A float16, bfloat16, float32 or float64 tensor, any strides.
        low: ``from``, the lowest value (aten's ``from``).
        to: The bound no value reaches.
        generator: The generator the Philox key is drawn from; the default generator of
            ``self``'s device when None.

    Returns:
        ``self``. The values are not torch's stream (see the module docstring).
    """
    _check(self, "uniform_", FLOAT_DTYPES)
    low, to = float(low), float(to)
    big = float(torch.finfo(self.dtype).max)
    if not (-big <= low <= big and -big <= to <= big and low <= to and to - low <= big):
        raise Unsupported(f"uniform_ bounds from={low}, to={to} for {self.dtype} "
                          "(torch raises)")
    first, last = _in_dtype(low, self.dtype), _in_dtype(to, self.dtype)
    width = last - first  # in the dtype's arithmetic, as torch's kernel computes it
    return _fill(self, generator, _UNIFORM, a=float(first), b=float(last), c=float(width))


@op("normal_.default")
def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *,
            generator: torch.Generator | None = None) -> Tensor:
    """Fill ``self`` in place with normal values of mean ``mean`` and deviation ``std``.

    Args:
        self: A float16, bfloat16, float32 or float64 tensor, any strides.
        mean: The mean.
        std: The standard deviation, at least 0.
        generator: The generator the Philox key is drawn from; the default generator of
            ``self``'s device when None.

    Returns:
        ``self``. The values are not torch's stream (see the module docstring).
    """
    _check(self, "normal_", FLOAT_DTYPES)
    mean, std = float(mean), float(std)
    if not std >= 0.0:
        raise Unsupported(f"normal_ with std {std} (torch raises)")
    return _fill(self, generator, _NORMAL, a=mean, b=std)


@op("exponential_.default")
def exponential_(self: Tensor, lambd: float = 1.0, *,
                 generator: torch.Generator | None = None) -> Tensor:
    """Fill ``self`` in place with exponential values of rate ``lambd``.

    Args:
        self: A float16, bfloat16, float32 or float64 tensor, any strides.
        lambd: The rate, positive and finite.
        generator: The generator the Philox key is drawn from; the default generator of
            ``self``'s device when None.

    Returns:
        ``self``. The values are not torch's stream (see the module docstring).
    """
    _check(self, "exponential_", FLOAT_DTYPES)
    lambd = float(lambd)
    if not (0.0 < lambd < math.inf):
        raise Unsupported(f"exponential_ with lambda {lambd} (torch raises)")
    return _fill(self, generator, _EXPONENTIAL, c=-1.0 / lambd)


def _integer_bounds(dtype: torch.dtype) -> tuple[int, int]:
    """The lowest and highest value ``random_`` may produce in ``dtype`` (floats: the
    band of exact integers)."""
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_floating_point:
        top = 2 ** _DIGITS[dtype]
        return -top, top
    info = torch.iinfo(dtype)
    return int(info.min), int(info.max)


@op("random_.from", "random_.to", "random_.default", args={"from": "low"})
def random_(self: Tensor, low: int = 0, to: int | None = None, *,
            generator: torch.Generator | None = None) -> Tensor:
    """Fill ``self`` in place with integers uniform in ``[from, to - 1]``.

    Serves ``random_(from, to)``, ``random_(to)`` (from 0) and ``random_()``. With
    ``to=None`` the top is the dtype's largest value (``2**digits`` for floating dtypes,
    as torch documents: every value then is exact), and ``from = -2**63`` of an int64
    takes all 64 bits.

    Args:
        self: A floating, integer or bool tensor, any strides.
        low: ``from``, the lowest value (aten's ``from``).
        to: One past the highest value, or None.
        generator: The generator the Philox key is drawn from; the default generator of
            ``self``'s device when None.

    Returns:
        ``self``. The values are not torch's stream (see the module docstring).
    """
    _check(self, "random_", _RANDOM_DTYPES)
    low = int(low)
    lowest, highest = _integer_bounds(self.dtype)
    if to is None:
        if self.dtype == torch.int64 and low == -(2**63):
            return _fill(self, generator, _RANDOM, full=True)
        if self.dtype.is_floating_point and low >= highest:
            raise Unsupported(f"random_ from {low} in {self.dtype} (torch raises)")
        top = highest
    else:
        if int(to) <= low:
            raise Unsupported(f"random_ from {low} to {to} (torch raises)")
        top = int(to) - 1
    if not (lowest <= low <= top <= highest):
        raise Unsupported(f"random_ from {low} to {top + 1} for {self.dtype} (outside "
                          f"[{lowest}, {highest}]: torch raises, or warns and rounds)")
    return _fill(self, generator, _RANDOM, low=low, span=top - low + 1)
