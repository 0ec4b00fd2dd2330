"""Property tests of scaled dot-product attention (gemsops.ops.attention), forward and backward.

Compared with torch's math attention in float64 over drawn batch sizes (0 included),
grouped-query heads, odd sequence lengths (not multiples of the interpreter's 16-row
blocks), head dims, dtypes, layouts, causal masking, additive and boolean masks and
softmax scales; through the public function and through the aten overloads torch's SDPA
dispatches to under use_gems(). Unsupported inputs (odd head dims, float64, dropout on
the CPU flash overload) are handed back to torch; dropout itself is tested in
test_attention_dropout.py.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gemshal
import gemsops
from gemsops.errors import Unsupported
from gemsops.ops.attention import sdpa as A
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, tensors
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device
aten = torch.ops.aten

FORWARDS = ("_scaled_dot_product_flash_attention.default",
            "_scaled_dot_product_efficient_attention.default",
            "_scaled_dot_product_flash_attention_for_cpu.default",
            "_scaled_dot_product_cudnn_attention.default")
BACKWARDS = ("_scaled_dot_product_flash_attention_backward.default",
             "_scaled_dot_product_efficient_attention_backward.default",
             "_scaled_dot_product_flash_attention_for_cpu_backward.default",
             "_scaled_dot_product_cudnn_attention_backward.default")

# The interpreter evaluates masked lanes too (-inf - -inf) in numpy, which warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


@st.composite
def problems(draw: st.DrawFn, *, masks: bool = True) -> dict:
    """One attention problem: q, k, v (maybe non-contiguous), mask, causal, scale, gqa."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    B = draw(st.sampled_from([0, 1, 1, 2]))
    Hkv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 2))
    Hq = Hkv * group
    Lq = draw(st.integers(1, 40))
    Lk = draw(st.integers(1, 40))
    D = draw(st.sampled_from([16, 32, 64]))
    q = draw(tensors(shape=(B, Hq, Lq, D), dtypes=(dtype,)))
    k = draw(tensors(shape=(B, Hkv, Lk, D), dtypes=(dtype,)))
    v = draw(tensors(shape=(B, Hkv, Lk, D), dtypes=(dtype,)))
    kind = draw(st.sampled_from(["none", "causal", "additive", "bool"] if masks
                                else ["none", "causal"]))
    mask = None
    if kind in ("additive", "bool"):
        # A shape broadcastable to [B, Hq, Lq, Lk]: any of the leading dims may be 1 or gone.
        shape = [draw(st.sampled_from([1, n])) for n in (B, Hq)] + [Lq, Lk]
        shape = shape[draw(st.integers(0, 2)):]
        if kind == "additive":
            mask = draw(tensors(shape=shape, dtypes=(dtype,)))
        else:
            mask = draw(tensors(shape=shape, dtypes=(torch.bool,), layouts=False))
            mask[..., 0] = True  # every query sees a key (a fully masked row is nan in torch)
    scale = draw(st.sampled_from([None, 0.5, 1 / 3]))
    return {"q": q, "k": k, "v": v, "mask": mask, "causal": kind == "causal",
            "scale": scale, "gqa": group > 1}


def _expected(p: dict, q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=p["causal"],
                                          scale=p["scale"], enable_gqa=p["gqa"])


def _sizes(p: dict) -> tuple[int, int]:
    """Reduction lengths of the output/dq (keys) and of dk/dv (queries of the group)."""
    lq, lk = p["q"].shape[2], p["k"].shape[2]
    return lk, lq * p["q"].shape[1] // max(p["k"].shape[1], 1)


@settings(max_examples=16)
@given(p=problems())
def test_forward_matches_math(p: dict) -> None:
    """The output equals softmax(scale * q k^T + mask, causal) v of torch's math kernel."""
    actual = gemsops.scaled_dot_product_attention(
        p["q"], p["k"], p["v"], attn_mask=p["mask"], is_causal=p["causal"], scale=p["scale"],
        enable_gqa=p["gqa"])
    expected = reference(lambda q, k, v, m: _expected(p, q, k, v, m),
                         p["q"], p["k"], p["v"], p["mask"])
    assert actual.dtype == p["q"].dtype
    assert_close(actual, expected, reduce_size=_sizes(p)[0])


