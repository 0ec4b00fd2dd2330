"""Layer norm and RMS norm, forward and backward: row-wise kernels with fp32 statistics.

Each program normalizes ``BLOCK_M`` rows, walking a row in ``BLOCK_N`` chunks, so any row
length works. Statistics come from one pass (per-lane Welford for mean and variance,
exact once the lanes are combined); the chunk loaded last stays in registers for the
second, normalizing pass, so a row that fits in one chunk is read once. The weight and
bias gradients are column sums over all rows: partial sums over row slices, then a sum
of the partials, without atomics (deterministic).

torch reaches these kernels through ``native_layer_norm`` (every device) and through
``_fused_rms_norm`` (the backend kernel ``rms_norm`` calls on accelerators; on the CPU
``rms_norm`` is a composite of pointwise ops, so :func:`rms_norm` is the way in there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

import gemshal
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, acc_dtype, check_supported, tl_acc
from gemsops.ops.grid import cdiv
from gemsops.ops.higher_order import gems_backward, higher_order, torch_gradients
from gemsops.ops.norm.kernels import KERNELS as _KERNELS
from gemsops.ops.norm.kernels import column_sum_kernel as _column_sum_kernel
from gemsops.ops.pointwise.types import holds_large
from gemsops.ops.replay import replayable

__all__ = [
    "fused_rms_norm",
    "fused_rms_norm_backward",
    "layer_norm",
    "native_layer_norm",
    "native_layer_norm_backward",
    "rms_norm",
]

def _rows(x: Tensor, ns: tuple[int, ...], *params: Tensor | None) -> tuple[int, int]:
    """Check the inputs as the aten kernels do; return (rows, row length).

    ``ns`` is the normalized shape as a tuple of ints (from :func:`_shape`).
    """
    if x.layout != torch.strided or x.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"norm of a {x.layout} {x.dtype} tensor")
    shape = x.shape
    k = len(ns)
    # torch.Size is a tuple: its trailing slice compares with ns directly.
    if not k or len(shape) < k or shape[len(shape) - k:] != ns:
        raise Unsupported("normalized_shape does not match the input's trailing dims")
    device = x.device
    for p in params:
        if p is not None and (p.layout != torch.strided or p.dtype not in FLOAT_DTYPES
                              or p.device != device or p.shape != ns):
            raise Unsupported("weight/bias shape, dtype, layout or device unsupported")
    check_supported(x.dtype)
    N = math.prod(ns)
    M = x.numel() // N if N else math.prod(shape[: len(shape) - k])
    if N == 0 and M != 0:
        raise Unsupported("empty normalized shape")  # torch defines stats of 0 elements
    return M, N


_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _consts(rms: bool, dtype: torch.dtype, has_w: bool, has_b: bool) -> dict[str, Any]:
    """The constant keywords of a forward launch (cached: one dict per key, never changed)."""
    key = (0, rms, dtype, has_w, has_b)
    try:
        return _CONSTS[key]
    except KeyError:
        consts = _CONSTS[key] = {"IS_RMS": rms, "HAS_W": has_w, "HAS_B": has_b,
                                 "ACC": tl_acc(dtype)}
        return consts


def _bwd_consts(rms: bool, dtype: torch.dtype, has_w: bool, dx: bool, dw: bool, db: bool
                ) -> dict[str, Any]:
    """The constant keywords of a backward launch: the norm, whether a weight scales dy,
    and which of dx, the weight gradient and the bias gradient are written (cached)."""
    key = (1, rms, dtype, has_w, dx, dw, db)
    try:
        return _CONSTS[key]
    except KeyError:
        consts = _CONSTS[key] = {"IS_RMS": rms, "HAS_W": has_w, "HAS_DX": dx, "HAS_DW": dw,
                                 "HAS_DB": db, "ACC": tl_acc(dtype)}
        return consts


BWD_WAVES = 4
"""Most backward programs per multiprocessor. Each program walks its own slice of rows;
a few per multiprocessor keep enough loads in flight to reach the memory bandwidth."""

BWD_MIN_ROWS = 32
"""Fewest rows a backward program takes once every multiprocessor has one. Every program
writes (and the column sum reads back) one row of fp32 partial sums, so with slices of
32 rows or more that traffic is at most about 4% of reading dy and x and writing dx in a
half type (8 bytes a column against 6 a row and column)."""


def row_split(M: int, multiprocessors: int) -> tuple[int, int]:
    """How the backward splits ``M`` rows: ``(programs, rows per program)``.

    Aims at one program per multiprocessor at least (while there are rows for it), at
    most :data:`BWD_WAVES` per multiprocessor, and beyond one per multiprocessor no slice
    under :data:`BWD_MIN_ROWS` rows. Slices are contiguous and of one length but the
    last, which has at least one row (so a few rows per program may leave up to half the
    aimed-at programs out). No rows: ``(0, 1)``.
    """
    if M <= 0:
        return 0, 1
    sms = max(multiprocessors, 1)
    parts = min(M, max(sms, min(BWD_WAVES * sms, cdiv(M, BWD_MIN_ROWS))))
    rows_per = cdiv(M, parts)
    return cdiv(M, rows_per), rows_per


def _as_rows(t: Tensor, M: int, N: int) -> tuple[Tensor, int]:
    """``t`` as [M, N] rows with unit column stride, and the row stride (copying only when
    no such view exists)."""
    if t.is_contiguous():
        return t, N
    t2 = t.reshape(M, N)
    if t2.stride(1) != 1 and N != 1:
        t2 = t2.contiguous()
    return t2, t2.stride(0)


def _flat(t: Tensor | None) -> Tensor | None:
    # Parameters are indexed as flat contiguous [N] arrays.
    return t if t is None or t.is_contiguous() else t.contiguous()


def _forward(x: Tensor, normalized_shape: tuple[int, ...], weight: Tensor | None,
             bias: Tensor | None, eps: float, rms: bool,
             stat_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    M, N = _rows(x, normalized_shape, weight, bias)
    axis = x.dim() - len(normalized_shape)
    # empty_like with a contiguous format: torch.empty(x.shape, ...)'s result, cheaper.
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    stat_shape = (*x.shape[:axis], *((1,) * len(normalized_shape)))
    device = x.device
    rstd = torch.empty(stat_shape, dtype=stat_dtype, device=device)
    # RMS norm has no mean: its slot repeats rstd (never written by the kernel).
    mean = rstd if rms else torch.empty(stat_shape, dtype=stat_dtype, device=device)
    if M == 0:
        return y, mean, rstd
    x2, stride_x = _as_rows(x, M, N)
    w, b = _flat(weight), _flat(bias)
    consts = _consts(rms, x.dtype, w is not None, b is not None)
    _KERNELS[rms][0].launch(
        lambda meta: (cdiv(M, meta["BLOCK_M"]),),
        (x2, w if w is not None else x2, b if b is not None else x2, y, mean, rstd,
         M, N, stride_x, N, float(eps)),
        consts,
    )
    return y, mean, rstd


def _backward(dy: Tensor, x: Tensor, normalized_shape: tuple[int, ...], mean: Tensor | None,
              rstd: Tensor, weight: Tensor | None, bias: Tensor | None,
              mask: Sequence[bool], rms: bool) -> tuple[Tensor | None, ...]:
    """dx, the weight gradient and the bias gradient (None where not wanted).

    One launch reads dy and x once: it writes dx and per-slice partial column sums of
    ``dy * x_hat`` (weight) and ``dy`` (bias) into fp32 (fp64) ``[P, N]`` buffers, one row
    per program; one column-sum launch per gradient adds the ``P`` rows. No atomics, so
    the sums are deterministic.
    """
    M, N = _rows(x, normalized_shape, weight, bias)
    if dy.shape != x.shape or dy.device != x.device or dy.dtype not in FLOAT_DTYPES:
        raise Unsupported("grad_out does not match the input")
    if any(t is not None and (t.device != x.device or t.numel() != M) for t in (mean, rstd)):
        raise Unsupported("statistics do not match the input")
    want_dx, want_dw = bool(mask[0]), bool(mask[1]) and weight is not None
    want_db = (not rms) and bool(mask[2]) and bias is not None
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if want_dx else None
    if not (want_dx or want_dw or want_db):
        return None, None, None
    (x2, sx), (dy2, sdy) = _as_rows(x, M, N), _as_rows(dy, M, N)
    rstd_f = rstd if rstd.is_contiguous() else rstd.contiguous()
    # RMS norm has no mean: its slot repeats rstd (never read by the kernels).
    mean_f = rstd_f if mean is None else _flat(mean)
    assert mean_f is not None
    w = _flat(weight)
    dev = x.device
    parts, rows_per = row_split(M, gemshal.device_of(x).multiprocessor_count)
    acc_t = acc_dtype(x.dtype)
    # Partial column sums, row p written by program p (every row of them).
    pw = torch.empty((parts, N), dtype=acc_t, device=dev) if want_dw else None
    pb = torch.empty((parts, N), dtype=acc_t, device=dev) if want_db else None
    dw = db = None
    if want_dw:
        assert weight is not None
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=dev)
    if want_db:
        assert bias is not None
        db = torch.empty(bias.shape, dtype=bias.dtype, device=dev)
    if parts:
        _KERNELS[rms][1].launch(
            (parts,),
            (dy2, x2, w if w is not None else x2, mean_f, rstd_f,
             dx if dx is not None else x2, pw if pw is not None else rstd_f,
             pb if pb is not None else rstd_f, M, N, sdy, sx, N, rows_per),
            _bwd_consts(rms, x.dtype, w is not None, want_dx, want_dw, want_db),
        )
    # No rows: no partials, and the column sums write zeros.
    for part, out in ((pw, dw), (pb, db)):
        if part is not None and out is not None and N:
            _column_sum_kernel[lambda meta: (cdiv(N, meta["BLOCK_N"]),)](part, out, parts, N)
    return dx, dw, db


def _ln_stat_dtype(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> torch.dtype:
    """The dtype torch gives layer norm's mean and rstd, which its backward kernels expect."""
    for p in (weight, bias):
        mixed = x.dtype in (torch.float16, torch.bfloat16) and p is not None \
            and p.dtype == torch.float32
        if p is not None and p.dtype != x.dtype and not mixed:
            raise Unsupported("weight/bias dtype differs from the input's")
    if not x.is_cpu:
        return acc_dtype(x.dtype)
    # torch's CPU kernel keeps the statistics in the input dtype, or in the parameters'
    # when a half input has fp32 parameters.
    p = weight if weight is not None else bias
    return p.dtype if p is not None else x.dtype


