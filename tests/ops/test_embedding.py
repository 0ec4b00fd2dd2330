"""Property tests of the embedding lookup and its dense backward against torch.

Tables are drawn in float and integer dtypes and any layout, indices (int32/int64) of
rank 0-3 with repeats; the backward covers padding_idx, scale_grad_by_freq and rows
never looked up, compared with torch's kernel in float64 (the sums widen tolerance).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import gemshal
from gemsops import registry
from gemsops.errors import Unsupported
from gemsops.ops.memory import embedding as E
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, INT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
GRAD_DTYPES = (*FLOAT_DTYPES, torch.float64)


@st.composite
def indices(draw: st.DrawFn, num: int) -> torch.Tensor:
    """int32/int64 indices in [0, num) of rank 0-3 (maybe non-contiguous), with repeats."""
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 7, 16]), max_size=3)))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    hi = draw(st.integers(1, num))  # a small range makes repeats likely
    idx = torch.randint(0, hi, (*shape, 2), generator=gen).to(dtype)[..., 0]
    if idx.dim() >= 2 and draw(st.booleans()):
        idx = idx.transpose(0, 1)
    return idx.to(DEV)


@given(data=st.data(), num=st.integers(1, 40), dim=st.sampled_from([0, 1, 5, 64, 70, 130]),
       dtype=st.sampled_from([*GRAD_DTYPES, *INT_DTYPES]))
def test_embedding_matches_torch(data: st.DataObject, num: int, dim: int,
                                 dtype: torch.dtype) -> None:
    """The lookup returns exactly torch's rows for any table layout and index shape."""
    weight = data.draw(tensors(shape=(num, dim), dtypes=[dtype])).to(DEV)
    idx = data.draw(indices(num))
    out = E.embedding(weight, idx)
    expected = F.embedding(idx, weight)
    assert out.shape == expected.shape and out.dtype == weight.dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(registry.implementations()["embedding.default"](weight, idx), expected)


@given(data=st.data(), num=st.integers(1, 40), dim=st.sampled_from([1, 3, 64, 70, 130]),
       dtype=st.sampled_from(GRAD_DTYPES), scale=st.booleans(),
       pad=st.sampled_from(["none", "used", "unused"]))
def test_embedding_dense_backward_matches_torch(data: st.DataObject, num: int, dim: int,
                                                dtype: torch.dtype, scale: bool,
                                                pad: str) -> None:
    """Gradient rows sum per index; padding_idx rows stay 0; scale_grad_by_freq divides by
    the index counts; never-seen rows are 0."""
    idx = data.draw(indices(num))
    grad = data.draw(tensors(shape=(*idx.shape, dim), dtypes=[dtype])).to(DEV)
    padding_idx = {"none": -1, "used": int(idx.reshape(-1)[0]) if idx.numel() else 0,
                   "unused": num - 1}[pad]
    got = E.embedding_dense_backward(grad, idx, num, padding_idx, scale)
    expected = reference(torch.ops.aten.embedding_dense_backward, grad, idx, num,
                         padding_idx, scale)
    assert got.shape == (num, dim) and got.dtype == dtype
    assert_close(got, expected, reduce_size=max(1, idx.numel()))


def test_embedding_gradient_through_autograd() -> None:
    """The differentiable embedding's table gradient is torch's, padding row left at 0."""
    weight = torch.randn(10, 33, device=DEV, requires_grad=True)
    idx = torch.tensor([[1, 2, 2, 9], [4, 2, 1, 0]], device=DEV)
    out = E.embedding(weight, idx, padding_idx=2)
    g = torch.randn(out.shape, device=DEV)
    out.backward(g)
    ref = weight.detach().cpu().double().requires_grad_()
    F.embedding(idx.cpu(), ref, padding_idx=2).backward(g.cpu().double())
    assert_close(weight.grad, ref.grad, reduce_size=8)  # type: ignore[arg-type]
    assert bool((weight.grad[2] == 0).all())  # type: ignore[index]


@pytest.mark.skipif(DEV.type != "cpu", reason="indices are range-checked on the CPU only")
def test_out_of_range_index_raises_like_torch() -> None:
    """An index outside [0, num_embeddings) raises IndexError, as torch does on the CPU."""
    with pytest.raises(IndexError):
        E.embedding(torch.randn(4, 3), torch.tensor([0, 4]))
    with pytest.raises(IndexError):
        E.embedding_dense_backward(torch.randn(2, 3), torch.tensor([-1, 0]), 4, -1, False)


def test_deterministic_mode_leaves_backward_to_torch() -> None:
    """Atomic accumulation is order-dependent: deterministic mode raises Unsupported."""
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(Unsupported):
            E.embedding_dense_backward(torch.randn(2, 3, device=DEV),
                                       torch.tensor([0, 1], device=DEV), 4, -1, False)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    ("weight", "idx"),
    [
        (torch.ones(3, 2, dtype=torch.complex64), torch.tensor([0])),
        (torch.ones(3, 2), torch.tensor([0.0])),
        (torch.ones(3, 2), torch.tensor([0], dtype=torch.int16)),
        (torch.ones(6), torch.tensor([0])),
    ],
)
def test_unsupported_inputs(weight: torch.Tensor, idx: torch.Tensor) -> None:
    """Complex or 1-D tables and non-integer indices go back to torch."""
    with pytest.raises(Unsupported):
        E.embedding(weight.to(DEV), idx.to(DEV))


def test_sparse_gradient_is_unsupported() -> None:
    """A sparse gradient is torch's to build: asking for one through autograd is refused."""
    weight = torch.randn(4, 3, device=DEV, requires_grad=True)
    with pytest.raises(Unsupported):
        E.embedding(weight, torch.tensor([1], device=DEV), sparse=True)


@given(d=st.integers(1, 20000), widths=st.lists(st.sampled_from([64, 128, 512, 1024, 2048,
                                                                 4096, 8192]),
                                                min_size=1, max_size=6, unique=True))
def test_lookup_configs_wider_than_the_row_are_pruned(d: int, widths: list[int]) -> None:
    """The lookup's pruning keeps exactly the configs whose column step is at most the row
    width rounded up to a power of two, or the narrowest ones when every config is
    wider: a row is never walked with a step that only masks lanes off, and some config
    always remains."""
    from types import SimpleNamespace

    configs = [SimpleNamespace(kwargs={"BLOCK_M": 1, "BLOCK_D": w}) for w in widths]
    kept = E._prune_rows(configs, {"D": d})
    need = 1 << (d - 1).bit_length()
    expected = [c for c in configs if c.kwargs["BLOCK_D"] <= need]
    assert kept == (expected or [c for c in configs if c.kwargs["BLOCK_D"] == min(widths)])


@pytest.mark.parametrize("dim", [63, 64, 65, 200])
def test_lookup_walks_long_rows_in_steps(dim: int) -> None:
    """Rows wider than one step (the interpreter's 64 columns) are copied whole, with
    their index read once per row: out-of-order, repeated and boundary indices of a
    transposed table give torch's rows exactly."""
    weight = torch.randn(dim, 9, device=DEV).t()  # 9 rows of `dim`, column-major
    idx = torch.tensor([[8, 0, 8], [3, 3, 0]], device=DEV)
    torch.testing.assert_close(E.embedding(weight, idx), F.embedding(idx, weight),
                               rtol=0, atol=0)
