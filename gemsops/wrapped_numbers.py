"""Python numbers where torch's schema takes a tensor, made 0-dim tensors for torch's kernel.

The dispatcher hands a Python kernel the wrapped-number tensors of a call (``x + 1``) as
Python numbers, and torch's own kernel takes them back only as tensors. When gemsops
hands a call back to torch (:mod:`gemsops.registry`'s fallback), :func:`numbers_as_tensors`
makes each such number a 0-dim tensor of a dtype that promotes as the number did.
"""

from __future__ import annotations

from typing import Any

import torch

from gemsops.promotion import FLOAT_TO_COMPLEX, combine, promote

__all__ = ["TensorParams", "numbers_as_tensors", "tensor_params"]

TensorParams = tuple[tuple[int, ...], tuple[str, ...], frozenset[str]]
"""Where a schema takes tensors: positional indices, keyword-only names, ``out=`` names."""

_NUMBERS = (bool, int, float, complex)


def tensor_params(schema: Any) -> TensorParams:
    """Where a schema takes tensors: positional indices, keyword-only names, out names.

    ``Tensor``, ``Tensor?``, ``Tensor[]`` and ``Tensor?[]`` arguments count.
    """
    positions: list[int] = []
    keywords: list[str] = []
    outs: set[str] = set()
    for i, arg in enumerate(schema.arguments):
        kind = arg.type
        if isinstance(kind, torch.ListType):
            kind = kind.getElementType()
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        if not isinstance(kind, torch.TensorType):
            continue
        if arg.kwarg_only:
            keywords.append(arg.name)
        else:
            positions.append(i)
        if arg.is_out:
            outs.add(arg.name)
    return tuple(positions), tuple(keywords), frozenset(outs)


def _number_dtype(numbers: list[Any]) -> torch.dtype:
    """The dtype torch gives numbers in promotion (the default float dtype for floats)."""
    default = torch.get_default_dtype()
    out = torch.bool
    for n in numbers:
        if isinstance(n, bool):
            kind = torch.bool
        elif isinstance(n, int):
            kind = torch.int64
        elif isinstance(n, float):
            kind = default
        else:
            kind = FLOAT_TO_COMPLEX.get(default, torch.complex64)
        out = torch.promote_types(out, kind)
    return out


def _wrapped_dtype(tensors: list[Any], numbers: list[Any]) -> torch.dtype:
    """A dtype for 0-dim tensors standing for ``numbers`` that promotes as they do.

    The dispatcher hands a Python kernel wrapped-number tensors (``x + 1``) as Python
    numbers, and torch's kernel takes them back only as tensors. Torch promotes tensors
    in three levels (dimensioned, 0-dim, wrapped numbers): the chosen dtype, at the
    0-dim level, gives the same result dtype, and is the widest of its kind that does
    (so the value reaches the kernel as exact as a wrapped number would).
    """
    dim: torch.dtype | None = None
    zero: torch.dtype | None = None
    for t in tensors:
        if t.dim():
            dim = promote(dim, t.dtype)
        else:
            zero = promote(zero, t.dtype)
    wrapped = _number_dtype(numbers)
    result = combine(dim, combine(zero, wrapped))
    for candidate in (_widest(wrapped), wrapped):
        if combine(dim, promote(zero, candidate)) == result:
            return candidate
    return result if result is not None else wrapped


def _widest(dtype: torch.dtype) -> torch.dtype:
    """The widest dtype of ``dtype``'s kind (bool, integer, floating, complex)."""
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64
    return torch.bool if dtype == torch.bool else torch.int64


def _as_tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a 0-dim CPU tensor of ``dtype``, cast as torch's kernels cast it."""
    return torch.tensor(value, dtype=_widest(_number_dtype([value]))).to(dtype)


def numbers_as_tensors(
    params: TensorParams,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``args``/``kwargs`` with Python numbers at tensor arguments made tensors, or None.

    None when there is no number where the schema takes a tensor (the common case).
    """
    positions, keywords, outs = params
    tensors: list[Any] = []
    numbers: list[Any] = []

    def scan(value: Any, promoted: bool) -> None:
        if isinstance(value, torch.Tensor):
            if promoted:
                tensors.append(value)
        elif isinstance(value, _NUMBERS):
            numbers.append(value)
        elif isinstance(value, list | tuple):
            for item in value:
                scan(item, promoted)

    for i in positions:
        if i < len(args):
            scan(args[i], True)
    for name in keywords:
        if name in kwargs:
            scan(kwargs[name], name not in outs)
    if not numbers:
        return None
    dtype = _wrapped_dtype(tensors, numbers)

    def convert(value: Any) -> Any:
        if isinstance(value, _NUMBERS):
            return _as_tensor(value, dtype)
        if isinstance(value, list | tuple):
            return type(value)(convert(item) for item in value)
        return value

    new_args = list(args)
    for i in positions:
        if i < len(args):
            new_args[i] = convert(args[i])
    new_kwargs = dict(kwargs)
    for name in keywords:
        if name in kwargs:
            new_kwargs[name] = convert(kwargs[name])
    return tuple(new_args), new_kwargs
