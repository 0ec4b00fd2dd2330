"""Property tests of multinomial and the in-place random fills (uniform_, normal_,
random_, exponential_), all on counter-based Philox keyed from torch's generator.

The values are not torch's stream, so the properties are reproducibility (a seed fixes
the result, another seed or the next call changes it), ranges exactly as torch's, and
distributions within bounds many standard deviations wide at fixed seeds (they cannot
flake: the seeds are drawn from a derandomized profile, and a correct stream fails a
6-sigma bound about once in 10^9 checks).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemsops
from gemsops.errors import Unsupported
from gemsops.testing.strategies import target_device

DEV = target_device()
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
SEEDS = st.integers(0, 2**31 - 1)


def _binomial_ok(count: int, n: int, q: float) -> bool:
    """``count`` within 6 standard deviations (plus one) of Binomial(n, q)'s mean."""
    return abs(count - n * q) <= 6 * math.sqrt(n * q * (1 - q)) + 1


# --- multinomial ------------------------------------------------------------------


@st.composite
def _weights(draw: st.DrawFn) -> torch.Tensor:
    """Rows of non-negative weights, some zero, of a float dtype, 1-D or 2-D."""
    rows = draw(st.integers(1, 3))
    cats = draw(st.sampled_from([1, 2, 5, 33, 300]))
    gen = torch.Generator().manual_seed(draw(SEEDS))
    w = torch.rand(rows, cats, generator=gen) * (torch.rand(rows, cats, generator=gen) > 0.3)
    w[:, draw(st.integers(0, cats - 1))] += 0.5  # every row has a positive weight
    w = w.to(draw(st.sampled_from(FLOATS))).to(DEV)
    return w[0] if draw(st.booleans()) else w


@settings(max_examples=15)
@given(w=_weights(), num=st.integers(1, 8), replacement=st.booleans(), seed=SEEDS)
def test_multinomial_draws_positive_weights_in_shape(w: torch.Tensor, num: int,
                                                     replacement: bool, seed: int) -> None:
    """Property: multinomial returns int64 indices of shape (rows, num_samples) (or
    (num_samples,) for 1-D weights), every one a category of positive weight (zero
    weights are never drawn); without replacement a row's samples are distinct; the same
    seed gives the same samples."""
    positive = int((w > 0).sum(-1).min())
    if not replacement and num > positive:
        num = positive
    torch.manual_seed(seed)
    x = gemsops.multinomial(w, num, replacement)
    torch.manual_seed(seed)
    assert torch.equal(x, gemsops.multinomial(w, num, replacement))
    assert x.dtype == torch.int64 and x.shape == (*w.shape[:-1], num)
    rows, xs = w.reshape(-1, w.shape[-1]), x.reshape(-1, num)
    assert bool((rows.gather(1, xs) > 0).all())
    if not replacement:
        assert all(len(set(r.tolist())) == num for r in xs.cpu())


def test_multinomial_frequencies_follow_the_weights() -> None:
    """Property: with replacement, over 4000 draws (float32 weights) each category's
    count is within a 6-sigma binomial bound of 4000 * w / sum(w), and zero weights get
    no draws; one-sample draws (the inverse CDF over many rows, float16 weights) and the
    first sample without replacement (the exponential race) follow the same law."""
    w = torch.tensor([0.5, 0.0, 2.0, 1.0, 0.0, 0.25, 4.0], device=DEV)
    p = (w.double() / w.double().sum()).cpu()
    torch.manual_seed(1234)
    draws = {
        "replacement": gemsops.multinomial(w, 4000, True),
        "one per row": gemsops.multinomial(w.half().expand(500, -1), 1).reshape(-1),
        "race": gemsops.multinomial(w.expand(300, -1), 2)[:, 0],
    }
    for how, x in draws.items():
        counts = torch.bincount(x.cpu(), minlength=w.numel())
        n = x.numel()
        for c in range(w.numel()):
            assert _binomial_ok(int(counts[c]), n, float(p[c])), (how, c, counts)


def test_multinomial_seeds_and_errors() -> None:
    """A different seed, or the next call, gives other samples; torch's errors are
    raised with torch's type (RuntimeError) on the CPU: negative, inf and nan weights,
    an all-zero row, num_samples <= 0, more samples than categories without
    replacement, 3-D weights; too few positive weights without replacement is handed back."""
    w = torch.rand(4, 50, generator=torch.Generator().manual_seed(0)).to(DEV)
    torch.manual_seed(5)
    a = gemsops.multinomial(w, 3, True)
    b = gemsops.multinomial(w, 3, True)
    torch.manual_seed(6)
    c = gemsops.multinomial(w, 3, True)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    bad = [torch.tensor([1.0, -1.0]), torch.tensor([1.0, math.inf]),
           torch.tensor([math.nan, 1.0]), torch.tensor([[1.0, 1.0], [0.0, 0.0]])]
    if DEV.type == "cpu":
        for t in bad:
            with pytest.raises(RuntimeError):
                gemsops.multinomial(t, 1)
        with pytest.raises(Unsupported):
            gemsops.multinomial(torch.tensor([1.0, 0.0, 1.0]), 3)
    for args in ((w, 0, True), (w, 51, False), (w[None], 1, True)):
        with pytest.raises(RuntimeError):
            gemsops.multinomial(*args)