@pytest.fixture
def with_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The current device, as if its vendor declared tensor descriptors for it."""
    import attrs

    real = gemshal.device_of

    def device_of(t: torch.Tensor) -> gemshal.Device:
        d = real(t)
        return attrs.evolve(d, features=d.features | {"tensor_descriptors"})

    monkeypatch.setattr(gemshal, "device_of", device_of)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # a patch, no state
@given(p=problems(), layout=st.sampled_from(["bhld", "blhd"]))
def test_forward_through_tensor_descriptors_matches_math(with_descriptors: None, p: dict,
                                                         layout: str) -> None:
    """Property: where the device has tensor descriptors, fp16/bf16 attention whose
    matrices meet the descriptor rules (a unit head-dim stride, 16-byte aligned rows and
    heads; SDPA's [B, L, H, D] memory seen as [B, H, L, D] included) moves its tiles
    through descriptors, with zeros past the sequence ends, and still equals torch's
    math attention."""
    dtype = p["q"].dtype
    if dtype not in (torch.float16, torch.bfloat16):
        dtype = torch.bfloat16

    def laid(t: torch.Tensor) -> torch.Tensor:
        t = t.to(dtype)
        if layout == "blhd":
            return t.transpose(1, 2).contiguous().transpose(1, 2)
        return t.contiguous()

    q, k, v = laid(p["q"]), laid(p["k"]), laid(p["v"])
    mask = None if p["mask"] is None else p["mask"].to(dtype) if p["mask"].dtype != torch.bool \
        else p["mask"]
    if q.numel() and k.numel():
        assert A._descriptors(q, k, v)
    actual = gemsops.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=p["causal"], scale=p["scale"], enable_gqa=p["gqa"])
    expected = reference(lambda q, k, v, m: _expected(p, q, k, v, m), q, k, v, mask)
    assert_close(actual, expected, reduce_size=_sizes(p)[0])


def test_descriptors_follow_the_alignment_rules(with_descriptors: None) -> None:
    """A unit head-dim stride, 16-byte aligned bases and strides, fp16/bf16: descriptors;
    fp32, a strided head dim or an odd row offset: the pointer path."""
    x = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16, device=DEVICE)
    assert A._descriptors(x, x, x)
    assert not A._descriptors(x.float(), x.float(), x.float())
    strided = torch.randn(1, 2, 8, 32, dtype=torch.bfloat16, device=DEVICE)[..., ::2]
    assert not A._descriptors(strided, x, x)
    offset = torch.randn(1, 2, 8 * 16 + 1, dtype=torch.bfloat16, device=DEVICE)[..., 1:]
    assert not A._descriptors(offset.view(1, 2, 8, 16), x, x)
    A.DESCRIPTORS[0] = False
    try:
        assert not A._descriptors(x, x, x)
    finally:
        A.DESCRIPTORS[0] = True


@settings(max_examples=12)
@given(p=problems(), via_aten=st.booleans(), data=st.data())
def test_backward_matches_math(p: dict, via_aten: bool, data: st.DataObject) -> None:
    """dq, dk, dv (and the gradient of an additive mask) equal torch's math backward,
    through the public function or through F.scaled_dot_product_attention under
    use_gems() (the SDPA overloads and their backward)."""
    leaves = [t.detach().clone().requires_grad_() for t in (p["q"], p["k"], p["v"])]
    mask = p["mask"]
    if mask is not None and mask.dtype != torch.bool and not via_aten:
        mask = mask.detach().clone().requires_grad_()
        leaves.append(mask)
    out_shape = p["q"].shape
    grad = data.draw(tensors(shape=out_shape, dtypes=(p["q"].dtype,)))
    if via_aten:
        with gemsops.use_gems(), gemsops.record() as rec:
            out = _expected(p, *leaves[:3], mask)
            got = torch.autograd.grad(out, leaves, grad)
        assert not rec.fallbacks  # served, or torch chose its math kernel (no overload)
    else:
        out = gemsops.scaled_dot_product_attention(
            *leaves[:3], attn_mask=mask, is_causal=p["causal"], scale=p["scale"],
            enable_gqa=p["gqa"])
        got = torch.autograd.grad(out, leaves, grad)

    def ref(q, k, v, m, g):
        ins = [t.requires_grad_() for t in (q, k, v)]
        if m is not None and m.dtype != torch.bool and len(leaves) == 4:
            ins.append(m.requires_grad_())
        # An empty batch leaves a broadcast mask out of the graph: its gradient is zeros.
        return torch.autograd.grad(_expected(p, *ins[:3], m), ins, g, allow_unused=True,
                                   materialize_grads=True)

    expected = reference(ref, p["q"], p["k"], p["v"], p["mask"], grad)
    # The backward chains two reductions (over keys into P and dQ, over queries into dK
    # and dV), each rounding to the input dtype in between, as flash attention does.
    size = sum(_sizes(p))
    for actual, want in zip(got, expected, strict=True):
        assert_close(actual, want.to(actual.dtype) if actual.dtype != want.dtype else want,
                     reduce_size=size)


def test_overloads_return_torchs_layouts() -> None:
    """Each forward overload returns torch's tuple: shapes, dtypes, logsumexp layout and
    padding; its backward takes that tuple back."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 19, 32, generator=gen).to(DEVICE) for _ in range(3))
    bias = torch.randn(19, 19, generator=gen).to(DEVICE).expand(2, 2, 19, 19)
    expected = reference(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, m),
                         q, k, v, bias)
    lse_ref = reference(lambda a, b, m: torch.logsumexp(a @ b.transpose(-1, -2)
                                                        / math.sqrt(32) + m, -1), q, k, bias)

    out, lse, seed, offset = A.efficient_attention(q, k, v, bias, True)
    assert lse.shape == (2, 2, 32) and lse.dtype == torch.float32
    assert seed.dtype == offset.dtype == torch.int64
    assert_close(out, expected, reduce_size=19)
    assert_close(lse[..., :19], lse_ref, reduce_size=19)
    assert A.efficient_attention(q, k, v, bias, False)[1].shape == (2, 2, 0)
    grads = A.efficient_attention_backward(torch.ones_like(out), q, k, v, bias, out, lse,
                                           seed, offset, 0.0, [True, True, True, True])
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, bias.shape]
    assert A.efficient_attention_backward(torch.ones_like(out), q, k, v, None, out, lse,
                                          seed, offset, 0.0, [True] * 4)[3] is None

    half = [t.half() for t in (q, k, v)]
    res = A.flash_attention(*half, 0.0, True)
    assert len(res) == 9 and res[2] is None and res[3] is None and res[4:6] == (19, 19)
    assert res[1].shape == (2, 2, 19) and res[1].is_contiguous()
    causal = reference(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                       *half)
    assert_close(res[0], causal, reduce_size=19)
    dq, dk, dv = A.flash_attention_backward(torch.ones_like(res[0]), *half, res[0], res[1],
                                            res[2], res[3], 19, 19, 0.0, True, res[6], res[7])
    assert dq.shape == dk.shape == dv.shape == q.shape

    out, lse = A.flash_attention_for_cpu(q, k, v, attn_mask=bias)
    assert out.is_contiguous() and lse.shape == (2, 2, 19) and lse.stride() == (38, 1, 2)
    assert_close(lse, lse_ref, reduce_size=19)


