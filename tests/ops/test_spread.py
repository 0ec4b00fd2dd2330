"""Property tests of var, std, std_mean and the vector norms (gemsops/ops/rowwise/spread.py).

Each op is compared with torch computed in float64 on the CPU over drawn shapes (empty,
0-dim, odd, rank 0-4), dim sets, keepdim, corrections and orders, transposed or sliced
inputs and planted inf / nan / -0.0; the out= overloads and the split (two-pass) paths
are checked through the registry's bound functions.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.rowwise import layout as reduce_layout
from gemsops.ops.rowwise import spread as S
from gemsops.registry import implementations
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, dims_for, tensors, to_target
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, torch.float64)
ORDERS = (2, 1, 0, math.inf, -math.inf, 3, 0.5, -1, -2.5)

pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


@st.composite
def nonfinite(draw: st.DrawFn, **kwargs: Any) -> torch.Tensor:
    """Tensors with inf, nan and -0.0 planted but no huge finite values (squares of 1e30
    overflow float32 and not the float64 reference: that would test the reference)."""
    x = draw(tensors(specials=True, **kwargs))
    if x.dtype.is_floating_point and x.numel():
        x[torch.isfinite(x) & (x.abs() > 1e20)] = 1.5
    return to_target(x)


def _reduced(x: torch.Tensor, dims: Any) -> int:
    if dims is None or (not isinstance(dims, int) and not dims):
        return max(1, x.numel())
    dims = (dims,) if isinstance(dims, int) else dims
    return max(1, math.prod(x.shape[d] for d in dims))


def _quiet(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@settings(max_examples=20)
@given(x=nonfinite(dtypes=DTYPES), data=st.data())
def test_var_std_std_mean_match_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """var, std and std_mean over any dim set, correction and keepdim match torch's
    (in float64), no degrees of freedom (inf / nan) included; on the CPU an input holding
    an infinity is handed back (torch's Welford answer depends on its order)."""
    dims = data.draw(st.none() | dims_for(x.dim()))
    keepdim = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([None, 0, 1, 2, 0.5]))
    kw = {"correction": correction, "keepdim": keepdim}
    if x.device.type == "cpu" and bool(x.isinf().any()):
        with pytest.raises(Unsupported):
            S.var(x, dims, **kw)
        return
    n = _reduced(x, dims)
    var = _quiet(S.var, x, dims, **kw)
    std = _quiet(S.std, x, dims, **kw)
    s2, mean = _quiet(S.std_mean, x, dims, **kw)
    assert var.dtype == std.dtype == mean.dtype == x.dtype
    assert_close(var, _quiet(reference, torch.var, x, dims, **kw), reduce_size=n)
    e_std = _quiet(reference, torch.std, x, dims, **kw)
    assert_close(std, e_std, reduce_size=n)
    assert_close(s2, e_std, reduce_size=n)
    assert_close(mean, reference(torch.mean, x, dims, keepdim), reduce_size=n)


