"""Property tests of the indexing family (gather, scatter, scatter_add, index_select,
index_add, topk) against torch's own kernels.

Tensors are drawn in float, integer and bool dtypes and any layout; indices (int32 and
int64) in range, with repeats, smaller than the tensors they index where torch allows
it, 0-dim and empty. Copies (gather, index_select, scatter) must match torch exactly;
sums (scatter_add, index_add) are atomic and compared with the sum tolerance; topk's
values match exactly and its indices point at those values (tie order is unspecified).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gemshal
import gemsops
from gemsops import registry
from gemsops.errors import Unsupported
from gemsops.ops.index import gather as G
from gemsops.ops.index import scatter as S
from gemsops.ops.index import topk as T
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, shapes, tensors
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
VALUE_DTYPES = (*FLOAT_DTYPES, torch.float64, torch.int8, torch.uint8, torch.int16,
                torch.int32, torch.int64, torch.bool)
ADD_DTYPES = (*FLOAT_DTYPES, torch.float64, torch.int8, torch.uint8, torch.int32,
              torch.int64)


def _gen(draw: st.DrawFn) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))


@st.composite
def index_for(draw: st.DrawFn, limits: tuple[int, ...], dim: int, size: int,
              rank0: bool = False) -> torch.Tensor:
    """An int32/int64 index no larger than ``limits``, values in [0, size), maybe
    transposed or 0-dim."""
    shape = tuple(draw(st.integers(0, lim)) for lim in limits)
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    if size == 0:
        shape = tuple(0 if d == dim else s for d, s in enumerate(shape))
    hi = max(size, 1)
    idx = torch.randint(0, hi, shape, generator=_gen(draw)).to(dtype)
    if rank0 and len(shape) == 1 and shape[0] == 1 and draw(st.booleans()):
        idx = idx.reshape(())
    elif idx.dim() >= 2 and draw(st.booleans()):
        idx = idx.transpose(0, 1).contiguous().transpose(0, 1)
    return idx.to(DEV)


@st.composite
def unique_index(draw: st.DrawFn, limits: tuple[int, ...], dim: int,
                  size: int) -> torch.Tensor:
    """An index with no repeats along ``dim`` (scatter's winner is then defined)."""
    shape = [draw(st.integers(0, lim)) for lim in limits]
    shape[dim] = draw(st.integers(0, size))
    full = list(shape)
    full[dim] = size
    keys = torch.rand(full, generator=_gen(draw))
    idx = keys.argsort(dim=dim).narrow(dim, 0, shape[dim])
    return idx.to(draw(st.sampled_from([torch.int32, torch.int64]))).to(DEV)


@given(data=st.data(), dtype=st.sampled_from(VALUE_DTYPES))
def test_gather_matches_torch(data: st.DataObject, dtype: torch.dtype) -> None:
    """gather returns exactly torch's values for any layout, dim, index shape no larger
    than self outside dim (0-dim and empty included), for every dtype."""
    x = data.draw(tensors(dtypes=[dtype], max_rank=3, specials=True))
    dim = data.draw(st.integers(-max(x.dim(), 1), max(x.dim(), 1) - 1))
    d = dim % max(x.dim(), 1)
    limits = tuple(x.shape) if x.dim() else (1,)
    limits = tuple(4 if k == d else s for k, s in enumerate(limits))
    idx = data.draw(index_for(limits, d, limits[d] if x.dim() == 0 else x.shape[d],
                              rank0=x.dim() <= 1))
    if x.dim() == 0:
        idx = idx.clamp(max=0)
    got = G.gather(x, dim, idx)
    expected = torch.gather(x, dim, idx)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@given(data=st.data(), dtype=st.sampled_from(VALUE_DTYPES))
def test_index_select_matches_torch(data: st.DataObject, dtype: torch.dtype) -> None:
    """index_select returns exactly torch's slices for a vector (or 0-dim) index with
    repeats, any dim and layout."""
    x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    size = x.shape[dim]
    idx = data.draw(index_for((5,), 0, size, rank0=True))
    got = G.index_select(x, dim, idx)
    expected = torch.index_select(x, dim, idx)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@given(data=st.data(), dtype=st.sampled_from(VALUE_DTYPES))
def test_index_with_one_integer_tensor_matches_torch(data: st.DataObject,
                                                     dtype: torch.dtype) -> None:
    """``x[:, idx]`` and ``x[rows, cols]`` indexing (integer index tensors on adjacent
    dims, broadcast together, negative entries counting from the end) returns exactly
    torch's values and shape; index tensors on non-adjacent dims and bool masks are
    handed back."""
    x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    d = data.draw(st.integers(0, x.dim() - 1))
    size = x.shape[d]
    idx = data.draw(index_for((3, 2), 0, size, rank0=True))
    if size and data.draw(st.booleans()):
        idx = idx - size  # the same positions, counted from the end
    indices: list[torch.Tensor | None] = [None] * d + [idx]
    got = G.index(x, indices)
    expected = torch.ops.aten.index.Tensor(x, indices)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    if x.dim() >= 2:  # two adjacent index tensors that broadcast: x[rows, cols]
        # (n, 1) whatever n: it broadcasts with any cols
        rows = data.draw(index_for((3, 1), 0, x.shape[0], rank0=False)).reshape(-1, 1)
        cols = data.draw(index_for((2,), 0, x.shape[1], rank0=False))
        both = G.index(x, [rows, cols])
        want = torch.ops.aten.index.Tensor(x, [rows, cols])
        assert both.shape == want.shape
        torch.testing.assert_close(both, want, rtol=0, atol=0, equal_nan=True)
    if x.dim() >= 3:  # not adjacent: torch moves the result dims to the front
        with pytest.raises(Unsupported):
            G.index(x, [idx.clamp(max=0), None, idx.clamp(max=0)])
    with pytest.raises(Unsupported):
        G.index(x, [torch.ones(x.shape[0], dtype=torch.bool, device=DEV)])


@given(data=st.data(), dtype=st.sampled_from(VALUE_DTYPES), use_value=st.booleans(),
       mode=st.sampled_from(["new", "out", "inplace"]))
def test_scatter_matches_torch(data: st.DataObject, dtype: torch.dtype, use_value: bool,
                               mode: str) -> None:
    """scatter (src or scalar value; new, out= and in place) writes exactly torch's
    result where indices do not repeat along dim; src may be larger than the index."""
    x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    d = data.draw(st.integers(0, x.dim() - 1))
    idx = data.draw(unique_index(tuple(x.shape), d, x.shape[d]))
    src_shape = tuple(s + data.draw(st.integers(0, 1)) for s in idx.shape)
    src = data.draw(tensors(shape=src_shape, dtypes=[dtype]))
    values = [2, 0.0, -1.5] if dtype.is_floating_point else [2, 0]
    value = data.draw(st.sampled_from(values)) if dtype != torch.bool else True
    args = (d, idx, value) if use_value else (d, idx, src)
    expected = torch.scatter(x, *args)
    kw = {"value": value} if use_value else {"src": args[2]}
    if mode == "new":
        got = S.scatter(x, d, idx, **kw)
    elif mode == "out":
        got = torch.empty(0, dtype=dtype, device=DEV)
        assert S.scatter(x, d, idx, **kw, out=got) is got
    else:
        got = x.clone()
        assert S.scatter(got, d, idx, **kw, out=got, inplace=True) is got
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@given(data=st.data(), dtype=st.sampled_from(ADD_DTYPES), inplace=st.booleans())
def test_scatter_add_matches_torch(data: st.DataObject, dtype: torch.dtype,
                                   inplace: bool) -> None:
    """scatter_add sums src into self through an index with repeats (float sums within
    the sum tolerance, integers exactly, wrapping as torch's do)."""
    x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    d = data.draw(st.integers(0, x.dim() - 1))
    limits = tuple(5 if k == d else s for k, s in enumerate(x.shape))
    idx = data.draw(index_for(limits, d, x.shape[d]))
    src = data.draw(tensors(shape=tuple(idx.shape), dtypes=[dtype]))
    expected = reference(torch.scatter_add, x, d, idx, src)
    if inplace:
        got = x.clone()
        S.scatter_add(got, d, idx, src, out=got, inplace=True)
    else:
        got = S.scatter_add(x, d, idx, src)
    assert got.dtype == dtype and got.shape == x.shape
    assert_close(got, expected, reduce_size=max(1, idx.shape[d] if idx.dim() else 1))


@given(data=st.data(), dtype=st.sampled_from((*ADD_DTYPES, torch.bool)),
       alpha=st.sampled_from([1, 2, -3]))
def test_index_add_matches_torch(data: st.DataObject, dtype: torch.dtype, alpha: int) -> None:
    """index_add adds alpha * source slices at repeated indices, any dim and layout."""
    if dtype == torch.bool or dtype == torch.uint8:
        alpha = 1
    x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    d = data.draw(st.integers(0, x.dim() - 1))
    idx = data.draw(index_for((6,), 0, x.shape[d]))
    shape = list(x.shape)
    shape[d] = idx.numel()
    source = data.draw(tensors(shape=shape, dtypes=[dtype]))
    expected = reference(torch.index_add, x, d, idx, source, alpha=alpha)
    got = S.index_add(x, d, idx, source, alpha=alpha)
    assert got.dtype == dtype
    assert_close(got, expected, reduce_size=max(1, idx.numel()))


@given(data=st.data(), dtype=st.sampled_from((*FLOAT_DTYPES, torch.float64, torch.int8,
                                              torch.uint8, torch.int32, torch.int64)),
       largest=st.booleans(), long_rows=st.booleans())
def test_topk_matches_torch(data: st.DataObject, dtype: torch.dtype, largest: bool,
                            long_rows: bool) -> None:
    """topk's values equal torch's exactly (nan ranked largest), sorted best first, and
    its indices point at those values; rows longer than a chunk go in rounds."""
    if long_rows:
        n = data.draw(st.sampled_from([1025, 2100]))
        x = data.draw(tensors(shape=(data.draw(st.integers(1, 2)), n), dtypes=[dtype],
                              specials=True))
    else:
        x = data.draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3, specials=True))
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    k = data.draw(st.integers(0, min(x.shape[dim], 9)))
    values, indices = T.topk(x, k, dim, largest)
    ev, _ = torch.topk(x, k, dim, largest)
    assert values.shape == ev.shape and indices.dtype == torch.int64
    torch.testing.assert_close(values, ev, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(torch.gather(x, dim, indices), values, rtol=0, atol=0,
                               equal_nan=True)
    if indices.numel() and k > 1:  # no index twice in one row
        s = indices.sort(dim).values
        assert bool((s.narrow(dim, 1, k - 1) != s.narrow(dim, 0, k - 1)).all())


def test_topk_values_out_and_max_k() -> None:
    """topk.values writes both out tensors; k above 128 goes back to torch."""
    x = torch.randn(3, 300, device=DEV)
    with gemsops.use_gems(include=["topk"]), gemsops.record() as rec:
        v = torch.empty(0, device=DEV)
        i = torch.empty(0, dtype=torch.int64, device=DEV)
        torch.topk(x, 4, out=(v, i))
        torch.topk(x, 200)
    assert rec.served["topk.values"] == 1
    assert rec.fallback_ops().get("topk.default")
    torch.testing.assert_close(v, torch.topk(x, 4).values, rtol=0, atol=0)


def test_registry_serves_the_family() -> None:
    """Under use_gems the aten calls reach gemsops and give torch's results."""
    x = torch.randn(4, 6, device=DEV)
    idx = torch.tensor([[0, 5, 5], [1, 1, 2], [3, 0, 0], [2, 2, 2]], device=DEV)
    vec = torch.tensor([3, 0, 3], device=DEV)
    src = torch.randn(4, 3, device=DEV)
    want = (torch.gather(x, 1, idx), torch.index_select(x, 0, vec),
            torch.scatter_add(x, 1, idx, src), x.index_add(1, vec, src, alpha=2),
            torch.topk(x, 2), x.scatter(1, idx[:, :1], 7.0))
    with gemsops.use_gems(), gemsops.record() as rec:
        got = (torch.gather(x, 1, idx), torch.index_select(x, 0, vec),
               torch.scatter_add(x, 1, idx, src), x.index_add(1, vec, src, alpha=2),
               torch.topk(x, 2), x.scatter(1, idx[:, :1], 7.0))
        y = x.clone()
        y.scatter_add_(1, idx, src)
    for g, w in zip(got[:4], want[:4], strict=True):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got[4].values, want[4].values)
    torch.testing.assert_close(got[5], want[5])
    torch.testing.assert_close(y, want[2])
    for name in ("gather.default", "index_select.default", "scatter_add.default",
                 "index_add.default", "topk.default", "scatter.value", "scatter_add_.default"):
        assert rec.served[name] >= 1, rec.summary()