def test_cudnn_overloads_return_their_layouts() -> None:
    """The cuDNN overload pair returns the output in the query's layout and a [B, H, Lq, 1]
    float32 logsumexp, and its backward takes that logsumexp back: the gradients are the
    reference's."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 19, 16, generator=gen).to(DEVICE) for _ in range(3))
    g = torch.randn(2, 2, 19, 16, generator=gen).to(DEVICE)
    res = A.cudnn_attention(q, k, v, None, True, is_causal=True)
    assert res[0].shape == q.shape and res[1].shape == (2, 2, 19, 1)
    assert res[1].dtype == torch.float32 and res[2] is None and res[8] is None
    grads = A.cudnn_attention_backward(g, q, k, v, res[0], res[1], res[6], res[7], None, None,
                                       None, 19, 19, 0.0, True)
    expected = reference(
        lambda a, b, c, d: torch.autograd.grad(F.scaled_dot_product_attention(
            a.requires_grad_(), b.requires_grad_(), c.requires_grad_(), is_causal=True),
            (a, b, c), d), q, k, v, g)
    for actual, want in zip(grads, expected, strict=True):
        assert_close(actual, want, reduce_size=19)


@pytest.mark.parametrize("served", [FORWARDS, BACKWARDS])
def test_pairs_with_torchs_other_half(served: tuple[str, ...]) -> None:
    """gemsops' forward with torch's backward, and torch's forward with gemsops' backward,
    give torch's gradients: the saved output and logsumexp are what torch's kernels save."""
    gen = torch.Generator().manual_seed(1)
    dtype = torch.float16 if not gemshal.current_device().interpreter else torch.float32
    q, k, v = (torch.randn(1, 2, 21, 16, generator=gen).to(DEVICE, dtype).requires_grad_()
               for _ in range(3))
    g = torch.randn(1, 2, 21, 16, generator=gen).to(DEVICE, dtype)
    with gemsops.use_gems(include=list(served)), gemsops.record() as rec:
        got = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                  (q, k, v), g)
    assert sum(rec.served[o] for o in served) == 1
    expected = reference(
        lambda a, b, c, d: torch.autograd.grad(F.scaled_dot_product_attention(
            a.requires_grad_(), b.requires_grad_(), c.requires_grad_(), is_causal=True),
            (a, b, c), d), q, k, v, g)
    for actual, want in zip(got, expected, strict=True):
        assert_close(actual, want, reduce_size=21)


def test_empty_batch_and_rows() -> None:
    """A batch of 0 and zero-length sequences give torch's shapes (zeros for no keys)."""
    q = torch.randn(0, 2, 5, 16, device=DEVICE, requires_grad=True)
    out = gemsops.scaled_dot_product_attention(q, q, q)
    assert out.shape == (0, 2, 5, 16)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape
    q = torch.randn(1, 1, 3, 16, device=DEVICE)
    k = torch.randn(1, 1, 0, 16, device=DEVICE)
    assert (gemsops.scaled_dot_product_attention(q, k, k) == 0).all()