def test_var_std_warn_and_refuse_as_torch() -> None:
    """No degrees of freedom warn with torch's message (naming the op); integer and
    complex inputs are not computed (torch raises or serves them)."""
    one = torch.ones(1, device=DEVICE)
    for name, fn in (("var", S.var), ("std", S.std), ("std_mean", S.std_mean)):
        with pytest.warns(UserWarning, match=rf"^{name}\(\): degrees of freedom is <= 0"):
            fn(one)
    with pytest.raises(RuntimeError):
        S.var(torch.ones(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(Unsupported):
        S.std(torch.ones(3, dtype=torch.complex64, device=DEVICE))


@settings(max_examples=30)
@given(x=nonfinite(dtypes=DTYPES), data=st.data())
def test_vector_norm_matches_torch(x: torch.Tensor, data: st.DataObject) -> None:
    """linalg_vector_norm of every order (2, 1, 0, +-inf, other p) over any dim set, with
    keepdim and a widening dtype=, matches torch in dtype, shape and value (nan and inf
    propagate as torch's do); a norm without an identity over an empty dim raises."""
    ord = data.draw(st.sampled_from(ORDERS))
    dims = data.draw(st.none() | dims_for(x.dim()))
    keepdim = data.draw(st.booleans())
    dtype = data.draw(st.sampled_from([None, torch.float64] if x.dtype != torch.float16
                                      else [None, torch.float32]))
    reduced = dims if dims else range(x.dim())
    if (ord < 0 or math.isinf(ord)) and any(x.shape[d] == 0 for d in reduced):
        with pytest.raises(RuntimeError):
            S.linalg_vector_norm(x, ord, dims, keepdim, dtype=dtype)
        return
    actual = S.linalg_vector_norm(x, ord, dims, keepdim, dtype=dtype)
    theirs = torch.linalg.vector_norm(x, ord, dims, keepdim, dtype=dtype)
    assert actual.dtype == theirs.dtype and actual.shape == theirs.shape
    expected = reference(torch.linalg.vector_norm, x, ord, dims, keepdim)
    assert_close(actual, expected, reduce_size=_reduced(x, dims))


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every line of 16+ elements split across programs (the two-pass paths)."""
    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_TOTAL", 0)
    monkeypatch.setattr(reduce_layout, "SPLIT_MIN_CHUNK", 8)
    monkeypatch.setattr(reduce_layout, "SPLIT_ALIGN", 8)


@pytest.mark.parametrize(("shape", "dims"), [((300,), None), ((200, 3), (0,)), ((5, 90), (1,))])
def test_split_norms_and_std_match_torch(split_small: None, shape: tuple[int, ...],
                                         dims: Any) -> None:
    """Lines split across programs (partial folds combined by a second launch) give the
    norms and the standard deviation of one pass."""
    gen = torch.Generator().manual_seed(1)
    x = to_target(torch.randn(shape, generator=gen))
    n = _reduced(x, dims)
    for ord in ORDERS:
        assert_close(S.linalg_vector_norm(x, ord, dims),
                     reference(torch.linalg.vector_norm, x, ord, dims), reduce_size=n)
    assert_close(S.std(x, dims), reference(torch.std, x, dims), reduce_size=n)


def _aten(name: str) -> Any:
    op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def test_out_and_legacy_overloads_behave_like_aten() -> None:
    """The registry's out= overloads write torch's values into out (resizing an empty
    one, returning it), and aten's legacy norm overloads give the vector norm."""
    impl = implementations()
    x = to_target(torch.randn(4, 6, generator=torch.Generator().manual_seed(2)))
    for name, fn in (("var", torch.var), ("std", torch.std)):
        out = torch.empty(0, device=DEVICE)
        assert impl[f"{name}.correction_out"](x, [1], correction=0, out=out) is out
        assert_close(out, reference(fn, x, 1, correction=0), reduce_size=6)
    o0, o1 = torch.empty(0, device=DEVICE), torch.empty(0, device=DEVICE)
    impl["std_mean.correction_out"](x, [0], keepdim=True, out0=o0, out1=o1)
    e_std, e_mean = reference(torch.std_mean, x, 0, keepdim=True)
    assert_close(o0, e_std, reduce_size=4)
    assert_close(o1, e_mean, reduce_size=4)
    out = torch.empty(0, device=DEVICE)
    assert impl["linalg_vector_norm.out"](x, 3, [0], out=out) is out
    assert_close(out, reference(torch.linalg.vector_norm, x, 3, 0), reduce_size=4)
    for name, args, kwargs in (
        ("norm.Scalar", (x, 1), {}),
        ("norm.ScalarOpt_dim", (x, None, [1], True), {}),
        ("norm.ScalarOpt_dtype", (x, math.inf), {"dtype": torch.float64}),
        ("norm.ScalarOpt_dim_dtype", (x, 0.5, [0], False), {"dtype": torch.float64}),
    ):
        got = impl[name](*args, **kwargs)
        want = _aten(name)(*args, **kwargs)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert_close(got, reference(_aten(name), *args, **kwargs), reduce_size=24)
    out = torch.empty(0, device=DEVICE)
    assert impl["norm.out"](x, 2, [1], out=out) is out
    assert_close(out, reference(torch.linalg.vector_norm, x, 2, 1), reduce_size=6)
    with pytest.raises(Unsupported):  # out of another dtype: torch decides
        impl["var.correction_out"](x, out=torch.empty(0, dtype=torch.float64, device=DEVICE))
