"""Property tests of nll_loss (aten forward/backward) and the fused cross_entropy.

Batches of 0-40 rows over 1-300 classes (plus one vocabulary-sized row), targets with
ignore_index present and all rows ignored (mean -> nan, as torch), class weights, label
smoothing, probability targets, [C] and [N, C, d] inputs, every reduction; values and
gradients are compared with torch in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.loss import cross_entropy as CE
from gemsops.ops.loss import nll as L
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, torch.float64)
REDUCTIONS = ("none", "mean", "sum")
IGNORE = -100

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter


@st.composite
def class_targets(draw: st.DrawFn, shape: tuple[int, ...], classes: int) -> torch.Tensor:
    """int64 targets in [0, classes), some (or all) set to ignore_index."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    t = torch.randint(0, classes, shape, generator=gen)
    mode = draw(st.sampled_from(["none", "some", "all"]))
    if mode == "all":
        t.fill_(IGNORE)
    elif mode == "some" and t.numel():
        t.view(-1)[torch.randint(0, 2, (t.numel(),), generator=gen).bool()] = IGNORE
    return t.to(DEV)


@st.composite
def loss_case(draw: st.DrawFn, *, ndim: tuple[int, ...] = (1, 2)) -> tuple[torch.Tensor, ...]:
    """(logits, class targets, weight or None) for a [C], [N, C] or [N, C, d] input."""
    rank = draw(st.sampled_from(ndim))
    classes = draw(st.one_of(st.integers(1, 300), st.sampled_from([1, 64, 65])))
    n = draw(st.sampled_from([0, 1, 2, 3, 7, 16, 40]))
    shape = {1: (classes,), 2: (n, classes), 3: (min(n, 4), classes, 3)}[rank]
    x = draw(tensors(shape=shape, dtypes=DTYPES)).to(DEV)
    t = draw(class_targets(shape[:1] + shape[2:] if rank > 1 else (), classes))
    w = draw(st.one_of(st.none(), tensors(shape=(classes,), dtypes=[x.dtype], layouts=False)))
    return x, t, None if w is None else w.abs().to(DEV)


def _red(reduction: str) -> int:
    return REDUCTIONS.index(reduction)


@given(case=loss_case(), reduction=st.sampled_from(REDUCTIONS), data=st.data())
def test_nll_loss_matches_torch(case, reduction: str, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    """nll_loss_forward's output and total_weight and nll_loss_backward match torch."""
    x, t, w = case
    out, total = L.nll_loss_forward(x, t, w, _red(reduction), IGNORE)
    e_out, e_total = reference(torch.ops.aten.nll_loss_forward, x, t, w, _red(reduction), IGNORE)
    rows = max(1, t.numel())
    assert out.dtype == x.dtype and total.dtype == x.dtype
    assert_close(out, e_out, reduce_size=rows)
    assert_close(total, e_total, reduce_size=rows)
    g = data.draw(tensors(shape=out.shape, dtypes=[x.dtype], layouts=False)).to(DEV)
    gi = L.nll_loss_backward(g, x, t, w, _red(reduction), IGNORE, total)
    e_gi = reference(torch.ops.aten.nll_loss_backward, g, x, t, w, _red(reduction), IGNORE,
                     e_total)
    assert_close(gi, e_gi, reduce_size=rows)


@given(case=loss_case(ndim=(1, 2, 3)), reduction=st.sampled_from(REDUCTIONS),
       smoothing=st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0]), data=st.data())
def test_cross_entropy_matches_torch(case, reduction: str, smoothing: float,  # type: ignore[no-untyped-def]
                                     data: st.DataObject) -> None:
    """Fused cross_entropy with class targets (ignore_index, weights, label smoothing, any
    reduction) gives torch's loss and logit gradient."""
    x, t, w = case
    xg = x.detach().requires_grad_()
    out = CE.cross_entropy(xg, t, w, IGNORE, reduction, smoothing)
    g = data.draw(tensors(shape=out.shape, dtypes=[x.dtype], layouts=False)).to(DEV)
    (gx,) = torch.autograd.grad(out, xg, g)
    xr = x.detach().cpu().double().requires_grad_()
    wr = None if w is None else w.cpu().double()
    e_out = F.cross_entropy(xr, t.cpu(), wr, ignore_index=IGNORE, reduction=reduction,
                            label_smoothing=smoothing)
    (e_gx,) = torch.autograd.grad(e_out, xr, g.cpu().double())
    classes = x.shape[1] if x.dim() > 1 else x.shape[0]
    size = classes * max(1, t.numel())
    assert out.dtype == x.dtype and gx.shape == x.shape
    assert_close(out, e_out, reduce_size=size)
    assert_close(gx, e_gx, reduce_size=size)