def _check_edges(x: Tensor, N: int) -> None:
    """On the CPU, hand rows torch's kernel answers by its summation order back to it.

    torch's CPU layer norm (a vectorised Welford pass) gives the mean of a row holding
    an infinity as inf or nan by the infinity's position, and nan for rows whose squared
    deviations overflow its float accumulator (``|x| >= sqrt(max / 4N)``), by its lane
    width. Such inputs go to torch's own kernel. nan rows need nothing: all nan, as in
    torch. Off the CPU no input is read (a device sync): there such rows give nan
    outputs and rstd.
    """
    if N and holds_large(x, math.sqrt(torch.finfo(acc_dtype(x.dtype)).max / (4 * N))):
        raise Unsupported("an infinite or huge input: torch's statistics depend on its order")


def _off_the_cpu(input: Tensor, *_args: Any, **_kwargs: Any) -> bool:
    # On the CPU layer norm reads its input for huge values (_check_edges): not replayed.
    return not input.is_cpu


def _shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    return tuple(map(int, normalized_shape))


@op("native_layer_norm.default")
@replayable(when=_off_the_cpu)
def native_layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None,
                      bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Layer norm over the trailing ``normalized_shape`` dims, with its statistics.

    Args:
        input: The tensor to normalize (any strides; float16/bfloat16/float32/float64).
        normalized_shape: The trailing dims normalized together.
        weight: Optional scale of ``normalized_shape`` (fp32 with a half input is allowed).
        bias: Optional shift of ``normalized_shape``.
        eps: Added to the variance.

    Returns:
        ``(out, mean, rstd)``; the statistics have the input's leading shape followed by
        ones, in the dtype torch's kernel for this device uses.

    Raises:
        Unsupported: an input this kernel does not take (torch's kernel serves it).
    """
    ns = _shape(normalized_shape)
    stat_dtype = _ln_stat_dtype(input, weight, bias)
    if input.is_cpu and input.dtype in FLOAT_DTYPES and input.layout == torch.strided:
        _check_edges(input, math.prod(ns))
    return _forward(input, ns, weight, bias, eps, False, stat_dtype)


def _rows_as_given(grad_out: Tensor, input: Tensor, _ns: Any, *rest: Any, **_kw: Any) -> bool:
    # The backward copies a non-contiguous dy, x, statistic or parameter with a torch
    # call into a buffer its launch reads: a replay would skip the copy. Replayed only
    # when every tensor is contiguous (its launch then takes them as they are).
    return all(t.is_contiguous() for t in (grad_out, input, *rest) if isinstance(t, Tensor))


@op("native_layer_norm_backward.default")
@replayable(when=_rows_as_given, workspaces=True)
def native_layer_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int],
                               mean: Tensor, rstd: Tensor, weight: Tensor | None,
                               bias: Tensor | None, output_mask: Sequence[bool]
                               ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of layer norm: ``(grad_input, grad_weight, grad_bias)``, None where masked off.

    Raises:
        Unsupported: an input this kernel does not take.
    """
    _ln_stat_dtype(input, weight, bias)
    dx, dw, db = _backward(grad_out, input, _shape(normalized_shape), mean, rstd, weight, bias,
                           output_mask, False)
    return dx, dw, db


def _rms_eps(dtype: torch.dtype, eps: float | None) -> float:
    # torch's default: the machine epsilon of the accumulation type (not of the input's).
    # A dtype that is not floating has no such epsilon; _rows refuses it.
    if eps is not None:
        return float(eps)
    return torch.finfo(acc_dtype(dtype)).eps if dtype.is_floating_point else 0.0


@op("_fused_rms_norm.default")
@replayable()
def fused_rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None,
                   eps: float | None) -> tuple[Tensor, Tensor]:
    """RMS norm with its statistic: ``(out, rstd)``, rstd in fp32 (fp64 for fp64 input).

    Raises:
        Unsupported: an input this kernel does not take.
    """
    y, _, rstd = _forward(input, _shape(normalized_shape), weight, None,
                          _rms_eps(input.dtype, eps), True, acc_dtype(input.dtype))
    return y, rstd


