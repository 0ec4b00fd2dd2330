"""isin: whether each element occurs among a set of test elements.

What HF generate's stopping criteria ask every step (is the new token an EOS id?), so
the common case is a handful of test elements. The kernel takes a block of elements per
program and loops over the test elements in blocks, comparing every pair (``x == t``);
``nan`` equals nothing, so it is never in a set, and ``-0.0`` is in a set holding
``0.0``, as with torch's ``==``. ``assume_unique`` is accepted and ignored (the answer
is the same); ``invert`` negates the result.

Dtypes as torch: the elements and the test elements are compared in their common dtype
(``torch.result_type``), so ``isin(int32, bfloat16)`` rounds the integers to bfloat16
first; an operand of another dtype is converted on the host before the launch, with
torch's rounding. Half types are compared in float32 (exact). ``Tensor_Scalar`` and
``Scalar_Tensor`` put the number in a one-element device tensor of the common dtype
(a fill, no host-to-device copy) and run the same kernel.

A test set larger than ``MAX_TEST`` is handed back to torch (which sorts): the
loop costs ``elements * test_elements`` comparisons. bool operands are handed back too
(torch refuses them for the tensor overloads and compares with ``eq`` for a scalar).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, INT_DTYPES, Number, check_supported
from gemsops.ops.grid import cdiv

__all__ = ["MAX_TEST", "isin"]

MAX_TEST = 4096
"""The most test elements the loop kernel takes; a larger set is handed back to torch."""

_BLOCK = 256
_TBLOCK = 32
_DTYPES = (*FLOAT_DTYPES, *INT_DTYPES)
_HALF = (torch.float16, torch.bfloat16)
_CONSTS = {(invert, upcast): {"INVERT": invert, "UPCAST": upcast, "BLOCK": _BLOCK,
                              "TBLOCK": _TBLOCK}
           for invert in (False, True) for upcast in (False, True)}
"""The launches' constant keywords, one dict per set (the launch key remembers it by
identity)."""


@kernel("isin")
@triton.jit
def _isin_kernel(
    E,  # the elements, a contiguous run of n values
    T,  # the test elements, a contiguous run of m values of E's dtype
    Out,  # bool, n values
    n,
    m,
    INVERT: tl.constexpr,
    UPCAST: tl.constexpr,  # compare half types in float32 (exact)
    BLOCK: tl.constexpr,
    TBLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(E + offs, mask=inside, other=0)
    if UPCAST:
        x = x.to(tl.float32)
    found = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, m, TBLOCK):
        t_offs = start + tl.arange(0, TBLOCK)
        live = t_offs < m
        t = tl.load(T + t_offs, mask=live, other=0)
        if UPCAST:
            t = t.to(tl.float32)
        hit = (x[:, None] == t[None, :]) & live[None, :]
        found = tl.maximum(found, tl.max(hit.to(tl.int32), axis=1))
    if INVERT:
        found = 1 - found
    tl.store(Out + offs, found != 0, mask=inside)


def _check(t: Tensor, what: str) -> None:
    if t.layout != torch.strided:
        raise Unsupported(f"isin of a non-strided {what}")
    if t.dtype not in _DTYPES:
        raise Unsupported(f"isin of {t.dtype} {what}")
    check_supported(t.dtype)


def _launch(elements: Tensor, test: Tensor, invert: bool) -> Tensor:
    """The bool result of shape ``elements.shape``; both operands share one dtype."""
    check_supported(elements.dtype)
    out = torch.empty(elements.shape, dtype=torch.bool, device=elements.device)
    n, m = elements.numel(), test.numel()
    if n == 0:
        return out
    if m == 0:
        return out.fill_(invert)
    if m > MAX_TEST:
        raise Unsupported(f"isin with {m} test elements (the loop kernel takes up to "
                          f"{MAX_TEST}; torch sorts)")
    flat_e = elements.reshape(-1).contiguous()
    flat_t = test.reshape(-1).contiguous()
    _isin_kernel.launch((cdiv(n, _BLOCK),), (flat_e, flat_t, out, n, m),
                        _CONSTS[bool(invert), elements.dtype in _HALF])
    return out


def _number(value: Number, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``value`` as a one-element tensor of ``dtype`` on ``device`` (torch's conversion;
    a value the dtype cannot hold raises, and torch's kernel then answers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"isin with a {type(value).__name__} number")
    try:
        return torch.full((1,), value, dtype=dtype, device=device)
    except RuntimeError as exc:  # e.g. 1000 for int8: torch's eq answers
        raise Unsupported(f"isin with {value!r}, which {dtype} cannot hold") from exc


@op("isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor",
    out=("isin.Tensor_Tensor_out", "isin.Tensor_Scalar_out", "isin.Scalar_Tensor_out"),
    args={"test_element": "test_elements", "element": "elements"})
def isin(elements: Tensor | Number, test_elements: Tensor | Number, *,
         assume_unique: bool = False, invert: bool = False) -> Tensor:
    """Whether each element is among ``test_elements`` (or, with ``invert``, is not).

    Args:
        elements: A tensor of any shape, or a number (the result is then 0-dim).
        test_elements: A tensor of any shape (flattened), or a number.
        assume_unique: Ignored: the answer does not depend on it.
        invert: Return the complement.

    Returns:
        A bool tensor of ``elements``' shape, contiguous.

    Raises:
        Unsupported: bool, complex or non-strided operands, operands on different
            devices, two numbers, or more than ``MAX_TEST`` test elements.
    """
    del assume_unique
    if isinstance(elements, Tensor) and isinstance(test_elements, Tensor):
        _check(elements, "elements")
        _check(test_elements, "test elements")
        if elements.device != test_elements.device:
            raise Unsupported("isin of tensors on different devices")
        common = torch.result_type(elements, test_elements)
        return _launch(elements.to(common), test_elements.to(common), invert)
    if isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        _check(elements, "elements")
        common = torch.result_type(elements, test_elements)
        test = _number(test_elements, common, elements.device)
        return _launch(elements.to(common), test, invert)
    if isinstance(test_elements, Tensor) and not isinstance(elements, Tensor):
        _check(test_elements, "test elements")
        common = torch.result_type(elements, test_elements)
        value = _number(elements, common, test_elements.device).reshape(())
        return _launch(value, test_elements.to(common), invert)
    raise Unsupported("isin of two numbers")