# --- the fills --------------------------------------------------------------------


def _layout(n: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    if layout == "transposed":
        return torch.empty(n // 50, 50, dtype=dtype, device=DEV).t()
    if layout == "sliced":
        return torch.zeros(n, 2, dtype=dtype, device=DEV)[:, 1]
    return torch.empty(n, dtype=dtype, device=DEV)


@settings(max_examples=12)
@given(dtype=st.sampled_from(FLOATS), seed=SEEDS,
       bounds=st.sampled_from([(0.0, 1.0), (1.0, 2.0), (-3.0, 5.5), (-1000.0, 1001.5),
                               (2.0, 2.0)]),
       layout=st.sampled_from(["contiguous", "transposed", "sliced"]))
def test_uniform_range_and_moments(dtype: torch.dtype, seed: int,
                                   bounds: tuple[float, float], layout: str) -> None:
    """Property: uniform_(from, to) fills every element (any layout) with values in
    [from, to) of the dtype (never to, also for half types), mean within 6 sigma of the
    midpoint; manual_seed reproduces it, and the next call differs."""
    lo, hi = bounds
    x = _layout(6000, dtype, layout)
    torch.manual_seed(seed)
    gemsops.uniform_(x, lo, hi)
    y = torch.empty_like(x)
    torch.manual_seed(seed)
    gemsops.uniform_(y, lo, hi)
    assert torch.equal(x, y)
    top = torch.tensor(hi, dtype=dtype)
    v = x.cpu()
    if hi == lo:
        assert bool((v == lo).all())
        return
    assert bool((v >= lo).all()) and bool((v < top).all())
    sd = (hi - lo) / math.sqrt(12 * v.numel())
    assert abs(float(v.double().mean()) - (lo + hi) / 2) <= 6 * sd + (hi - lo) * 2**-7
    assert not torch.equal(x, gemsops.uniform_(y, lo, hi))


@settings(max_examples=10)
@given(dtype=st.sampled_from(FLOATS), seed=SEEDS,
       params=st.sampled_from([(0.0, 1.0), (3.0, 0.02), (-2.0, 5.0)]))
def test_normal_moments(dtype: torch.dtype, seed: int, params: tuple[float, float]) -> None:
    """Property: normal_(mean, std) has sample mean within 6 sigma of mean, sample
    variance within 6 sigma of std^2, and about 68% within one std (6-sigma bound); all
    values finite; std=0 gives the mean."""
    mean, std = params
    n = 8000
    torch.manual_seed(seed)
    v = gemsops.normal_(torch.empty(n, dtype=dtype, device=DEV), mean, std).cpu().double()
    assert bool(torch.isfinite(v).all())
    slack = abs(mean) * 2**-7 + std * 2**-7  # the dtype's rounding
    assert abs(float(v.mean()) - mean) <= 6 * std / math.sqrt(n) + slack
    assert abs(float(v.var()) - std**2) <= 6 * std**2 * math.sqrt(2 / n) + 4 * std * slack
    if abs(mean) <= std:  # else the dtype's spacing near the mean blurs the one-std band
        assert _binomial_ok(int(((v - mean).abs() < std).sum()), n, 0.6826894921)
    z = gemsops.normal_(torch.empty(7, dtype=dtype, device=DEV), mean, 0.0).cpu()
    assert bool((z == torch.tensor(mean, dtype=dtype)).all())


@settings(max_examples=6)
@given(dtype=st.sampled_from(FLOATS), seed=SEEDS, lambd=st.sampled_from([0.5, 1.0, 3.0]))
def test_exponential_is_positive_with_mean(dtype: torch.dtype, seed: int, lambd: float) -> None:
    """Property: exponential_(lambd) gives values above 0 with mean within 6 sigma of 1/lambd."""
    n = 8000
    torch.manual_seed(seed)
    v = gemsops.exponential_(torch.empty(n, dtype=dtype, device=DEV), lambd).cpu().double()
    assert bool((v > 0).all()) and bool(torch.isfinite(v).all())
    assert abs(float(v.mean()) - 1 / lambd) <= 6 / lambd / math.sqrt(n) + 2**-7 / lambd


def _top(dtype: torch.dtype) -> int:
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return 2 ** {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24,
                     torch.float64: 53}[dtype]
    return int(torch.iinfo(dtype).max)


@settings(max_examples=20)
@given(dtype=st.sampled_from([*FLOATS, *INTS, torch.bool]), seed=SEEDS,
       form=st.sampled_from(["default", "to", "from_to", "from"]),
       layout=st.sampled_from(["contiguous", "sliced"]))
def test_random_ranges_per_dtype(dtype: torch.dtype, seed: int, form: str, layout: str) -> None:
    """Property: random_() spans [0, max] of the dtype (2**digits for floating dtypes, 1
    for bool), random_(to) [0, to - 1], random_(from, to) [from, to - 1], random_(from)
    [from, max]; only integers, in the dtype; both ends reached for small ranges and each
    value's count within a 6-sigma binomial bound; seeds reproduce."""
    top = _top(dtype)
    low = 0 if dtype in (torch.uint8, torch.bool) else -3
    lo, hi, args = {"default": (0, top, {}), "to": (0, min(top, 5), {"to": min(top, 5) + 1}),
                    "from_to": (low, min(top, 4), {"low": low, "to": min(top, 4) + 1}),
                    "from": (max(0, top - 6), top, {"low": max(0, top - 6)})}[form]
    x = _layout(6000, dtype, layout)
    torch.manual_seed(seed)
    gemsops.random_(x, **args)
    y = torch.empty_like(x)
    torch.manual_seed(seed)
    assert torch.equal(x, gemsops.random_(y, **args))
    v = x.cpu().to(torch.float64 if dtype.is_floating_point else torch.int64)
    if dtype.is_floating_point:
        assert bool((v == v.round()).all())
    assert int(v.min()) >= lo and int(v.max()) <= hi
    if hi - lo < 16:
        counts = torch.bincount((v - lo).long(), minlength=hi - lo + 1)
        assert all(_binomial_ok(int(k), v.numel(), 1 / (hi - lo + 1)) for k in counts)
    else:
        assert int(v.max()) - int(v.min()) > (hi - lo) // 2


def test_random_full_int64_range_and_handed_back_bounds() -> None:
    """random_(-2**63) of an int64 takes all 64 bits (both signs); bounds torch refuses or
    warns about (from >= to, outside the dtype, beyond 2**digits of a float) and integer
    uniform_/normal_, negative std and a non-positive lambda are handed back."""
    x = gemsops.random_(torch.empty(4000, dtype=torch.int64, device=DEV), -(2**63))
    assert int(x.min()) < -(2**61) and int(x.max()) > 2**61
    cases = [lambda: gemsops.random_(torch.empty(3, dtype=torch.int8, device=DEV), 0, 1000),
             lambda: gemsops.random_(torch.empty(3, device=DEV), 5, 5),
             lambda: gemsops.random_(torch.empty(3, dtype=torch.float16, device=DEV), 0, 5000),
             lambda: gemsops.uniform_(torch.empty(3, device=DEV), 2.0, 1.0),
             lambda: gemsops.uniform_(torch.empty(3, dtype=torch.int32, device=DEV)),
             lambda: gemsops.normal_(torch.empty(3, device=DEV), 0.0, -1.0),
             lambda: gemsops.exponential_(torch.empty(3, device=DEV), 0.0)]
    for case in cases:
        with pytest.raises(Unsupported):
            case()


def test_fills_are_served_inside_use_gems() -> None:
    """Inside use_gems() the aten overloads model init and torch.randint reach are served
    by gemsops: uniform_, normal_, random_ (from, to, default), exponential_."""
    with gemsops.use_gems(), gemsops.record() as rec:
        torch.nn.init.normal_(torch.empty(10, device=DEV), std=0.02)
        torch.nn.init.uniform_(torch.empty(10, device=DEV), -0.1, 0.1)
        torch.randint(0, 96, (3, 4), device=DEV)
        torch.empty(5, dtype=torch.int32, device=DEV).random_(7)
        torch.empty(5, device=DEV).random_()
        torch.empty(5, device=DEV).exponential_()
    assert {"normal_.default", "uniform_.default", "random_.from", "random_.to",
            "random_.default", "exponential_.default"} <= set(rec.served)
    assert not rec.fallbacks


def test_hf_generate_is_served() -> None:
    """HF generate on a tiny Llama on the target device, greedy and top-k sampling:
    isin, multinomial and the init fills are all served, nothing is left unimplemented
    among them. Needs transformers (not a CI dependency)."""
    tf = pytest.importorskip("transformers")
    from gemsops.trace import trace

    def workload() -> None:
        cfg = tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, max_position_embeddings=64)
        torch.manual_seed(0)
        with torch.device(target_device()):  # the init fills run on the device too
            model = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()
            ids = torch.randint(0, 96, (1, 8))
        with torch.no_grad():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=True, top_k=20)

    report = trace(workload)
    for name in ("isin.Tensor_Tensor", "multinomial.default", "normal_.default",
                 "uniform_.default", "random_.from"):
        assert name in report.served, name
    assert not report.not_implemented