@op("_fused_rms_norm_backward.default")
@replayable(when=_rows_as_given, workspaces=True)
def fused_rms_norm_backward(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int],
                            rstd: Tensor, weight: Tensor | None, output_mask: Sequence[bool]
                            ) -> tuple[Tensor | None, Tensor | None]:
    """Gradients of RMS norm: ``(grad_input, grad_weight)``, None where masked off.

    Raises:
        Unsupported: an input this kernel does not take.
    """
    dx, dw, _ = _backward(grad_out, input, _shape(normalized_shape), None, rstd, weight, None,
                          (*output_mask, False), True)
    return dx, dw


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, ns: tuple[int, ...], w: Tensor | None, b: Tensor | None,
                eps: float) -> Tensor:
        y, mean, rstd = native_layer_norm(x, ns, w, b, eps)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.ns, ctx.eps = ns, eps
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, w, b, mean, rstd = ctx.saved_tensors
        twice = higher_order()
        if not twice:
            mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.needs_input_grad[3])
            got = gems_backward("layer_norm backward", lambda: native_layer_norm_backward(
                dy, x, ctx.ns, mean, rstd, w, b, mask))
            if got is not None:
                dx, dw, db = got
                return dx, None, dw, db, None
        gx, gw, gb = torch_gradients(
            lambda: torch.nn.functional.layer_norm(x, ctx.ns, w, b, ctx.eps), (x, w, b), dy,
            create_graph=twice)
        return gx, None, gw, gb, None


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, ns: tuple[int, ...], w: Tensor | None,
                eps: float | None) -> Tensor:
        y, rstd = fused_rms_norm(x, ns, w, eps)
        ctx.save_for_backward(x, w, rstd)
        ctx.ns, ctx.eps = ns, eps
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, w, rstd = ctx.saved_tensors
        twice = higher_order()
        if not twice:
            mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[2])
            got = gems_backward("rms_norm backward", lambda: fused_rms_norm_backward(
                dy, x, ctx.ns, rstd, w, mask))
            if got is not None:
                dx, dw = got
                return dx, None, dw, None
        gx, gw = torch_gradients(
            lambda: torch.nn.functional.rms_norm(x, ctx.ns, w, ctx.eps), (x, w), dy,
            create_graph=twice)
        return gx, None, gw, None