def test_autograd_reaches_scatter_add_and_index_add() -> None:
    """The backward of gather is scatter_add and that of index_select is index_add:
    both served by gemsops under use_gems, giving torch's gradients."""
    x = torch.randn(5, 4, device=DEV, requires_grad=True)
    idx = torch.tensor([[0, 0, 3], [1, 2, 2], [3, 3, 3], [0, 1, 2], [2, 1, 0]], device=DEV)
    vec = torch.tensor([4, 4, 0, 2], device=DEV)
    g1 = torch.randn(5, 3, device=DEV)
    g2 = torch.randn(4, 4, device=DEV)
    with gemsops.use_gems(), gemsops.record() as rec:
        (torch.gather(x, 1, idx) * g1).sum().backward()  # type: ignore[no-untyped-call]
        (torch.index_select(x, 0, vec) * g2).sum().backward()  # type: ignore[no-untyped-call]
    grad = x.grad
    x2 = x.detach().clone().requires_grad_()
    (torch.gather(x2, 1, idx) * g1).sum().backward()  # type: ignore[no-untyped-call]
    (torch.index_select(x2, 0, vec) * g2).sum().backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(grad, x2.grad)
    assert rec.served["gather.default"] == 1 and rec.served["index_select.default"] == 1
    assert rec.served["scatter_add.default"] + rec.served["scatter_add_.default"] >= 1, \
        rec.summary()
    assert rec.served["index_add.default"] + rec.served["index_add_.default"] >= 1, \
        rec.summary()