@settings(max_examples=15)
@given(case=loss_case(ndim=(1, 2, 3)), reduction=st.sampled_from(REDUCTIONS),
       smoothing=st.sampled_from([0.0, 0.2]), data=st.data())
def test_cross_entropy_probability_targets(case, reduction: str, smoothing: float,  # type: ignore[no-untyped-def]
                                           data: st.DataObject) -> None:
    """Class-probability targets (mean divides by the row count) match torch."""
    x, _, w = case
    dim = 1 if x.dim() > 1 else 0
    p = torch.softmax(data.draw(tensors(shape=x.shape, dtypes=[torch.float32])), dim)
    p = p.to(x.dtype).to(DEV)
    xg = x.detach().requires_grad_()
    out = CE.cross_entropy(xg, p, w, reduction=reduction, label_smoothing=smoothing)
    (gx,) = torch.autograd.grad(out, xg, torch.ones_like(out))
    xr = x.detach().cpu().double().requires_grad_()
    e_out = F.cross_entropy(xr, p.cpu().double(), None if w is None else w.cpu().double(),
                            reduction=reduction, label_smoothing=smoothing)
    (e_gx,) = torch.autograd.grad(e_out, xr, torch.ones_like(e_out))
    size = max(1, x.numel())
    assert_close(out, e_out, reduce_size=size)
    assert_close(gx, e_gx, reduce_size=size)


def test_all_ignored_mean_is_nan() -> None:
    """With every target ignored the mean is 0/0 = nan (as torch) and the gradient is 0."""
    x = torch.randn(5, 7, device=DEV, requires_grad=True)
    t = torch.full((5,), IGNORE, device=DEV)
    for smoothing in (0.0, 0.3):
        out = CE.cross_entropy(x, t, label_smoothing=smoothing)
        assert bool(out.isnan())
        (gx,) = torch.autograd.grad(out, x)
        assert bool((gx == 0).all())
    out, total = L.nll_loss_forward(x.detach(), t, None, 1, IGNORE)
    assert bool(out.isnan()) and float(total) == 0.0


def test_vocabulary_sized_rows() -> None:
    """A 128256-class row is looped in chunks: loss and gradient still match torch."""
    torch.manual_seed(0)
    x = (torch.randn(2, 128256, device=DEV) * 4).requires_grad_()
    t = torch.tensor([5, 128255], device=DEV)
    out = CE.cross_entropy(x, t, label_smoothing=0.1)
    (gx,) = torch.autograd.grad(out, x)
    xr = x.detach().cpu().double().requires_grad_()
    e_out = F.cross_entropy(xr, t.cpu(), label_smoothing=0.1)
    (e_gx,) = torch.autograd.grad(e_out, xr)
    assert_close(out, e_out, reduce_size=128256)
    assert_close(gx, e_gx, reduce_size=128256)


def test_non_finite_logits() -> None:
    """-inf logits off the target are fine; a row of all -inf or with +inf is nan, as torch."""
    x = torch.randn(3, 10, device=DEV)
    x[0, 4] = float("-inf")
    x[1, :] = float("-inf")
    x[2, 3] = float("inf")
    t = torch.tensor([1, 2, 2], device=DEV)
    out = CE.cross_entropy(x, t, reduction="none")
    assert_close(out, reference(F.cross_entropy, x, t, reduction="none"), reduce_size=10)


@pytest.mark.skipif(DEV.type != "cpu", reason="targets are range-checked on the CPU only")
def test_target_out_of_bounds_raises_like_torch() -> None:
    """A target outside [0, C) that is not ignore_index raises IndexError, as torch does."""
    with pytest.raises(IndexError):
        L.nll_loss_forward(torch.randn(2, 3), torch.tensor([0, 3]), None, 1, IGNORE)
    with pytest.raises(IndexError):
        CE.cross_entropy(torch.randn(2, 3), torch.tensor([-1, 0]))


