"""The fallback to torch is total: any overload, any argument, any dtype torch takes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops import registry, wrapped_numbers
from gemsops.testing.strategies import target_device

DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    gemsops.disable()
    yield
    gemsops.disable()
    assert gemsops.registered_ops() == ()


def _z() -> torch.Tensor:
    return torch.tensor([1 + 2j, 3 - 1j, -0.5 + 0j], dtype=torch.complex64, device=target_device())


@pytest.mark.parametrize(
    "call",
    [
        lambda z: z + 1,
        lambda z: z * 3,
        lambda z: z / 3,
        lambda z: z - 2.5,
        lambda z: 2 * z,
        lambda z: z.clone().add_(1),
        lambda z: z.mean(),
        lambda z: torch.pow(z, 2),
        lambda z: torch.where(z.real > 0, z, 1),
    ],
    ids=["add", "mul", "div", "sub", "rmul", "add_", "mean", "pow", "where"],
)
def test_complex_with_a_python_number_falls_back_to_torch(
    call: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """A complex tensor with a Python number under use_gems gives torch's own answer."""
    z = _z()
    expected = call(z)
    with gemsops.use_gems(), gemsops.record() as rec:
        got = call(z)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert rec.fallbacks, "the complex call should have been handed to torch"


def test_an_implementation_error_is_a_counted_fallback() -> None:
    """An exception an implementation raises on an input it cannot take becomes a fallback."""

    def broken(self: torch.Tensor, other: torch.Tensor, *, alpha: Any = 1) -> torch.Tensor:
        raise TypeError("a check that cannot take this input")

    original = torch.library.get_kernel("aten::add.Tensor", "CPU")
    kernel = registry._wrap("add.Tensor", broken, original)
    x = torch.arange(3.0)
    with gemsops.record() as rec:
        got = kernel(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), x, 2, alpha=1)
    torch.testing.assert_close(got, x + 2)
    [(op, reason)] = rec.fallbacks
    assert op == "add.Tensor" and "TypeError" in reason and "cannot take" in reason


def test_a_deliberate_gemsops_error_still_reaches_the_caller() -> None:
    """A GemsopsError (say, a bad setting) from an implementation is raised, not hidden."""

    def refusing(self: torch.Tensor, other: torch.Tensor, *, alpha: Any = 1) -> torch.Tensor:
        raise gemsops.GemsopsError("bad tuning file")

    original = torch.library.get_kernel("aten::add.Tensor", "CPU")
    kernel = registry._wrap("add.Tensor", refusing, original)
    with pytest.raises(gemsops.GemsopsError, match="bad tuning file"):
        kernel(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), torch.ones(2), 1, alpha=1)


@pytest.mark.parametrize(
    ("a", "number", "expected"),
    [
        (torch.tensor(3, dtype=torch.int8), 1, torch.int8),  # 0-dim tensor beats the number
        (torch.tensor(1.5, dtype=torch.float16), 0.1, torch.float16),
        (torch.tensor([1, 2], dtype=torch.int32), 0.5, torch.float32),  # the default dtype
        (torch.tensor([1.0], dtype=torch.float64), 0.1, torch.float64),
        (torch.tensor([True]), 2, torch.int64),
        (torch.tensor(2, dtype=torch.uint8), 1j, torch.complex64),
        (torch.tensor([1.0], dtype=torch.float16), 2j, torch.complex32),
    ],
)
def test_numbers_handed_back_promote_as_python_numbers(
    a: torch.Tensor, number: complex, expected: torch.dtype
) -> None:
    """A number turned back into a tensor for torch's kernel promotes as the number did."""
    params = wrapped_numbers.tensor_params(torch.ops.aten.add.Tensor._schema)
    converted = wrapped_numbers.numbers_as_tensors(params, (a, number), {"alpha": 1})
    assert converted is not None
    (_, tensor), _ = converted
    assert tensor.dim() == 0 and tensor.device.type == "cpu"
    assert torch.result_type(a, tensor) == torch.result_type(a, number) == expected
    assert wrapped_numbers.numbers_as_tensors(params, (a, a), {}) is None


# --- property: every dtype, every layout, torch's answer or torch's error -------------