def test_unsupported_inputs_go_to_torch() -> None:
    """Head dims that are not a power of two in 16..128, float64, mismatched heads,
    dropout on the CPU flash overload and a dropout backward whose Philox state no gemsops
    forward drew raise Unsupported; under use_gems() torch serves them, counted."""
    x = torch.randn(1, 2, 5, 16, device=DEVICE)
    with pytest.raises(Unsupported, match="dropout"):
        A.flash_attention_for_cpu(x, x, x, dropout_p=0.1)
    with pytest.raises(Unsupported, match="head dim"):
        A.flash_attention_for_cpu(*(torch.randn(1, 1, 4, 24, device=DEVICE),) * 3)
    with pytest.raises(Unsupported):
        A.flash_attention_for_cpu(*(x.double(),) * 3)
    with pytest.raises(Unsupported):
        gemsops.scaled_dot_product_attention(x, x[:, :1], x[:, :1])  # no enable_gqa
    with pytest.raises(Unsupported, match="dropout"):
        A.flash_attention_backward(x, x, x, x, x, x[..., 0], None, None, 5, 5, 0.5, False,
                                   x, x)

    odd = torch.randn(1, 2, 7, 24, device=DEVICE)
    with gemsops.use_gems(), gemsops.record() as rec:
        actual = F.scaled_dot_product_attention(odd, odd, odd)
        # torch's kernel itself does not take dropout.
        with contextlib.suppress(Exception):
            aten._scaled_dot_product_flash_attention_for_cpu(x, x, x, 0.5)
    reasons = [r for _, r in rec.fallbacks]
    assert_close(actual, reference(F.scaled_dot_product_attention, odd, odd, odd),
                 reduce_size=7)
    assert sum("dropout" in r for r in reasons) == 1
    assert any("head dim 24" in r for r in reasons)


@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3)])
def test_the_output_takes_torchs_layout_for_a_permuted_query(perm: tuple[int, ...]) -> None:
    """Under use_gems(), SDPA's output has the strides torch's own kernel gives it (on the
    CPU: the query's layout, a transposed [B, L, H, D] query included), and its values."""
    g = torch.Generator().manual_seed(1)
    dtype = torch.float32 if DEVICE.type == "cpu" else torch.bfloat16
    base = torch.randn(2, 2, 64, 32, generator=g).to(DEVICE, dtype)
    inverse = [perm.index(i) for i in range(4)]
    q = base.permute(*perm).contiguous().permute(*inverse)
    k, v = (torch.randn(2, 2, 64, 32, generator=g).to(DEVICE, dtype) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with gemsops.use_gems(), gemsops.record() as rec:
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rec.served and not rec.fallbacks, rec.summary()
    assert got.stride() == expected.stride()
    assert_close(got, expected, reduce_size=64)
