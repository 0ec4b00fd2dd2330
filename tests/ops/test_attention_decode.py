"""Property tests of the split-KV decode attention forward (gemsops.ops.attention.decode).

Compared with torch's SDPA in float64 on the CPU over few query rows (1..4), grouped
query heads (GROUP 1, 2, 4, 8), key lengths up to a few hundred (not multiples of the
interpreter's 16-key blocks), chunk lengths that give one to many splits (forced through
``decode.FORCE_CHUNK``: the rule's chunks hold at least 256 keys, too many for the
interpreter), causal masking, additive biases with -inf entries and fully masked rows,
fp16/bf16/fp32, transposed and sliced q/k/v, through the public function and the SDPA
forward overloads (their logsumexp included). Also: the decode path is what a decode
shape takes under ``use_gems()``, the split rule's invariants, and the replay memo
keeping a call whose launches use the split workspace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
import gemsops
from gemshal.kernel import recording
from gemsops.ops import replay
from gemsops.ops.attention import decode
from gemsops.ops.attention import sdpa as A
from gemsops.testing.reference import reference
from gemsops.testing.tolerance import assert_close

DEVICE = gemshal.current_device().torch_device

# The interpreter evaluates masked lanes too (-inf - -inf) in numpy, which warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)

ENTRIES = ("public", "efficient", "cpu", "cudnn", "flash")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    replay.clear()
    yield
    replay.clear()


@contextlib.contextmanager
def _knobs(chunk: int | None, min_keys: int = 1) -> Iterator[None]:
    """The decode path for any key length, with ``chunk`` keys per split (None: the
    rule's); the replay memo forgets what it kept under the knobs."""
    saved = decode.MIN_KEYS, decode.FORCE_CHUNK
    decode.MIN_KEYS, decode.FORCE_CHUNK = min_keys, chunk
    replay.clear()
    try:
        yield
    finally:
        decode.MIN_KEYS, decode.FORCE_CHUNK = saved
        replay.clear()


def _laid_out(shape: tuple[int, int, int, int], dtype: torch.dtype, layout: str,
              gen: torch.Generator) -> torch.Tensor:
    """A [B, H, L, D] tensor in one of the layouts SDPA sees."""
    B, H, L, D = shape
    if layout == "blhd":  # SDPA's: [B, L, H, D] memory seen as [B, H, L, D]
        return torch.randn(B, L, H, D, generator=gen).to(dtype).to(DEVICE).transpose(1, 2)
    if layout == "bhdl":  # the head dim strided, the rows contiguous
        return torch.randn(B, H, D, L, generator=gen).to(dtype).to(DEVICE).transpose(2, 3)
    if layout == "sliced":
        return torch.randn(B, H, L, 2 * D, generator=gen).to(dtype).to(DEVICE)[..., ::2]
    return torch.randn(B, H, L, D, generator=gen).to(dtype).to(DEVICE)


@st.composite
def problems(draw: st.DrawFn) -> dict[str, Any]:
    """One decode problem: q, k, v in drawn layouts, a mask kind, a scale, a chunk."""
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    Hq = Hkv * group
    Lq = draw(st.integers(1, 4))
    # Key lengths around the 16-key blocks and the chunks, up to a few hundred.
    Lk = draw(st.sampled_from([1, 7, 16, 33, 64, 100, 129, 200, 257, 300])
              | st.integers(1, 300))
    D = draw(st.sampled_from([16, 32, 64, 128]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    layouts = ["bhld", "blhd", "bhdl", "sliced"]
    q = _laid_out((B, Hq, Lq, D), dtype, draw(st.sampled_from(layouts)), gen)
    k = _laid_out((B, Hkv, Lk, D), dtype, draw(st.sampled_from(layouts)), gen)
    v = _laid_out((B, Hkv, Lk, D), dtype, draw(st.sampled_from(layouts)), gen)
    entry = draw(st.sampled_from(ENTRIES))
    kinds = ["none", "causal"] if entry == "flash" else ["none", "causal", "bias", "both"]
    if entry == "public":
        kinds = ["none", "causal", "bias"]  # torch's function refuses both
    kind = draw(st.sampled_from(kinds))
    bias = None
    if kind in ("bias", "both"):
        # Broadcastable to [B, Hq, Lq, Lk]: a leading dim may be 1 or gone.
        shape = [draw(st.sampled_from([1, n])) for n in (B, Hq)] + [Lq, Lk]
        shape = shape[draw(st.integers(0, 2)):]
        bias = torch.randn(shape, generator=gen).to(dtype)
        flat = bias.view(-1)
        for _ in range(draw(st.integers(0, 6))):
            flat[draw(st.integers(0, flat.numel() - 1))] = float("-inf")
        if draw(st.booleans()):
            bias[..., draw(st.integers(0, Lq - 1)), :] = float("-inf")  # a row sees no key
        bias = bias.to(DEVICE)
    # The split count (None: the rule's, one split at these lengths); the chunk it
    # gives is rarely a multiple of the 16-key block.
    splits = draw(st.sampled_from([None, 2, 3, 5, 8, 1]))
    keys = min(Lq, Lk) if kind in ("causal", "both") else Lk
    chunk = None if splits is None else -(-keys // splits)
    scale = draw(st.sampled_from([None, 0.5]))
    return {"q": q, "k": k, "v": v, "bias": bias, "causal": kind in ("causal", "both"),
            "scale": scale, "entry": entry, "chunk": chunk, "group": group}


def _call(p: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output, logsumexp [B, Hq, Lq] or None) of the drawn entry point."""
    q, k, v, bias, causal, scale = p["q"], p["k"], p["v"], p["bias"], p["causal"], p["scale"]
    Lq = q.shape[2]
    entry = p["entry"]
    if entry == "public":
        return gemsops.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, is_causal=causal, scale=scale, enable_gqa=True), None
    if entry == "efficient":
        out, lse, _, _ = A.efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
        return out, lse[..., :Lq]
    if entry == "cpu":
        out, lse = A.flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
        return out, lse
    if entry == "cudnn":
        res = A.cudnn_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
        return res[0], res[1][..., 0]
    res = A.flash_attention(q, k, v, 0.0, causal, scale=scale)
    return res[0], res[1]


def _expected(p: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, logsumexp) in float64 on the CPU: torch's SDPA under the whole mask (bias
    and causal as one additive mask), zero output where a row sees no key (torch gives
    nan there; the kernels give 0 and a logsumexp of -inf)."""
    q, k, v, bias = p["q"], p["k"], p["v"], p["bias"]
    B, Hq, Lq, D = q.shape
    Lk = k.shape[2]
    scale = p["scale"] if p["scale"] is not None else D ** -0.5

    def ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.zeros(B, Hq, Lq, Lk, dtype=torch.float64)
        if bias is not None:
            mask = mask + bias
        if p["causal"]:
            seen = torch.ones(Lq, Lk, dtype=torch.bool).tril()
            mask = mask.masked_fill(~seen, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
        dead = (mask == float("-inf")).all(-1, keepdim=True)
        kk = k.repeat_interleave(p["group"], dim=1)
        lse = torch.logsumexp(q @ kk.transpose(-1, -2) * scale + mask, -1)
        return out.masked_fill(dead, 0.0), lse

    out, lse = reference(ref, q, k, v, bias)
    return out, lse


@settings(max_examples=50, deadline=None)
@given(p=problems())
def test_decode_forward_matches_sdpa(p: dict[str, Any]) -> None:
    """Property: through the public function and every SDPA forward overload, the decode
    path's output equals softmax(scale * q k^T + bias, causal) v of torch's SDPA in
    float64 (0 for a row that sees no key), in the query's dtype, and its logsumexp the
    scores' natural logsumexp (-inf for such a row), whatever the split count."""
    with _knobs(p["chunk"]), recording() as rec:
        out, lse = _call(p)
    ops = [launch[0].op for launch in rec.launches]
    assert "attention_decode" in ops and "attention_fwd" not in ops, ops
    want_out, want_lse = _expected(p)
    Lk = p["k"].shape[2]
    assert out.dtype == p["q"].dtype and out.shape == p["q"].shape
    assert_close(out, want_out, reduce_size=Lk)
    if lse is not None:
        assert lse.dtype == torch.float32
        assert_close(lse, want_lse.float(), reduce_size=Lk)


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("Lq", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["none", "causal", "bias"])
def test_decode_forward_grid(group: int, Lq: int, dtype: torch.dtype, kind: str) -> None:
    """Every GROUP, few query rows, fp32 and bf16, no mask / causal / a bias with -inf
    entries and a row that sees no key, over 203 keys in splits of 48 (5 splits, the
    last one partial; causal: 3 keys in splits of 1) in SDPA's layouts: the output and
    logsumexp of the CPU flash overload are torch's."""
    gen = torch.Generator().manual_seed(group * 10 + Lq)
    Lk, D = 203, 32
    q = _laid_out((2, 2 * group, Lq, D), dtype, "blhd", gen)
    k = _laid_out((2, 2, Lk, D), dtype, "blhd", gen)
    v = _laid_out((2, 2, Lk, D), dtype, "bhdl", gen)
    bias = None
    if kind == "bias":
        bias = torch.randn(2 * group, Lq, Lk, generator=gen).to(dtype)
        bias[:, :, 60:150] = float("-inf")
        bias[-1, -1] = float("-inf")
        bias = bias.to(DEVICE)
    p = {"q": q, "k": k, "v": v, "bias": bias, "causal": kind == "causal", "scale": None,
         "entry": "cpu", "group": group}
    with _knobs(1 if kind == "causal" else 48), recording() as rec:
        out, lse = _call(p)
    assert [launch[0].op for launch in rec.launches] == [
        "attention_decode", "attention_decode_combine"] or (kind == "causal" and Lq == 1)
    want_out, want_lse = _expected(p)
    assert_close(out, want_out, reduce_size=Lk)
    assert lse is not None
    assert_close(lse, want_lse.float(), reduce_size=Lk)
    if bias is not None:
        assert (lse[:, -1, -1] == float("-inf")).all() and (out[:, -1, -1] == 0).all()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_decode_shape_takes_the_decode_path(enabled: bool) -> None:
    """Under use_gems(), torch's SDPA at a decode shape (one query row, grouped-query
    heads, 300 keys) launches the decode kernels and not the forward kernel, and agrees
    with torch; with the path switched off the forward kernel serves it. bf16, as models
    call it: torch's GPU SDPA sends fp32 with grouped heads to its math path, which
    decomposes into matmuls and a softmax before any attention kernel is asked."""
    gen = torch.Generator().manual_seed(5)
    bf16 = torch.bfloat16
    q = torch.randn(1, 1, 8, 32, generator=gen).to(DEVICE, bf16).transpose(1, 2)
    k, v = (torch.randn(1, 300, 2, 32, generator=gen).to(DEVICE, bf16).transpose(1, 2)
            for _ in range(2))
    assert decode.takes(q, k, None, None)
    saved = decode.ENABLED
    decode.ENABLED = enabled
    try:
        with gemsops.use_gems(), gemsops.record() as served, recording() as rec:
            got = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    finally:
        decode.ENABLED = saved
    assert served.served and not served.fallbacks, served.summary()
    ops = {launch[0].op for launch in rec.launches}
    if enabled:
        assert "attention_decode" in ops and "attention_fwd" not in ops, ops
    else:
        assert "attention_fwd" in ops and "attention_decode" not in ops, ops
    want = reference(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True),
                     q, k, v)
    assert_close(got, want, reduce_size=300)


def test_the_predicate() -> None:
    """The decode path takes few packed rows over many keys, and no dropout."""
    x = torch.empty(2, 32, 1, 128)
    kv = torch.empty(2, 8, 4096, 128)
    assert decode.takes(x, kv, None, None)
    assert not decode.takes(x, kv, None, object())  # dropout keeps the forward kernel
    assert not decode.takes(x, kv[:, :, :100], None, None)  # few keys
    assert not decode.takes(torch.empty(2, 32, 64, 128), kv, None, None)  # 256 rows a head
    assert decode.takes(torch.empty(2, 8, 64, 128), kv, None, None)  # 64 rows a head


@settings(max_examples=200, deadline=None)
@given(programs=st.integers(1, 4096), keys=st.integers(1, 1 << 17),
       sms=st.integers(1, 264))
def test_split_rule_covers_the_keys(programs: int, keys: int, sms: int) -> None:
    """Property: the split rule's chunks are multiples of GRANULE keys, cover every key
    with no empty split, hold at least SPLIT_KEYS keys when there are several, and their
    count stays within MAX_SPLITS."""
    splits, chunk = decode.split_plan(programs, keys, sms)
    assert chunk % decode.GRANULE == 0
    assert 1 <= splits <= decode.MAX_SPLITS
    assert (splits - 1) * chunk < keys <= splits * chunk
    if splits > 1:
        assert chunk >= decode.SPLIT_KEYS
        assert programs < 0.8 * decode.PROGRAMS_PER_SM * sms  # the heads did not fill it


def test_split_rule_at_h200_decode_shapes() -> None:
    """On 132 multiprocessors: one batch row of 8 key/value heads over 4096 keys takes
    16 splits of 256 keys; 16 rows take 2; 16 rows of 32 heads fill the device unsplit."""
    assert decode.split_plan(8, 4096, 132) == (16, 256)
    assert decode.split_plan(128, 4096, 132) == (2, 2048)
    assert decode.split_plan(512, 4096, 132) == (1, 4096)


def test_replay_keeps_a_call_with_split_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU flash overload served by several splits is kept by the replay memo (its
    launches read a workspace the call allocates, which the overload vouches for), and a
    second call of the structure replays it on its own tensors without the host code."""
    gen = torch.Generator().manual_seed(2)

    def operands() -> list[torch.Tensor]:
        return [torch.randn(1, 4, 2, 32, generator=gen).to(DEVICE),
                *(torch.randn(1, 1, 70, 32, generator=gen).to(DEVICE) for _ in range(2))]

    with _knobs(24):
        first = operands()
        with recording() as rec:
            A.flash_attention_for_cpu(*first)
        assert [launch[0].op for launch in rec.launches] == [
            "attention_decode", "attention_decode_combine"]
        assert replay.kept() == 1

        def refuse(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("decided afresh, not replayed")

        monkeypatch.setattr(decode, "forward", refuse)
        second = operands()
        out, lse = A.flash_attention_for_cpu(*second)
    want = reference(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True),
                     *second)
    assert_close(out, want, reduce_size=70)
    want_lse = reference(lambda a, b: torch.logsumexp(
        a @ b.repeat_interleave(4, 1).transpose(-1, -2) / 32 ** 0.5, -1), second[0], second[1])
    assert_close(lse, want_lse, reduce_size=70)
