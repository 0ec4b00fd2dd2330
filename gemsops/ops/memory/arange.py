"""``arange``: the values ``start + step * i`` for ``i`` in ``range(size)``.

aten's ``arange`` overloads (``arange.default``, ``arange.start``, ``arange.start_step``,
``arange.out``) are CompositeExplicitAutograd: they pick the dtype (int64 when ``start``,
``end`` and ``step`` are all integral and no dtype is given, else the default float
dtype) and call ``arange.start_out``, the one overload that reaches a backend kernel, so
that is what gemsops serves.

It computes as torch's accelerator kernel computes: the bounds and the step's sign are
checked and the size ``ceil((end - start) / step)`` is found in double precision (for
int64 results, in integer arithmetic on the values converted to int64); each element is
``start + step * i`` in the accumulator type (float32 for float16, bfloat16 and float32
results, float64 for float64, int64 for integers), converted to the result dtype (half
types round through float32; narrower integers wrap).

What torch raises on (a zero step, a step whose sign does not lead from ``start`` to
``end``, a non-finite bound, a bound that overflows the dtype, a bool or complex result)
and an ``out`` torch would resize with a warning are refused with
:class:`~gemsops.errors.Unsupported`.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl
from torch import Tensor

import gemshal
from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, TL_DTYPES, Number, check_supported
from gemsops.ops.grid import cdiv
from gemsops.ops.memory.copy import cast_into, check_input

__all__ = ["arange"]

_INT64_MAX = 2**63 - 1


# One element per lane, memory bound like the pointwise kernels; its own tuning entry
# (the pointwise entry's rows name the element function, which this kernel has not).
@kernel("arange", key=["SIZE_CLASS"])
@triton.jit(do_not_specialize=["SIZE_CLASS", "start", "step"])
def _arange_kernel(
    Out,  # contiguous output
    start, step,  # int64 values, or float64 bit patterns (FLOAT)
    n,
    SIZE_CLASS,  # n.bit_length(): the tuning key, unused in the body
    FLOAT: tl.constexpr,  # start and step are float64 bits, computed in ACC
    ACC: tl.constexpr,  # the accumulator type of a float result
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if FLOAT:
        s = start.to(tl.int64).to(tl.float64, bitcast=True).to(ACC)
        d = step.to(tl.int64).to(tl.float64, bitcast=True).to(ACC)
        v = s + d * offs.to(ACC)
    else:
        v = start.to(tl.int64) + step.to(tl.int64) * offs
    tl.store(Out + offs, v.to(Out.dtype.element_ty), mask=mask)


def _bits(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _as_float32(value: float) -> float:
    """``value`` rounded to float32, as torch's checked ``Scalar.to<float>()``."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError as exc:
        raise Unsupported(f"{value} overflows float32") from exc  # torch raises


def _as_int64(value: Number) -> int:
    """``value`` converted to int64, as torch's checked ``Scalar.to<int64_t>()``."""
    if isinstance(value, float) and not math.isfinite(value):
        raise Unsupported(f"{value} cannot be converted to int64")  # torch raises
    result = int(value)
    if not -(2**63) <= result <= _INT64_MAX:
        raise Unsupported(f"{value} overflows int64")  # torch raises
    return result


def _number(value: object, name: str) -> Number:
    if isinstance(value, Tensor):  # a 0-dim tensor where the schema takes a Scalar
        value = value.item()
    if not isinstance(value, bool | int | float):
        raise Unsupported(f"arange {name} {value!r}")  # complex: torch raises
    return value


