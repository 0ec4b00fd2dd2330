"""Property tests of layer norm and RMS norm, forward and backward, against torch in float64.

Inputs have 0-3 leading dims and 1-2 normalized dims (rows up to 300 elements, so the
interpreter's 64-element chunks loop), any layout, with and without weight and bias, and
fp32 parameters beside half inputs. Gradients are checked through the differentiable
public functions and through the aten-level backward with every output mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


# --- the backward's row split -----------------------------------------------------------

@given(M=st.integers(0, 10**7), sms=st.integers(0, 300))
def test_row_split_covers_every_row_once(M: int, sms: int) -> None:
    """row_split gives programs that together take every row, each at least one, no more
    than BWD_WAVES per multiprocessor, and about one per multiprocessor or more while rows
    allow."""
    parts, rows_per = NM.row_split(M, sms)
    assert rows_per >= 1
    if M == 0:
        assert parts == 0
        return
    assert parts * rows_per >= M > (parts - 1) * rows_per  # the last program has rows
    sm = max(sms, 1)
    assert parts <= NM.BWD_WAVES * sm
    # Slices of one length (the last one shorter) lose at most half the programs that one
    # per multiprocessor would have.
    assert 2 * parts >= min(M, sm)
    if NM.BWD_WAVES * sm * NM.BWD_MIN_ROWS <= M:
        assert parts > (NM.BWD_WAVES - 1) * sm  # large inputs fill every wave


# (programs, rows per program) forced on the backward: one program walking every row,
# a program per row, and a few uneven slices (the last one short).
_SPLITS = {
    "one": lambda M: (1, max(M, 1)),
    "per_row": lambda M: (M, 1),
    "uneven": lambda M: (-(-M // 3), 3),
}


@pytest.mark.parametrize("split", sorted(_SPLITS))
@given(
    lead=st.sampled_from([(0,), (1,), (5,), (2, 7), (33,)]),
    n=st.sampled_from([1, 3, 50, 64, 65, 129, 300]),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(["contiguous", "transposed", "sliced"]),
    data=st.data(),
)
@settings(max_examples=12)
def test_backward_split_matches_torch(split: str, lead: tuple[int, ...], n: int,
                                      dtype: torch.dtype, layout: str,
                                      data: st.DataObject) -> None:
    """The one-pass backward gives torch's dx, weight and bias gradients however the rows
    are split over programs (one, one per row, uneven slices), for rows that fit one tile
    and rows walked in chunks (N past the interpreter's 64), N not a power of two, and
    non-contiguous inputs and gradients; no rows give zero parameter gradients."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NM, "row_split", lambda M, _sms: _SPLITS[split](M) if M else (0, 1))
        _check_backward(lead, n, dtype, layout, data)


def _check_backward(lead: tuple[int, ...], n: int, dtype: torch.dtype, layout: str,
                    data: st.DataObject) -> None:
    shape = (*lead, n)
    x = _laid_out(data, shape, dtype, layout)
    g = _laid_out(data, shape, dtype, data.draw(st.sampled_from(["contiguous", "sliced"])))
    w = data.draw(tensors(shape=(n,), dtypes=[dtype])).to(DEV)
    b = data.draw(tensors(shape=(n,), dtypes=[dtype])).to(DEV)
    rows = max(1, x.numel() // n)
    for rms in (False, True):
        params = (w,) if rms else (w, b)
        if rms:
            _, grads = _grads(lambda *t: NM.rms_norm(t[0], (n,), t[1], 1e-5), (x, *params), g)
        else:
            _, grads = _grads(lambda *t: NM.layer_norm(t[0], (n,), t[1], t[2], 1e-5),
                              (x, *params), g)
        ref_in = [t.detach().cpu().double() for t in (x, *params)]
        if rms:
            _, e_grads = _grads(lambda *t: F.rms_norm(t[0], (n,), t[1], 1e-5), ref_in,
                                g.cpu().double())
        else:
            _, e_grads = _grads(lambda *t: F.layer_norm(t[0], (n,), t[1], t[2], 1e-5), ref_in,
                                g.cpu().double())
        assert grads[0].shape == x.shape
        assert_close(grads[0], e_grads[0], reduce_size=4 * n)
        for actual, expected in zip(grads[1:], e_grads[1:], strict=True):
            assert actual.dtype == dtype and actual.shape == (n,)
            assert_close(actual, expected, reduce_size=4 * rows)


def _laid_out(data: st.DataObject, shape: tuple[int, ...], dtype: torch.dtype,
              layout: str) -> torch.Tensor:
    """A tensor of ``shape``: contiguous, a transposed view, or every other column."""
    if layout == "transposed" and len(shape) >= 2:
        base = data.draw(tensors(shape=(*shape[:-2], shape[-1], shape[-2]), dtypes=[dtype],
                                 layouts=False))
        return base.to(DEV).transpose(-1, -2)
    if layout == "sliced":
        base = data.draw(tensors(shape=(*shape[:-1], 2 * shape[-1]), dtypes=[dtype],
                                 layouts=False))
        return base.to(DEV)[..., ::2]
    return data.draw(tensors(shape=shape, dtypes=[dtype], layouts=False)).to(DEV)


@pytest.mark.parametrize("split", sorted(_SPLITS))
@pytest.mark.parametrize("n", [40, 300])
@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False),
                                  (False, False, True), (False, True, True)])
