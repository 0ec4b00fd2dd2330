"""Property tests of layer norm and RMS norm, forward and backward, against torch in float64.

Inputs have 0-3 leading dims and 1-2 normalized dims (rows up to 300 elements, so the
interpreter's 64-element chunks loop), any layout, with and without weight and bias, and
fp32 parameters beside half inputs. Gradients are checked through the differentiable
public functions and through the aten-level backward with every output mask.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.errors import Unsupported
from gemsops.ops.norm import norm as NM
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
DTYPES = (*FLOAT_DTYPES, torch.float64)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter


@st.composite
def norm_case(draw: st.DrawFn) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor | None,
                                        torch.Tensor | None]:
    """(input, normalized_shape, weight or None, bias or None), parameters maybe fp32."""
    lead = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 7]), max_size=3)))
    if draw(st.booleans()):
        ns: tuple[int, ...] = (draw(st.one_of(st.integers(1, 300), st.sampled_from([1, 64, 65]))),)
    else:
        ns = (draw(st.integers(1, 6)), draw(st.integers(1, 50)))
    x = draw(tensors(shape=(*lead, *ns), dtypes=DTYPES)).to(DEV)
    half = x.dtype in (torch.float16, torch.bfloat16)
    pdtype = torch.float32 if half and draw(st.booleans()) else x.dtype
    w = draw(st.one_of(st.none(), tensors(shape=ns, dtypes=[pdtype])))
    b = draw(st.one_of(st.none(), tensors(shape=ns, dtypes=[pdtype])))
    return x, ns, None if w is None else w.to(DEV), None if b is None else b.to(DEV)


def _grads(fn, inputs, grad):  # type: ignore[no-untyped-def]
    leaves = [t.detach().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    return out, torch.autograd.grad(out, wanted, grad)


@given(case=norm_case(), eps=st.sampled_from([1e-5, 1e-2]))
def test_native_layer_norm_matches_torch(case, eps: float) -> None:  # type: ignore[no-untyped-def]
    """native_layer_norm's output, mean and rstd match torch; stats have torch's shape and dtype."""
    x, ns, w, b = case
    out, mean, rstd = NM.native_layer_norm(x, list(ns), w, b, eps)
    e_out, e_mean, e_rstd = reference(torch.native_layer_norm, x, list(ns), w, b, eps)
    n = math.prod(ns)
    assert out.dtype == x.dtype and out.is_contiguous()
    if x.device.type == "cpu":
        assert mean.dtype == torch.native_layer_norm(x, list(ns), w, b, eps)[1].dtype
    assert_close(out, e_out, reduce_size=n)
    assert_close(mean, e_mean, reduce_size=n)
    assert_close(rstd, e_rstd, reduce_size=n)


@given(case=norm_case(), data=st.data())
def test_layer_norm_gradients_match_torch(case, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    """The differentiable layer_norm gives torch's input, weight and bias gradients."""
    x, ns, w, b = case
    g = data.draw(tensors(shape=x.shape, dtypes=[x.dtype])).to(DEV)
    out, grads = _grads(lambda *t: NM.layer_norm(t[0], ns, t[1], t[2], 1e-5), (x, w, b), g)
    e_out, e_grads = _grads(lambda *t: F.layer_norm(t[0], ns, t[1], t[2], 1e-5),
                            [None if t is None else t.detach().cpu().double() for t in (x, w, b)],
                            g.cpu().double())
    rows = max(1, x.numel() // math.prod(ns))
    assert_close(out, e_out, reduce_size=math.prod(ns))
    assert_close(grads[0], e_grads[0], reduce_size=4 * math.prod(ns))
    for actual, expected in zip(grads[1:], e_grads[1:], strict=True):
        assert actual.dtype == (w if w is not None else b).dtype  # type: ignore[union-attr]
        assert_close(actual, expected, reduce_size=4 * rows)


@settings(max_examples=10)
@given(case=norm_case(), mask=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_layer_norm_backward_output_mask(case, mask: tuple[bool, bool, bool]) -> None:  # type: ignore[no-untyped-def]
    """native_layer_norm_backward returns None exactly where output_mask (or a missing
    parameter) says so, and torch's values elsewhere."""
    x, ns, w, b = case
    if x.numel() == 0:
        return
    _, mean, rstd = NM.native_layer_norm(x, list(ns), w, b, 1e-5)
    g = torch.randn(x.shape, device=DEV).to(x.dtype)
    got = NM.native_layer_norm_backward(g, x, list(ns), mean, rstd, w, b, list(mask))
    if not (mask[0] or (mask[1] and w is not None) or (mask[2] and b is not None)):
        assert got == (None, None, None)  # (torch's own kernel cannot even run this case)
        return
    _, e_mean, e_rstd = reference(torch.native_layer_norm, x, list(ns), w, b, 1e-5)
    # torch's kernel cannot fill a gradient for a missing parameter: ask it only for those
    # that exist.
    present = [mask[0], mask[1] and w is not None, mask[2] and b is not None]
    want = reference(torch.ops.aten.native_layer_norm_backward, g, x, list(ns), e_mean, e_rstd,
                     w, b, present)
    for i, (actual, expected, param) in enumerate(zip(got, want, (x, w, b), strict=True)):
        if not mask[i] or param is None:
            assert actual is None
        else:
            assert_close(actual, expected, reduce_size=4 * max(x.numel(), 1))


@given(case=norm_case(), eps=st.sampled_from([None, 1e-6, 0.1]), data=st.data())
def test_rms_norm_matches_torch(case, eps: float | None, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    """rms_norm and its gradients match torch; eps=None is float32's machine epsilon."""
    x, ns, w, _ = case
    ref_eps = eps if eps is not None else torch.finfo(
        torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    g = data.draw(tensors(shape=x.shape, dtypes=[x.dtype])).to(DEV)
    out, grads = _grads(lambda *t: NM.rms_norm(t[0], ns, t[1], eps), (x, w), g)
    e_out, e_grads = _grads(lambda *t: F.rms_norm(t[0], ns, t[1], ref_eps),
                            [None if t is None else t.detach().cpu().double() for t in (x, w)],
                            g.cpu().double())
    assert_close(out, e_out, reduce_size=math.prod(ns))
    assert_close(grads[0], e_grads[0], reduce_size=4 * math.prod(ns))
    if w is not None:
        assert_close(grads[1], e_grads[1], reduce_size=4 * max(1, x.numel() // math.prod(ns)))


@settings(max_examples=10)
@given(case=norm_case())
def test_fused_rms_norm_statistic(case) -> None:  # type: ignore[no-untyped-def]
    """_fused_rms_norm returns torch's rstd: leading shape plus ones, fp32 (fp64 for fp64)."""
    x, ns, w, _ = case
    out, rstd = NM.fused_rms_norm(x, list(ns), w, 1e-5)
    e_out, e_rstd = reference(torch.ops.aten._fused_rms_norm, x, list(ns), w, 1e-5)
    assert rstd.dtype == (torch.float64 if x.dtype == torch.float64 else torch.float32)
    assert_close(out, e_out, reduce_size=math.prod(ns))
    assert_close(rstd, e_rstd, reduce_size=math.prod(ns))


@pytest.mark.parametrize("special", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rows_stay_local(special: float) -> None:
    """A nan/inf in one row makes that row nan (as torch) and leaves the other rows exact;
    on the CPU an inf goes to torch's layer norm (whose mean there depends on its order)."""
    x = torch.randn(6, 150, device=DEV)
    x[2, 100] = special
    if math.isinf(special) and x.device.type == "cpu":
        with pytest.raises(Unsupported):
            NM.layer_norm(x, (150,))
    else:
        out = NM.layer_norm(x, (150,))
        assert_close(out, reference(F.layer_norm, x, (150,)), reduce_size=150)
        assert bool(out[2].isnan().all())
    out = NM.rms_norm(x, (150,))
    assert_close(out, reference(F.rms_norm, x, (150,), None, torch.finfo(torch.float32).eps),
                 reduce_size=150)


def test_empty_rows() -> None:
    """No rows: empty output and statistics of torch's shape, no launch."""
    x = torch.randn(0, 3, 5, device=DEV)
    out, mean, rstd = NM.native_layer_norm(x, [5], None, None, 1e-5)
    assert out.shape == (0, 3, 5) and mean.shape == (0, 3, 1) and rstd.shape == (0, 3, 1)
    assert NM.rms_norm(x, 5).shape == (0, 3, 5)


@pytest.mark.parametrize(
    "args",
    [
        (torch.ones(2, 3, dtype=torch.complex64), [3], None, None, 1e-5),
        (torch.ones(2, 3, dtype=torch.int32), [3], None, None, 1e-5),
        (torch.ones(2, 3), [4], None, None, 1e-5),
        (torch.ones(2, 3), [3], torch.ones(4), None, 1e-5),
        (torch.ones(2, 3), [3], torch.ones(3, dtype=torch.float16), None, 1e-5),
    ],
)
def test_unsupported_inputs(args: tuple) -> None:  # type: ignore[type-arg]
    """Complex/integer inputs and mismatched shapes or dtypes go back to torch."""
    args = tuple(a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(Unsupported):
        NM.native_layer_norm(*args)