def test_public_nll_loss_is_differentiable() -> None:
    """nll_loss (F.nll_loss's signature) gives torch's gradient through autograd."""
    x = torch.randn(6, 9, device=DEV, requires_grad=True)
    t = torch.tensor([0, 8, IGNORE, 3, 3, 1], device=DEV)
    w = torch.rand(9, device=DEV)
    (gx,) = torch.autograd.grad(L.nll_loss(x, t, w), x)
    xr = x.detach().cpu().double().requires_grad_()
    (e_gx,) = torch.autograd.grad(F.nll_loss(xr, t.cpu(), w.cpu().double()), xr)
    assert_close(gx, e_gx, reduce_size=6)


@pytest.mark.parametrize(
    ("x", "t"),
    [
        (torch.ones(2, 3, dtype=torch.complex64), torch.tensor([0, 1])),
        (torch.ones(2, 3), torch.tensor([0, 1], dtype=torch.int32)),
        (torch.ones(2, 3), torch.tensor([0, 1, 2])),
        (torch.ones(2, 3, 4), torch.zeros(2, 4, dtype=torch.long)),
    ],
)
def test_unsupported_inputs(x: torch.Tensor, t: torch.Tensor) -> None:
    """Complex logits, int32 targets, mismatched batches and >2-D nll inputs go to torch."""
    with pytest.raises(Unsupported):
        L.nll_loss_forward(x.to(DEV), t.to(DEV), None, 1, IGNORE)


@settings(max_examples=15)
@given(case=loss_case(ndim=(1, 2, 3)), reduction=st.sampled_from(REDUCTIONS),
       smoothing=st.sampled_from([0.0, 0.1]))
def test_f_cross_entropy_through_aten_is_the_fused_op(case, reduction: str,  # type: ignore[no-untyped-def]
                                                      smoothing: float) -> None:
    """Property: under use_gems, F.cross_entropy reaches the fused op at the autograd key
    (one aten::cross_entropy_loss served, no log_softmax or nll_loss) and gives torch's
    loss and logit gradient."""
    import gemsops

    x, t, w = case
    xg = x.detach().requires_grad_()
    with gemsops.use_gems(), gemsops.record() as rec:
        out = F.cross_entropy(xg, t, w, ignore_index=IGNORE, reduction=reduction,
                              label_smoothing=smoothing)
        (gx,) = torch.autograd.grad(out, xg, torch.ones_like(out))
    assert rec.served["cross_entropy_loss.default"] == 1
    assert not any(op.startswith(("_log_softmax", "nll_loss")) for op in rec.served)
    xr = x.detach().cpu().double().requires_grad_()
    e_out = F.cross_entropy(xr, t.cpu(), None if w is None else w.cpu().double(),
                            ignore_index=IGNORE, reduction=reduction, label_smoothing=smoothing)
    (e_gx,) = torch.autograd.grad(e_out, xr, torch.ones_like(e_out))
    classes = x.shape[1] if x.dim() > 1 else x.shape[0]
    size = classes * max(1, t.numel())
    assert_close(out, e_out, reduce_size=size)
    assert_close(gx, e_gx, reduce_size=size)


def test_cross_entropy_hands_weight_gradients_back_to_torch() -> None:
    """Class weights that require grad go to torch's composite, which refuses them exactly
    as without gemsops; the call is counted as handed back."""
    import gemsops

    x = torch.randn(4, 5, device=DEV, requires_grad=True)
    t = torch.tensor([0, 1, 2, 3], device=DEV)
    w = torch.rand(5, device=DEV, requires_grad=True)
    with pytest.raises(RuntimeError) as theirs:
        F.cross_entropy(x, t, w)
    with gemsops.use_gems(), gemsops.record() as rec, pytest.raises(RuntimeError) as ours:
        F.cross_entropy(x, t, w)
    assert str(ours.value) == str(theirs.value)
    assert "cross_entropy_loss.default" in rec.fallback_ops()


def test_cross_entropy_double_backward_matches_torch() -> None:
    """The fused backward is not differentiable, so a create_graph backward recomputes
    with torch's kernels: the second derivative equals torch's (it used to raise)."""
    target = torch.tensor([0, 1, 2], device=DEV)
    x = torch.randn(3, 4, device=DEV, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(CE.cross_entropy(x, target), x, create_graph=True)
    (hx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    y = x.detach().clone().requires_grad_()
    (gy,) = torch.autograd.grad(torch.nn.functional.cross_entropy(y, target), y,
                                create_graph=True)
    (hy,) = torch.autograd.grad(gy.pow(2).sum(), y)
    torch.testing.assert_close(hx, hy)