def test_backward_partial_outputs_with_split(split: str, n: int, mask: tuple[bool, bool, bool],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for only some gradients (no dx: the weight-gradient pass alone) gives
    torch's values for those and None for the rest, however the rows are split."""
    monkeypatch.setattr(NM, "row_split", lambda M, _sms: _SPLITS[split](M) if M else (0, 1))
    torch.manual_seed(0)
    x = torch.randn(11, n, device=DEV)
    w, b = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
    g = torch.randn(11, n, device=DEV)
    _, mean, rstd = NM.native_layer_norm(x, [n], w, b, 1e-5)
    got = NM.native_layer_norm_backward(g, x, [n], mean, rstd, w, b, list(mask))
    _, e_mean, e_rstd = reference(torch.native_layer_norm, x, [n], w, b, 1e-5)
    want = reference(torch.ops.aten.native_layer_norm_backward, g, x, [n], e_mean, e_rstd,
                     w, b, list(mask))
    for actual, expected, on in zip(got, want, mask, strict=True):
        if on:
            assert actual is not None
            assert_close(actual, expected, reduce_size=4 * 11 * n)
        else:
            assert actual is None
    _, rstd_r = NM.fused_rms_norm(x, [n], w, 1e-5)
    got_r = NM.fused_rms_norm_backward(g, x, [n], rstd_r, w, list(mask[:2]))
    x64, w64 = (t.detach().cpu().double().requires_grad_() for t in (x, w))
    e_dx, e_dw = torch.autograd.grad(F.rms_norm(x64, (n,), w64, 1e-5), (x64, w64),
                                     g.cpu().double())
    for actual, expected, on in zip(got_r, (e_dx, e_dw), mask[:2], strict=True):
        if on:
            assert actual is not None
            assert_close(actual, expected, reduce_size=4 * 11 * n)
        else:
            assert actual is None


def test_backward_of_no_rows_gives_zero_parameter_gradients() -> None:
    """No rows: an empty dx and weight and bias gradients of zeros, as torch gives."""
    x = torch.randn(0, 7, device=DEV, requires_grad=True)
    w = torch.randn(7, device=DEV, requires_grad=True)
    b = torch.randn(7, device=DEV, requires_grad=True)
    dx, dw, db = torch.autograd.grad(NM.layer_norm(x, (7,), w, b).sum(), (x, w, b))
    assert dx.shape == (0, 7) and bool((dw == 0).all()) and bool((db == 0).all())
    dx, dw = torch.autograd.grad(NM.rms_norm(x, (7,), w).sum(), (x, w))
    assert dx.shape == (0, 7) and bool((dw == 0).all())


def test_prune_keeps_tiles_the_row_needs() -> None:
    """The autotuner is offered no chunk wider than the row (unless none is narrower) and,
    in the backward, no chunk far narrower than the row and no step of more rows than a
    program has."""
    import triton

    from gemsops.ops.norm import kernels as K

    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}) for m, n in
               [(1, 4096), (2, 4096), (1, 16384), (4, 1024), (16, 64)]]

    def kept(fn: Callable[..., list[Any]], **args: int) -> list[tuple[int, int]]:
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in fn(configs, args)]

    assert kept(K._prune_forward, N=3000) == [(1, 4096), (2, 4096), (4, 1024), (16, 64)]
    assert kept(K._prune_forward, N=20000) == [(1, 4096), (2, 4096), (1, 16384), (4, 1024),
                                               (16, 64)]
    assert kept(K._prune_forward, N=10) == [(16, 64)]
    # The backward also drops chunks under half a row that one config holds whole, or
    # under a quarter of the widest chunk for longer rows.
    assert kept(K._prune_backward, N=4096, rows_per=1) == [(1, 4096)]
    assert kept(K._prune_backward, N=4096, rows_per=128) == [(1, 4096), (2, 4096)]
    assert kept(K._prune_backward, N=3000, rows_per=4) == [(1, 4096), (2, 4096)]
    assert kept(K._prune_backward, N=100, rows_per=1) == [(16, 64)]
    assert kept(K._prune_backward, N=10, rows_per=1) == [(16, 64)]
    assert kept(K._prune_backward, N=10**5, rows_per=64) == [(1, 4096), (2, 4096), (1, 16384)]
