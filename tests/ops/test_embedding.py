"""Property tests of the embedding lookup and its dense backward against torch.

Tables are drawn in float and integer dtypes and any layout, indices (int32/int64) of
rank 0-3 with repeats; the backward covers padding_idx, scale_grad_by_freq and rows
never looked up, compared with torch's kernel in float64 (the sums widen tolerance).
The sort-based backward is also checked bit for bit against per-index sums in position
order (many duplicates, one index everywhere), and under deterministic algorithms.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import gemshal
import gemsops
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


def _ordered_sum(grad: torch.Tensor, idx: torch.Tensor, num: int,
                 padding_idx: int) -> torch.Tensor:
    """The backward as the sort-based kernel defines it, on the CPU: the indices sorted
    stably; per index, its gradient rows added one at a time in position order in
    float32 (float64 for float64) within each E.SEG-position segment of the sorted
    order, those partial sums then added in order; padding_idx's row left 0; the result
    cast to the gradient's dtype."""
    acc = torch.float64 if grad.dtype == torch.float64 else torch.float32
    flat = idx.reshape(-1).cpu().tolist()
    g = grad.detach().cpu().to(acc).reshape(len(flat), grad.shape[-1])
    order = sorted(range(len(flat)), key=lambda pos: flat[pos])  # stable, as torch's sort
    out = torch.zeros(num, grad.shape[-1], dtype=acc)
    runs: dict[int, dict[int, torch.Tensor]] = {}  # index -> segment -> partial sum
    for sp, pos in enumerate(order):
        v = flat[pos]
        if v == padding_idx:
            continue
        parts = runs.setdefault(v, {})
        seg = sp // E.SEG
        parts[seg] = parts[seg] + g[pos] if seg in parts else torch.zeros_like(g[pos]) + g[pos]
    for v, parts in runs.items():
        total = None
        for seg in sorted(parts):
            total = parts[seg] if total is None else total + parts[seg]
        assert total is not None
        out[v] = total
    return out


def _assert_cast_of(got: torch.Tensor, acc: torch.Tensor) -> None:
    """``got`` is exactly the accumulator result ``acc`` cast to got's dtype: rounded to
    nearest even, or for bfloat16 also toward zero (the CPU interpreter of Triton 3.x
    converts float32 to bfloat16 by dropping the low bits; a GPU rounds to nearest)."""
    got = got.cpu()
    nearest = acc.to(got.dtype)
    if got.dtype == torch.bfloat16:
        bits = acc.to(torch.float32).view(torch.int32) & ~0xFFFF
        toward_zero = bits.view(torch.float32).to(torch.bfloat16)
        same = (got == nearest) | (got == toward_zero) | (got.isnan() & nearest.isnan())
        assert bool(same.all()), (got, nearest, toward_zero)
        return
    torch.testing.assert_close(got, nearest, rtol=0, atol=0, equal_nan=True)