def _size(start: Number, end: Number, step: Number,
          dtype: torch.dtype) -> tuple[int, int | float, int | float]:
    """(size, start, step in the accumulator type), checked as torch checks them: the
    bounds and the step's sign in double precision, the size in double precision too
    (in int64 arithmetic for int64 results)."""
    dstart, dend, dstep = float(start), float(end), float(step)
    if not (dstep > 0 or dstep < 0):
        raise Unsupported("arange step must be nonzero")  # torch raises
    if not (math.isfinite(dstart) and math.isfinite(dend)):
        raise Unsupported(f"arange range {dstart} -> {dend}")  # torch raises
    if not ((dstep > 0 and dend >= dstart) or (dstep < 0 and dend <= dstart)):
        raise Unsupported("arange bounds inconsistent with the step sign")  # torch raises
    xs: int | float
    xd: int | float
    if dtype.is_floating_point:
        if dtype == torch.float64:
            xs, xd = dstart, dstep
        else:
            xs, xd = _as_float32(dstart), _as_float32(dstep)
    else:
        xs, xd = _as_int64(start), _as_int64(step)
        if xd == 0:
            # A fractional step below 1 truncates to 0 in an integer dtype: torch 2.13's
            # CPU kernel repeats start, older kernels divide by it (a floating point
            # exception). Left to torch's kernel, which decides.
            raise Unsupported(f"arange with an integer dtype and step {step} (truncates to 0)")
    if dtype == torch.int64:
        xe = _as_int64(end)
        if xd == 0:
            raise Unsupported("arange step must be nonzero")  # torch raises
        sgn = (xd > 0) - (xd < 0)
        num = xe - xs + xd - sgn
        if not -(2**63) <= num <= _INT64_MAX:
            raise Unsupported("arange size overflows int64")
        size_d: float = abs(num) // abs(xd) * (1 if (num < 0) == (xd < 0) else -1)  # C's /
    else:
        size_d = math.ceil((dend - dstart) / dstep)
    if not 0 <= size_d <= _INT64_MAX:
        raise Unsupported(f"arange size {size_d}")  # torch raises
    return int(size_d), xs, xd


@op(out="arange.start_out")
def arange(start: Number, end: Number, step: Number = 1, *, out: Tensor | None = None,
           dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> Tensor:
    """``start, start + step, ...`` up to (not including) ``end``, as ``torch.arange``.

    Args:
        start: The first value.
        end: The bound, excluded.
        step: The nonzero increment.
        out: The tensor written (aten's ``arange.start_out``): resized to the size when
            it is empty; a contiguous one of that many elements keeps its shape.
        dtype: Without ``out``: the dtype (int64 for integral bounds and step, else the
            default float dtype, when None).
        device: Without ``out``: the device (the current one when None).

    Returns:
        ``out``, or a new 1-D tensor.

    Raises:
        Unsupported: what torch raises on (see the module docstring), an ``out`` of
            another size holding elements (torch resizes it with a warning), or a dtype
            the kernels do not take.
    """
    start, end, step = (_number(v, n) for v, n in ((start, "start"), (end, "end"),
                                                    (step, "step")))
    if out is None:
        if dtype is None:
            integral = all(isinstance(v, bool | int) for v in (start, end, step))
            dtype = torch.int64 if integral else torch.get_default_dtype()
        if device is None:
            device = gemshal.current_device().torch_device
        out = torch.empty(0, dtype=dtype, device=device)
    check_input(out, "arange out")
    if out.dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise Unsupported(f"arange of dtype {out.dtype}")  # bool: torch raises
    check_supported(out.dtype)
    size, xs, xd = _size(start, end, step, out.dtype)
    if out.numel() != size:
        if out.numel():
            raise Unsupported(f"arange out of {out.numel()} elements for {size}: torch "
                              "resizes it with a warning")
        out.resize_((size,))
    if size == 0:
        return out
    half = out.dtype in (torch.float16, torch.bfloat16)
    if out.is_contiguous() and not half:
        target = out
    else:
        # Half types are computed in float32 and rounded by the copy (as torch rounds).
        target = torch.empty(out.shape, dtype=torch.float32 if half else out.dtype,
                             device=out.device)
    floating = out.dtype.is_floating_point
    acc = TL_DTYPES[torch.float64 if out.dtype == torch.float64 else torch.float32]
    _arange_kernel.launch(
        lambda meta: (cdiv(size, meta["BLOCK"]),),
        (target, _bits(float(xs)) if floating else xs,
         _bits(float(xd)) if floating else xd, size, size.bit_length()),
        {"FLOAT": floating, "ACC": acc},
    )
    if target is not out:
        cast_into(out, target)
    return out
