"""The ``_foreach_*`` ops the optimizers call: one launch per dtype group of the lists.

Each overload family is one function serving the functional overload
(``_foreach_add.List``: new outputs) and, through ``inplace=``, the in-place one
(``_foreach_add_.List``: writes ``self``, returns nothing). ``sub`` is ``add`` with the
scalar or alpha negated (exact: negation rounds nothing).

Numerics follow torch's foreach kernels: half and bfloat16 compute in float32, float64
in float64, a Python scalar is rounded once to the compute dtype; ``lerp`` uses ATen's
two-sided formula; ``addcdiv`` is ``self + value * (t1 / t2)`` as torch's CUDA kernel
(its CPU kernel computes ``value * t1 / t2``: one rounding apart). Outputs of the
functional forms take torch's dtypes: the promoted dtype of a position's lists, the
tensor's own dtype for scalar forms.

Handed back to torch (``Unsupported``, before anything is written): empty lists, lists of
unequal lengths, integer, bool or complex tensors or scalars, tensors off the vendor's
device or not contiguous, shapes that differ at a position, lerp over mixed dtypes, a
``Tensor`` scalar that is not 0-dim (or, for addcmul/addcdiv, not a 1-D CPU tensor of
one value per position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import torch
import triton.language as tl
from torch import Tensor

from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import Number
from gemsops.ops.optim import kernels as K
from gemsops.ops.optim.tables import layout, plan, scalars, witness

__all__: list[str] = []  # served through aten only

Result = Callable[[tuple[torch.dtype, ...]], torch.dtype]
_CONSTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _same(sig: tuple[torch.dtype, ...]) -> torch.dtype:
    return sig[0]


def _promoted(sig: tuple[torch.dtype, ...]) -> torch.dtype:
    return reduce(torch.promote_types, sig)


def _consts(op_code: int, reads: int, out: int, mode: int, acc: torch.dtype,
            aligned: bool) -> dict[str, Any]:
    shape = layout("foreach")
    key = (op_code, reads, out, mode, acc, aligned, shape)
    hit = _CONSTS.get(key)
    if hit is None:
        hit = _CONSTS[key] = {
            "OP": op_code, "NIN": reads, "OUT": out, "SCALAR": mode,
            "ACC": tl.float64 if acc == torch.float64 else tl.float32,
            "ALIGNED": aligned, "BLOCK": shape[0], "TILE": shape[1]}
    return hit


def _number(name: str, value: Any) -> float:
    if isinstance(value, complex) or not isinstance(value, int | float):
        raise Unsupported(f"{name}: scalar {value!r} (real numbers only)")
    return float(value)


def _launch(name: str, op_code: int, lists: Sequence[Sequence[Tensor]], *,
            result: Result | None = None, reads: int | None = None, out_slot: int = 0,
            mode: int = K.NO_SCALAR, uniform: Sequence[float] = (),
            per: Sequence[float] | None = None, x: Tensor | None = None) -> list[Tensor] | None:
    """One launch per dtype group of ``lists``: ``op_code`` over ``reads`` lists, into the
    list at ``out_slot`` (in place) or, with ``result``, into new outputs (returned)."""
    if not lists[0]:
        raise Unsupported(f"{name}: an empty tensor list")  # torch raises its own error
    if per is not None and len(per) != len(lists[0]):
        raise Unsupported(f"{name}: {len(per)} scalars for {len(lists[0])} tensors")
    groups, outs = plan(name, lists, result, kind="foreach")
    nin = len(lists) if reads is None else reads
    slot = len(lists) if outs is not None else out_slot
    device = lists[0][0].device
    for group in groups:
        acc = group.acc
        values = list(uniform) if per is None else [0.0, *group.pick(per)]
        s = scalars(values, acc, device)
        w = [witness(d, device) for d in group.dtypes]
        args = (group.table, s, s if x is None else x, w[0], w[min(1, len(w) - 1)],
                w[min(2, len(w) - 1)], w[slot], group.tensors, group.steps)
        consts = _consts(op_code, nin, slot, mode, acc, group.aligned)
        K.foreach_kernel.launch((group.blocks,), args, consts)
    return outs


def _scalar_tensor(name: str, other: Tensor, device: torch.device,
                   alpha: float) -> tuple[int, list[float], Tensor | None]:
    """(mode, uniform scalars, X) for a 0-dim ``other`` times ``alpha``."""
    if other.dim() != 0:
        raise Unsupported(f"{name}: other has {other.dim()} dims (a 0-dim tensor is taken)")
    if other.dtype.is_complex or other.dtype == torch.bool:
        raise Unsupported(f"{name}: other of dtype {other.dtype}")
    if other.device == device:
        return K.TENSOR, [alpha], other
    if other.is_cpu:
        return K.UNIFORM, [alpha * float(other.item())], None
    raise Unsupported(f"{name}: other on {other.device}, the tensors on {device}")


def _first_device(name: str, lists: Sequence[Sequence[Tensor]]) -> torch.device:
    if not lists[0]:
        raise Unsupported(f"{name}: an empty tensor list")
    return lists[0][0].device


def _finish(inplace: bool, outs: list[Tensor] | None) -> list[Tensor] | None:
    return None if inplace else outs


# --- add / sub / mul / div / maximum / minimum -------------------------------------

_BINARY = {"add": (K.ADD, K.ADD_S), "sub": (K.ADD, K.ADD_S), "mul": (K.MUL, K.MUL_S),
           "div": (K.DIV, K.DIV_S), "maximum": (K.MAX, K.MAX_S), "minimum": (K.MIN, K.MIN_S)}


def _declare_binary(base: str) -> None:
    list_op, scalar_op = _BINARY[base]
    sign = -1.0 if base == "sub" else 1.0
    has_alpha = base in ("add", "sub")

    def with_list(self: list[Tensor], other: list[Tensor], *, alpha: Number = 1,
                  out: Any = None, inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}.List"
        result = None if inplace else _promoted
        if has_alpha:
            outs = _launch(name, list_op, (self, other), result=result, mode=K.UNIFORM,
                           uniform=[sign * _number(name, alpha)])
        else:
            outs = _launch(name, list_op, (self, other), result=result)
        return _finish(inplace, outs)

    def with_scalar(self: list[Tensor], scalar: Number, *, out: Any = None,
                    inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}.Scalar"
        outs = _launch(name, scalar_op, (self,), result=None if inplace else _same,
                       mode=K.UNIFORM, uniform=[sign * _number(name, scalar)])
        return _finish(inplace, outs)

    def with_scalars(self: list[Tensor], scalars: Sequence[Number], *, out: Any = None,
                     inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}.ScalarList"
        per = [sign * _number(name, v) for v in scalars]
        outs = _launch(name, scalar_op, (self,), result=None if inplace else _same,
                       mode=K.PER_TENSOR, per=per)
        return _finish(inplace, outs)

    def with_tensor(self: list[Tensor], other: Tensor, *, alpha: Number = 1, out: Any = None,
                    inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}.Tensor"
        device = _first_device(name, (self,))
        mode, uniform, x = _scalar_tensor(name, other, device, sign * _number(name, alpha))
        outs = _launch(name, scalar_op, (self,), result=None if inplace else _same,
                       mode=mode, uniform=uniform, x=x)
        return _finish(inplace, outs)

    forms: list[tuple[str, Callable[..., Any]]] = [
        ("List", with_list), ("Scalar", with_scalar), ("ScalarList", with_scalars)]
    if base in ("add", "mul", "div"):  # torch has no sub/maximum/minimum .Tensor
        forms.append(("Tensor", with_tensor))
    for form, fn in forms:
        fn.__name__ = f"foreach_{base}_{form.lower()}"
        fn.__qualname__ = fn.__name__
        fn.__doc__ = (f"``torch._foreach_{base}`` / ``_foreach_{base}_`` ({form}): one "
                      "multi-tensor launch per dtype group.")
        op(f"_foreach_{base}.{form}", inplace=f"_foreach_{base}_.{form}", public=False)(fn)


for _base in _BINARY:
    _declare_binary(_base)


# --- lerp / addcmul / addcdiv -------------------------------------------------------


def _same_dtypes(name: str, lists: Sequence[Sequence[Tensor]]) -> None:
    first = [t.dtype for t in lists[0]]
    for lst in lists[1:]:
        if [t.dtype for t in lst] != first:
            raise Unsupported(f"{name}: the lists' dtypes differ (lerp takes one dtype)")


@op("_foreach_lerp.List", inplace="_foreach_lerp_.List", public=False)
def foreach_lerp_list(self: list[Tensor], tensors1: list[Tensor], weights: list[Tensor], *,
                      out: Any = None, inplace: bool = False) -> list[Tensor] | None:
    """``self + weights * (tensors1 - self)`` per position (ATen's two-sided lerp)."""
    name = "_foreach_lerp_.List" if inplace else "_foreach_lerp.List"
    _same_dtypes(name, (self, tensors1, weights))
    return _finish(inplace, _launch(name, K.LERP, (self, tensors1, weights),
                                    result=None if inplace else _same))


@op("_foreach_lerp.Scalar", inplace="_foreach_lerp_.Scalar", public=False)
def foreach_lerp_scalar(self: list[Tensor], tensors1: list[Tensor], weight: Number, *,
                        out: Any = None, inplace: bool = False) -> list[Tensor] | None:
    """``self + weight * (tensors1 - self)`` with one weight (Adam's first moment)."""
    name = "_foreach_lerp_.Scalar" if inplace else "_foreach_lerp.Scalar"
    _same_dtypes(name, (self, tensors1))
    return _finish(inplace, _launch(name, K.LERP_S, (self, tensors1),
                                    result=None if inplace else _same, mode=K.UNIFORM,
                                    uniform=[_number(name, weight)]))


@op("_foreach_lerp.ScalarList", inplace="_foreach_lerp_.ScalarList", public=False)
def foreach_lerp_scalarlist(self: list[Tensor], tensors1: list[Tensor],
                            weight: Sequence[Number], *, out: Any = None,
                            inplace: bool = False) -> list[Tensor] | None:
    """``self + weight[i] * (tensors1 - self)``, one weight per position."""
    name = "_foreach_lerp_.ScalarList" if inplace else "_foreach_lerp.ScalarList"
    _same_dtypes(name, (self, tensors1))
    return _finish(inplace, _launch(name, K.LERP_S, (self, tensors1),
                                    result=None if inplace else _same, mode=K.PER_TENSOR,
                                    per=[_number(name, w) for w in weight]))


def _scalar_list_tensor(name: str, scalars: Tensor, n: int) -> list[float]:
    # torch takes a 1-D CPU tensor of one value per position (and raises otherwise).
    if scalars.dim() != 1 or scalars.numel() != n or not scalars.is_cpu:
        raise Unsupported(f"{name}: scalars of shape {tuple(scalars.shape)} on "
                          f"{scalars.device} (a 1-D CPU tensor of {n} values is taken)")
    if scalars.dtype.is_complex:
        raise Unsupported(f"{name}: scalars of dtype {scalars.dtype}")
    return [float(v) for v in scalars.tolist()]


def _declare_pointwise(base: str, op_code: int) -> None:
    def with_scalar(self: list[Tensor], tensor1: list[Tensor], tensor2: list[Tensor],
                    value: Number = 1, *, out: Any = None,
                    inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}.Scalar"
        return _finish(inplace, _launch(name, op_code, (self, tensor1, tensor2),
                                        result=None if inplace else _promoted,
                                        mode=K.UNIFORM, uniform=[_number(name, value)]))

    def with_scalars(self: list[Tensor], tensor1: list[Tensor], tensor2: list[Tensor],
                     scalars: Sequence[Number] | Tensor, *, out: Any = None,
                     inplace: bool = False) -> list[Tensor] | None:
        form = "Tensor" if isinstance(scalars, Tensor) else "ScalarList"
        name = f"_foreach_{base}{'_' if inplace else ''}.{form}"
        if isinstance(scalars, Tensor):
            per = _scalar_list_tensor(name, scalars, len(self))
        else:
            per = [_number(name, v) for v in scalars]
        return _finish(inplace, _launch(name, op_code, (self, tensor1, tensor2),
                                        result=None if inplace else _promoted,
                                        mode=K.PER_TENSOR, per=per))

    what = "tensor1 * tensor2" if base == "addcmul" else "(tensor1 / tensor2)"
    forms: list[tuple[str, Callable[..., Any], tuple[str, ...]]] = [
        ("scalar", with_scalar, ("Scalar",)),
        ("scalarlist", with_scalars, ("ScalarList", "Tensor"))]
    for form, fn, overloads in forms:
        fn.__name__ = f"foreach_{base}_{form}"
        fn.__qualname__ = fn.__name__
        fn.__doc__ = f"``self + value * {what}`` per position, one launch per dtype group."
        op(*(f"_foreach_{base}.{o}" for o in overloads),
           inplace=[f"_foreach_{base}_.{o}" for o in overloads], public=False)(fn)


_declare_pointwise("addcmul", K.ADDCMUL)
_declare_pointwise("addcdiv", K.ADDCDIV)


# --- unary, copy_, zero_ --------------------------------------------------------------


def _declare_unary(base: str, op_code: int, doc: str) -> None:
    def unary(self: list[Tensor], *, out: Any = None,
              inplace: bool = False) -> list[Tensor] | None:
        name = f"_foreach_{base}{'_' if inplace else ''}"
        return _finish(inplace, _launch(name, op_code, (self,),
                                        result=None if inplace else _same))

    unary.__name__ = unary.__qualname__ = f"foreach_{base}"
    unary.__doc__ = doc
    op(f"_foreach_{base}.default", inplace=f"_foreach_{base}_.default", public=False)(unary)


_declare_unary("sqrt", K.SQRT, "Square root of every element, correctly rounded.")
_declare_unary("neg", K.NEG, "The negation of every element.")
_declare_unary("reciprocal", K.RECIP, "``1 / x`` for every element.")


@op("_foreach_copy_.default", public=False)
def foreach_copy_(self: list[Tensor], src: list[Tensor], non_blocking: bool = False) -> None:
    """Copy ``src[i]`` into ``self[i]`` (cast to its dtype), one launch per dtype group.

    ``non_blocking`` changes nothing on one device (the launch is asynchronous anyway).
    """
    _launch("_foreach_copy_", K.COPY, (src, self), reads=1, out_slot=1)


@op("_foreach_zero_.default", public=False)
def foreach_zero_(self: list[Tensor]) -> None:
    """Set every element of every tensor to zero, one launch per dtype group."""
    _launch("_foreach_zero_", K.ZERO, (self,), reads=0)