def _needs_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@op()
def layer_norm(input: Tensor, normalized_shape: int | Sequence[int],
               weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.layer_norm`` on gemsops kernels, differentiable.

    Args:
        input: The tensor to normalize.
        normalized_shape: The trailing dims normalized together.
        weight: Optional elementwise scale.
        bias: Optional elementwise shift.
        eps: Added to the variance.

    Returns:
        The normalized tensor, in the input's dtype.

    Raises:
        Unsupported: an input these kernels do not take.
    """
    ns = _shape(normalized_shape)
    if _needs_grad(input, weight, bias):
        return _LayerNorm.apply(input, ns, weight, bias, eps)
    return native_layer_norm(input, ns, weight, bias, eps)[0]


@op()
def rms_norm(input: Tensor, normalized_shape: int | Sequence[int],
             weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``torch.nn.functional.rms_norm`` on gemsops kernels, differentiable.

    Args:
        input: The tensor to normalize.
        normalized_shape: The trailing dims normalized together.
        weight: Optional elementwise scale.
        eps: Added to the mean square; None means the machine epsilon of float32
            (float64 for a float64 input), as in torch.

    Returns:
        ``input * rsqrt(mean(input^2) + eps) * weight`` in the input's dtype.

    Raises:
        Unsupported: an input these kernels do not take.
    """
    ns = _shape(normalized_shape)
    if _needs_grad(input, weight):
        return _RMSNorm.apply(input, ns, weight, eps)
    return fused_rms_norm(input, ns, weight, eps)[0]