@pytest.mark.skipif(DEV.type != "cpu", reason="indices are range-checked on the CPU only")
def test_out_of_range_index_raises_like_torch() -> None:
    """An index outside [0, size) raises IndexError directly, and torch's error through
    the registry (the call is handed back before anything is written)."""
    x = torch.zeros(3, 4)
    bad = torch.tensor([[4], [0], [1]])
    with pytest.raises(IndexError):
        G.gather(x, 1, bad)
    with pytest.raises(IndexError):
        S.scatter_add(x, 1, -bad, torch.ones(3, 1))
    with pytest.raises(IndexError):
        G.index_select(x, 0, torch.tensor([3]))
    with gemsops.use_gems(include=["gather"]), pytest.raises(RuntimeError):
        torch.gather(x, 1, bad)
    assert bool((x == 0).all())


@pytest.mark.skipif(DEV.type != "cpu", reason="indices are range-checked on the CPU only")
def test_an_index_outside_its_own_dim_raises_though_the_merged_index_fits() -> None:
    """x[i, j] with j == x.size(1): torch raises IndexError naming the dim; the merged
    row-major index (i * 4 + 4) would fit in x, and must not pick x[i + 1, 0]."""
    x = torch.arange(16.0).view(4, 4)
    for i, j, dim in (([0], [4], 1), ([4], [0], 0), ([0], [-5], 1)):
        with pytest.raises(IndexError, match=f"out of bounds for dimension {dim} with size 4"):
            G.index(x, [torch.tensor(i), torch.tensor(j)])
        with gemsops.use_gems(), pytest.raises(IndexError):
            x[torch.tensor(i), torch.tensor(j)]
    assert G.index(x, [torch.tensor([3]), torch.tensor([-1])]).tolist() == [15.0]