_SHAPES = {
    "plain": ((2, 3), (2, 3)),
    "empty": ((0, 3), (0, 3)),
    "0-dim": ((), ()),
    "0-dim with 1-dim": ((), (3,)),
    "broadcast": ((3, 1), (1, 4)),
    "strided": ((2, 3), (2, 3)),
}


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, strided: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    full = (*shape[:-1], shape[-1] * 2) if strided and shape else shape
    values = torch.randint(-6, 7, full, generator=g).to(torch.float64) / 2  # exact halves
    if dtype.is_complex:
        imag = torch.randint(-4, 5, full, generator=g).to(torch.float64) / 2
        values = torch.complex(values, imag)
    x = values.to(dtype).to(target_device())
    return x[..., ::2] if strided and shape else x


_NUMBERS = st.one_of(
    st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, -2.5, 0.0, 3.0]),
    st.sampled_from([1j, 2 - 1j]),
)  # fmt: skip

# op name -> call on (a, b, number). Ops torch refuses for some dtypes are kept: then
# gemsops must raise torch's own error.
_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor, Any], Any]] = {
    "add": lambda a, b, n: a + b,
    "add scalar": lambda a, b, n: a + n,
    "add alpha": lambda a, b, n: torch.add(a, b, alpha=2),
    "add_ scalar": lambda a, b, n: a.clone().add_(n),
    "sub": lambda a, b, n: a - b,
    "rsub scalar": lambda a, b, n: n - a,
    "mul scalar": lambda a, b, n: a * n,
    "mul out": lambda a, b, n: torch.mul(a, b, out=torch.empty_like(a)),
    "div": lambda a, b, n: a / b,
    "div scalar": lambda a, b, n: a / n,
    "div floor": lambda a, b, n: torch.div(a, b, rounding_mode="floor"),
    "neg": lambda a, b, n: -a,
    "abs": lambda a, b, n: a.abs(),
    "mean": lambda a, b, n: a.mean(),
    "sum": lambda a, b, n: a.sum(dim=-1) if a.dim() else a.sum(),
    "pow scalar": lambda a, b, n: torch.pow(a, n),
    "pow": lambda a, b, n: torch.pow(a, b),
    "eq": lambda a, b, n: a == b,
    "eq scalar": lambda a, b, n: a == n,
    "lt scalar": lambda a, b, n: a < n,
    "where": lambda a, b, n: torch.where(b != 0, a, b),
    "where scalar": lambda a, b, n: torch.where(b != 0, a, n),
    "clamp": lambda a, b, n: torch.clamp(a, min=n),
    "maximum": lambda a, b, n: torch.maximum(a, b),
    "softmax": lambda a, b, n: torch.softmax(a, dim=-1),
    "masked_fill": lambda a, b, n: a.masked_fill(b != 0, n),
}


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:  # the outcome compared is the exception's type
        return error


@settings(max_examples=120)
@given(
    op=st.sampled_from(sorted(_OPS)),
    dtype_a=st.sampled_from(DTYPES),
    dtype_b=st.sampled_from(DTYPES),
    layout=st.sampled_from(sorted(_SHAPES)),
    number=_NUMBERS,
    seed=st.integers(0, 2**16),
)
def test_fallback_property_torch_answer_or_torch_error(
    op: str, dtype_a: torch.dtype, dtype_b: torch.dtype, layout: str, number: Any, seed: int
) -> None:
    """Property: under use_gems, a served op on any dtype, shape and layout gives torch's
    result (dtype, shape, values) or raises torch's exception type."""
    shape_a, shape_b = _SHAPES[layout]
    strided = layout == "strided"
    a = _tensor(shape_a, dtype_a, seed, strided)
    b = _tensor(shape_b, dtype_b, seed + 1, strided)
    call = _OPS[op]
    expected = _outcome(lambda: call(a, b, number))
    with gemsops.use_gems():
        got = _outcome(lambda: call(a, b, number))
    if isinstance(expected, Exception):
        assert type(got) is type(expected), f"torch raised {expected!r}, gemsops gave {got!r}"
        return
    assert not isinstance(got, Exception), f"torch answered, gemsops raised {got!r}"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_pow_of_a_complex_tensor_says_why_it_went_to_torch() -> None:
    """pow on a complex tensor is handed back with a reason naming the complex dtype."""
    z = torch.tensor([1 + 2j, -0.5 + 1j], device=target_device())
    with gemsops.use_gems(), gemsops.record() as rec:
        got = torch.pow(z, 2)
    torch.testing.assert_close(got.cpu(), torch.pow(z.cpu(), 2))
    reasons = rec.fallback_ops()["pow.Tensor_Scalar"]
    assert reasons == ["pow in torch.complex64"]
