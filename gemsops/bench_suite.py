"""``gemsops bench --suite models``: the ops of real model configs, at their shapes.

The kernel rows of ``gemsops bench`` sit at large bench shapes; a kernel tuned there can
fall off at the shapes a model runs. This suite takes the layers of five public configs
(Llama 3.2 1B, Llama 3.1 8B, GPT-2 small, BERT-base, ViT-B/16) at typical training
batches (6k-16k tokens) and Llama decode (batch 1 and 16 against a 4096-token cache), and
times each op forward and forward + backward on every side (torch, gemsops, FlagGems when
installed), in two ways side by side:

- **eager**: the torch call as a user makes it, host time included
  (``triton.testing.do_bench`` median);
- **kernel**: the same call captured once in a device graph and replayed (the host's
  part gone), so a case reads as kernel-bound or host-bound. Where a side's call cannot
  be captured the row says why and has no kernel time.

Each gemsops side is warmed up and its background compiles waited for before it is
timed, so no part of it is handed to torch while a kernel compiles. Without a device
graph (the Triton interpreter) the suite runs shrunken shapes that only prove the
harness, eager only.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch.nn import functional as F

from gemshal.kernel.compile import wait_compiles, waiting
from gemsops.bench_cases import BenchCase, Thunk, _nbytes
from gemsops.bench_model import capture, graph_skip_reason
from gemsops.bench_sides import flag_gems, sides_of, timer_for

__all__ = ["CONFIGS", "ModelShape", "measure_suite", "suite_cases", "suite_lines"]


@attrs.frozen
class ModelShape:
    """The layer shapes of one model config, and the batch it is measured at."""

    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    norm: str  # "rms_norm" or "layer_norm"
    act: str  # "swiglu", "gelu" or "gelu_tanh"
    causal: bool
    batch: int
    seq: int
    decode: bool = False  # also measured at decode (batch 1 and 16, a 4096-token cache)
    images: bool = False  # classifies whole inputs (ViT): the loss has a row per image

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


CONFIGS = (
    # Llama 3.2 1B: 16 layers of width 2048, 32 heads over 8 KV heads of 64, SwiGLU 8192.
    ModelShape("llama-1b", 2048, 8192, 32, 8, 128256, "rms_norm", "swiglu", True, 4, 2048,
               decode=True),
    # Llama 3.1 8B: width 4096, 32 heads over 8 KV heads of 128, SwiGLU 14336.
    ModelShape("llama-8b", 4096, 14336, 32, 8, 128256, "rms_norm", "swiglu", True, 2, 2048,
               decode=True),
    ModelShape("gpt2", 768, 3072, 12, 12, 50257, "layer_norm", "gelu_tanh", True, 8, 1024),
    ModelShape("bert-base", 768, 3072, 12, 12, 30522, "layer_norm", "gelu", False, 16, 512),
    # ViT-B/16 at 224 pixels: 197 tokens per image (196 patches and the class token).
    ModelShape("vit-b16", 768, 3072, 12, 12, 1000, "layer_norm", "gelu", False, 32, 197,
               images=True),
)

_TINY = (
    ModelShape("tiny-llama", 64, 128, 2, 1, 96, "rms_norm", "swiglu", True, 1, 16, decode=True),
    ModelShape("tiny-bert", 64, 128, 2, 2, 96, "layer_norm", "gelu", False, 2, 8),
)
_CACHE = 4096
_TINY_CACHE = 32


def _grad_case(op: str, label: str, dtype: torch.dtype, build: Callable[[torch.device], Any],
               nbytes: int = 0, flops: int = 0) -> BenchCase:
    """A forward + backward case: ``build(dev)`` gives (output, inputs needing gradients);
    each call recomputes the forward and takes the gradients of a fixed upstream."""

    def make(dev: torch.device) -> Thunk:
        forward, leaves = build(dev)
        upstream = torch.randn_like(forward())
        return lambda: torch.autograd.grad(forward(), leaves, upstream)

    return BenchCase(op, label, dtype, make, bytes=nbytes, flops=flops)


def _norm_cases(m: ModelShape, t: int, dt: torch.dtype) -> list[BenchCase]:
    h = m.hidden

    def build(dev: torch.device, grad: bool) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        x = torch.randn(t, h, device=dev, dtype=dt, requires_grad=grad)
        w = torch.randn(h, device=dev, dtype=dt, requires_grad=grad)
        if m.norm == "layer_norm":
            b = torch.randn(h, device=dev, dtype=dt, requires_grad=grad)
            return lambda: F.layer_norm(x, (h,), w, b, 1e-5), (x, w, b)
        return lambda: F.rms_norm(x, (h,), w, 1e-6), (x, w)

    def forward(dev: torch.device) -> Thunk:
        return build(dev, False)[0]

    return [
        BenchCase(m.norm, f"{m.name} {m.norm} {t}x{h}", dt, forward,
                  bytes=_nbytes(dt, 2 * t * h)),
        _grad_case(m.norm, f"{m.name} {m.norm} fwd+bwd {t}x{h}", dt,
                   lambda dev: build(dev, True), nbytes=_nbytes(dt, 5 * t * h)),
    ]


def _linear_case(m: ModelShape, what: str, t: int, n: int, k: int, dt: torch.dtype,
                 grad: bool) -> BenchCase:
    label = f"{m.name} linear {what} {t}x{n}x{k}{' fwd+bwd' if grad else ''}"

    def build(dev: torch.device) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        x = torch.randn(t, k, device=dev, dtype=dt, requires_grad=grad)
        w = (torch.randn(n, k, device=dev, dtype=dt) / math.sqrt(k)).requires_grad_(grad)
        return lambda: F.linear(x, w), (x, w)

    if grad:
        return _grad_case("linear", label, dt, build, flops=6 * t * n * k)
    return BenchCase("linear", label, dt, lambda dev: build(dev)[0], flops=2 * t * n * k)


def _act_cases(m: ModelShape, t: int, dt: torch.dtype) -> list[BenchCase]:
    f = m.ffn

    def build(dev: torch.device, grad: bool) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        if m.act == "swiglu":
            g = torch.randn(t, f, device=dev, dtype=dt, requires_grad=grad)
            u = torch.randn(t, f, device=dev, dtype=dt, requires_grad=grad)
            return lambda: F.silu(g) * u, (g, u)
        x = torch.randn(t, f, device=dev, dtype=dt, requires_grad=grad)
        tanh = "tanh" if m.act == "gelu_tanh" else "none"
        return lambda: F.gelu(x, approximate=tanh), (x,)

    reads = 2 if m.act == "swiglu" else 1
    return [
        BenchCase(m.act, f"{m.name} {m.act} {t}x{f}", dt, lambda dev: build(dev, False)[0],
                  bytes=_nbytes(dt, (reads + 1) * t * f)),
        _grad_case(m.act, f"{m.name} {m.act} fwd+bwd {t}x{f}", dt,
                   lambda dev: build(dev, True), nbytes=_nbytes(dt, (3 * reads + 2) * t * f)),
    ]


def _attention_case(m: ModelShape, b: int, lq: int, lk: int, dt: torch.dtype, causal: bool,
                    grad: bool) -> BenchCase:
    hq, hkv, d = m.heads, m.kv_heads, m.head_dim
    heads = f"{hq}" if hq == hkv else f"{hq}/{hkv}"
    kind = f"sdpa{' causal' if causal else ''}{' fwd+bwd' if grad else ''}"
    label = f"{m.name} {kind} {b}x{heads}x{lq}x{lk}x{d}"
    fwd = 4 * b * hq * lq * lk * d // (2 if causal else 1)

    def build(dev: torch.device) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        q = torch.randn(b, hq, lq, d, device=dev, dtype=dt, requires_grad=grad)
        k = torch.randn(b, hkv, lk, d, device=dev, dtype=dt, requires_grad=grad)
        v = torch.randn(b, hkv, lk, d, device=dev, dtype=dt, requires_grad=grad)
        gqa = hq != hkv
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                       enable_gqa=gqa)), (q, k, v)

    if grad:
        return _grad_case("attention", label, dt, build, flops=fwd * 7 // 2)
    return BenchCase("attention", label, dt, lambda dev: build(dev)[0], flops=fwd)


def _loss_and_embedding(m: ModelShape, t: int, dt: torch.dtype) -> list[BenchCase]:
    v, h = m.vocab, m.hidden
    rows = m.batch if m.images else t

    def loss(dev: torch.device) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        x = torch.randn(rows, v, device=dev, dtype=dt, requires_grad=True)
        target = torch.randint(0, v, (rows,), device=dev)
        return lambda: F.cross_entropy(x, target), (x,)

    def embed(dev: torch.device) -> tuple[Callable[[], Any], tuple[Any, ...]]:
        w = torch.randn(v, h, device=dev, dtype=dt, requires_grad=True)
        idx = torch.randint(0, v, (t,), device=dev)
        return lambda: F.embedding(idx, w), (w,)

    out = [_grad_case("cross_entropy", f"{m.name} cross_entropy fwd+bwd {rows}x{v}", dt, loss,
                      nbytes=_nbytes(dt, 2 * rows * v))]
    if not m.images:  # ViT embeds patches with a convolution, not a table
        out.append(_grad_case("embedding", f"{m.name} embedding fwd+bwd {t}x{h} of {v}", dt,
                              embed, nbytes=_nbytes(dt, 3 * t * h)))
    return out


def _training(m: ModelShape, dt: torch.dtype) -> list[BenchCase]:
    t, h, f = m.batch * m.seq, m.hidden, m.ffn
    qkv = h + 2 * m.kv_heads * m.head_dim
    up = 2 * f if m.act == "swiglu" else f  # gate and up side by side for SwiGLU
    return [
        *_norm_cases(m, t, dt),
        _linear_case(m, "qkv", t, qkv, h, dt, False),
        _linear_case(m, "out", t, h, h, dt, False),
        _linear_case(m, "up", t, up, h, dt, False),
        _linear_case(m, "down", t, h, f, dt, False),
        _linear_case(m, "up", t, up, h, dt, True),
        _linear_case(m, "down", t, h, f, dt, True),
        *_act_cases(m, t, dt),
        _attention_case(m, m.batch, m.seq, m.seq, dt, m.causal, False),
        _attention_case(m, m.batch, m.seq, m.seq, dt, m.causal, True),
        *_head(m, t, dt),
        *_loss_and_embedding(m, t, dt),
    ]


def _head(m: ModelShape, t: int, dt: torch.dtype) -> list[BenchCase]:
    """The language-model head (hidden -> vocabulary) of a text model, forward + backward:
    the largest product of a GPT-2 or BERT step, and one whose output rows are not
    16-byte aligned there (50257 and 30522 columns). ViT's head (32 images to 1000
    classes) is left out: a few microseconds."""
    if m.images:
        return []
    return [_linear_case(m, "head", t, m.vocab, m.hidden, dt, True)]


def _decode(m: ModelShape, dt: torch.dtype, cache: int, batches: tuple[int, ...]
            ) -> list[BenchCase]:
    h, f = m.hidden, m.ffn
    qkv = h + 2 * m.kv_heads * m.head_dim
    out: list[BenchCase] = []
    for b in batches:
        out += [
            attrs.evolve(_norm_cases(m, b, dt)[0], label=f"{m.name} decode {m.norm} {b}x{h}"),
            _linear_case(m, "decode qkv", b, qkv, h, dt, False),
            _linear_case(m, "decode up", b, 2 * f, h, dt, False),
            _linear_case(m, "decode down", b, h, f, dt, False),
            _linear_case(m, "decode head", b, m.vocab, h, dt, False),
        ]
        attention = _attention_case(m, b, 1, cache, dt, False, False)
        out.append(attrs.evolve(attention, label=attention.label.replace(
            f"{m.name} ", f"{m.name} decode ", 1)))
    return out


def suite_cases(*, tiny: bool) -> list[BenchCase]:
    """Every case of the model-shape suite (``tiny``: shrunken shapes for the interpreter)."""
    dt = torch.float32 if tiny else torch.bfloat16
    configs = _TINY if tiny else CONFIGS
    cache, batches = (_TINY_CACHE, (1, 2)) if tiny else (_CACHE, (1, 16))
    out: list[BenchCase] = []
    for m in configs:
        out += _training(m, dt)
        if m.decode:
            out += _decode(m, dt, cache, batches)
    return out


def _warm(fn: Thunk, side: str) -> None:
    """Warm ``fn`` up so that its timed calls run the side's own kernels. A gemsops call can
    need several compile rounds (cross_entropy's forward, its reduction and its
    backward each wait for the one before), and a call that meets a background compile
    hands that op to torch; inside ``waiting()`` every compile runs on this thread, so
    one call compiles them all."""
    if side == "torch":
        fn()
        return
    wait_compiles()
    with waiting():
        fn()
    fn()


def measure_suite(selected: list[BenchCase], *, dev: torch.device, interpreter: bool,
                  on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None
                  ) -> list[dict[str, Any]]:
    """Time every case on every side, eager and (where a device graph can be captured)
    replayed; ``on_row(rows)`` after each case, so a run cut short keeps what it did."""
    timer = timer_for(interpreter)
    sides = sides_of(flag_gems())
    no_graph = graph_skip_reason()
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(selected):
        sys.stderr.write(f"\r[{i + 1}/{len(selected)}] {case.label[:60]:<60}")
        sys.stderr.flush()
        fn = case.make(dev)
        row: dict[str, Any] = {"op": case.op, "case": case.label, "dtype": str(case.dtype)[6:]}
        for side, context in sides.items():
            with context():
                _warm(fn, side)
                row[f"{side}_eager_ms"] = timer(fn)
                if no_graph is not None:
                    continue
                try:
                    graph, keep = capture(fn)
                except Exception as exc:  # a call that cannot be captured: say which
                    row[f"{side}_graph_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                    continue
                row[f"{side}_kernel_ms"] = timer(graph.replay)
                del graph, keep
        for mode in ("eager", "kernel"):
            if f"gemsops_{mode}_ms" in row and f"torch_{mode}_ms" in row:
                row[f"{mode}_vs_torch"] = row[f"torch_{mode}_ms"] / row[f"gemsops_{mode}_ms"]
            if f"gemsops_{mode}_ms" in row and f"flag_gems_{mode}_ms" in row:
                row[f"{mode}_vs_flag_gems"] = (row[f"flag_gems_{mode}_ms"]
                                               / row[f"gemsops_{mode}_ms"])
        rows.append(row)
        on_row(rows)
        del fn
    sys.stderr.write("\n")
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def suite_lines(rows: list[dict[str, Any]], graph_skipped: str | None = None) -> list[str]:
    """The suite's table and its summary: geomeans over the cases, the cases below 0.9x
    (``graph_skipped``: why no kernel time was measured)."""

    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.4f}" if key in row else "-"

    head = (f"{'case':<52} {'eager torch':>11} {'gems':>8} {'x':>5} "
            f"{'kernel torch':>12} {'gems':>8} {'x':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ex = f"{r['eager_vs_torch']:.2f}" if "eager_vs_torch" in r else "-"
        kx = f"{r['kernel_vs_torch']:.2f}" if "kernel_vs_torch" in r else "-"
        lines.append(f"{r['case']:<52} {ms(r, 'torch_eager_ms'):>11} "
                     f"{ms(r, 'gemsops_eager_ms'):>8} {ex:>5} {ms(r, 'torch_kernel_ms'):>12} "
                     f"{ms(r, 'gemsops_kernel_ms'):>8} {kx:>5}")
        errors = [f"{k.removesuffix('_graph_error')}: {v}" for k, v in r.items()
                  if k.endswith("_graph_error")]
        if errors:
            lines.append(f"    no graph replay: {'; '.join(errors)}")
    if graph_skipped:
        lines.append(f"kernel time: not measured ({graph_skipped})")
    for mode in ("kernel", "eager"):
        ratios = [r[f"{mode}_vs_torch"] for r in rows if f"{mode}_vs_torch" in r]
        if not ratios:
            continue
        slow = [r["case"] for r in rows if r.get(f"{mode}_vs_torch", 1.0) < 0.9]
        lines.append(f"{mode} time: geomean {_geomean(ratios):.3f}x torch over {len(ratios)} "
                     f"cases; below 0.9x: {len(slow)}" + (f" ({', '.join(slow)})" if slow else ""))
        fg = [r[f"{mode}_vs_flag_gems"] for r in rows if f"{mode}_vs_flag_gems" in r]
        if fg:
            lines.append(f"{mode} time: geomean {_geomean(fg):.3f}x FlagGems over {len(fg)} cases")
    return lines