@pytest.mark.parametrize(
    "call",
    [
        lambda: G.gather(torch.ones(3, 2, dtype=torch.complex64), 0, torch.tensor([[0]])),
        lambda: G.gather(torch.ones(3, 2), 0, torch.tensor([[0]], dtype=torch.int16)),
        lambda: G.gather(torch.ones(3, 2), 0, torch.tensor([0])),  # rank differs
        lambda: G.gather(torch.ones(3, 2), 0, torch.zeros(1, 3, dtype=torch.long)),
        lambda: G.gather(torch.ones(3, 2), 0, torch.zeros(1, 1, dtype=torch.long),
                         sparse_grad=True),
        lambda: S.scatter_add(torch.ones(3), 0, torch.tensor([0]), torch.ones(1).double()),
        lambda: S.scatter(torch.ones(3), 0, torch.tensor([0, 1]), torch.ones(1)),
        lambda: S.index_add(torch.ones(3, dtype=torch.int32), 0, torch.tensor([0]),
                            torch.ones(1, dtype=torch.int32), alpha=1.5),
        lambda: G.index_select(torch.ones(3, 2), 0, torch.zeros(1, 1, dtype=torch.long)),
        lambda: T.topk(torch.ones(3, 2), 3),
        lambda: T.topk(torch.ones(3, 2, dtype=torch.bool), 1),
        lambda: T.topk(torch.ones(3, 200), 129),
    ],
)
def test_unsupported_inputs(call: object) -> None:
    """Inputs torch refuses or these kernels do not take are handed back to torch."""
    with pytest.raises(Unsupported):
        call()  # type: ignore[operator]


def test_deterministic_mode_leaves_sums_to_torch() -> None:
    """Atomic sums are order-dependent: deterministic mode hands scatter_add back."""
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(Unsupported):
            S.scatter_add(torch.zeros(3, device=DEV), 0, torch.tensor([0, 0], device=DEV),
                          torch.ones(2, device=DEV))
    finally:
        torch.use_deterministic_algorithms(False)


@given(shape=shapes(min_rank=1, max_rank=3))
def test_implementations_table_serves_gather(shape: tuple[int, ...]) -> None:
    """The registry's implementation of gather.default is this module's, and agrees."""
    x = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32,
                     device=DEV).reshape(shape)
    idx = torch.zeros(shape, dtype=torch.int64, device=DEV)
    got = registry.implementations()["gather.default"](x, 0, idx)
    torch.testing.assert_close(got, torch.gather(x, 0, idx), rtol=0, atol=0)