@st.composite
def repeated(draw: st.DrawFn, num: int) -> torch.Tensor:
    """int32/int64 indices of rank 1-2 in [0, num) with many repeats: drawn from a few
    values, or one index over every position (runs longer than one kernel step, and
    at times than several E.SEG-position segments: summed by several programs)."""
    n = draw(st.one_of(st.integers(1, 48), st.sampled_from([E.SEG + 1, 2 * E.SEG + 7, 200])))
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    if draw(st.booleans()):
        idx = torch.full((n,), draw(st.integers(0, num - 1)), dtype=dtype)
    else:
        pool = draw(st.lists(st.integers(0, num - 1), min_size=1, max_size=3))
        idx = torch.tensor(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n)),
                           dtype=dtype)
    if n % 2 == 0 and draw(st.booleans()):
        idx = idx.view(2, n // 2)
    return idx.to(DEV)


@given(data=st.data(), num=st.integers(1, 12), dim=st.sampled_from([1, 5, 64, 130]),
       dtype=st.sampled_from(GRAD_DTYPES))
def test_backward_sums_repeated_indices_in_position_order(data: st.DataObject, num: int,
                                                          dim: int,
                                                          dtype: torch.dtype) -> None:
    """With many duplicate indices (one index over all positions included, over several
    segments at times) each row is bit-for-bit its positions' gradient rows added in
    position order in float32 within each segment of the sorted order, the segments'
    sums added in order (the stable sort keeps that order, whatever the config), and
    matches torch's kernel."""
    idx = data.draw(repeated(num))
    grad = data.draw(tensors(shape=(*idx.shape, dim), dtypes=[dtype])).to(DEV)
    got = E.embedding_dense_backward(grad, idx, num, -1, False)
    _assert_cast_of(got, _ordered_sum(grad, idx, num, -1))
    expected = reference(torch.ops.aten.embedding_dense_backward, grad, idx, num, -1, False)
    assert_close(got, expected, reduce_size=idx.numel())


@given(data=st.data(), num=st.integers(1, 12), dim=st.sampled_from([1, 5, 130]),
       dtype=st.sampled_from(GRAD_DTYPES), scale=st.booleans())
def test_backward_padding_row_stays_zero(data: st.DataObject, num: int, dim: int,
                                         dtype: torch.dtype, scale: bool) -> None:
    """padding_idx's row is exactly 0 however often it is looked up (the whole gradient
    when it is the only index); every other row is torch's."""
    idx = data.draw(repeated(num))
    padding_idx = int(data.draw(st.sampled_from(idx.reshape(-1).tolist())))
    grad = data.draw(tensors(shape=(*idx.shape, dim), dtypes=[dtype])).to(DEV)
    got = E.embedding_dense_backward(grad, idx, num, padding_idx, scale)
    assert bool((got[padding_idx] == 0).all())
    if bool((idx == padding_idx).all()):
        assert bool((got == 0).all())
    expected = reference(torch.ops.aten.embedding_dense_backward, grad, idx, num,
                         padding_idx, scale)
    assert_close(got, expected, reduce_size=idx.numel())


@given(data=st.data(), num=st.integers(1, 12), dim=st.sampled_from([1, 5, 130]),
       dtype=st.sampled_from(GRAD_DTYPES), pad=st.booleans())
def test_backward_scale_grad_by_freq_divides_by_counts(data: st.DataObject, num: int,
                                                       dim: int, dtype: torch.dtype,
                                                       pad: bool) -> None:
    """scale_grad_by_freq divides each row's sum by its index's count (runs of any
    length, with or without a padding index), as torch does; unseen rows stay 0."""
    idx = data.draw(repeated(num))
    padding_idx = int(idx.reshape(-1)[-1]) if pad else -1
    grad = data.draw(tensors(shape=(*idx.shape, dim), dtypes=[dtype])).to(DEV)
    got = E.embedding_dense_backward(grad, idx, num, padding_idx, True)
    expected = reference(torch.ops.aten.embedding_dense_backward, grad, idx, num,
                         padding_idx, True)
    assert_close(got, expected, reduce_size=idx.numel())
    counts = torch.bincount(idx.reshape(-1).cpu().long(), minlength=num)
    assert bool((got[(counts == 0).to(got.device)] == 0).all())


@given(data=st.data(), num=st.integers(1, 40), dim=st.sampled_from([3, 70]),
       dtype=st.sampled_from(GRAD_DTYPES), scale=st.booleans())
def test_deterministic_mode_serves_backward_bitwise_reproducibly(data: st.DataObject,
                                                                 num: int, dim: int,
                                                                 dtype: torch.dtype,
                                                                 scale: bool) -> None:
    """Under torch.use_deterministic_algorithms(True) the backward is served (no
    atomics: a fixed summation order), two runs are bit-identical, and both match
    torch's kernel."""
    idx = data.draw(indices(num))
    grad = data.draw(tensors(shape=(*idx.shape, dim), dtypes=[dtype])).to(DEV)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [E.embedding_dense_backward(grad, idx, num, -1, scale) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(before)
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0, equal_nan=True)
    expected = reference(torch.ops.aten.embedding_dense_backward, grad, idx, num, -1, scale)
    assert_close(runs[0], expected, reduce_size=max(1, idx.numel()))


def test_deterministic_mode_backward_is_served_through_autograd() -> None:
    """In deterministic mode a table gradient through aten reaches gemsops' backward
    (not handed back to torch) and equals torch's."""
    weight = torch.randn(10, 33, device=DEV, requires_grad=True)
    idx = torch.tensor([[1, 2, 2, 9], [4, 2, 1, 0]], device=DEV)
    g = torch.randn(2, 4, 33, device=DEV)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with gemsops.use_gems(include=["embedding_dense_backward"]), gemsops.record() as rec:
            F.embedding(idx, weight).backward(g)
    finally:
        torch.use_deterministic_algorithms(before)
    assert rec.served["embedding_dense_backward.default"] == 1, rec.summary()
    expected = reference(torch.ops.aten.embedding_dense_backward, g, idx, 10, -1, False)
    assert_close(weight.grad, expected, reduce_size=8)  # type: ignore[arg-type]


def test_backward_reads_strided_gradients_in_place() -> None:
    """A transposed or column-sliced grad_output (a view the kernel walks by its
    strides) gives the contiguous gradient's result bit for bit."""
    idx = torch.tensor([[3, 0, 3], [1, 3, 0]], device=DEV)
    base = torch.randn(70, 3, 2, device=DEV)
    strided = base.permute(2, 1, 0)  # [2, 3, 70], columns 6 elements apart
    got = E.embedding_dense_backward(strided, idx, 5, -1, False)
    want = E.embedding_dense_backward(strided.contiguous(), idx, 5, -1, False)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _assert_cast_of(got, _ordered_sum(strided, idx, 5, -1))


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
