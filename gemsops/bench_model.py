"""The model case of ``gemsops bench``: a small Llama-style training step, end to end.

The model is plain torch (token embedding; per layer RMSNorm through ``F.rms_norm``,
causal attention as matmul, mask and softmax, a SwiGLU MLP with SiLU; a final RMSNorm,
the LM head and cross-entropy). One process, one model, the same tokens for every
side: torch's own kernels, gemsops (inside ``use_gems()``) and FlagGems (inside
``flag_gems.use_gems()``) when it is installed. Each side is warmed up first (gemsops'
first steps compile and tune its kernels); a time is the median wall-clock time of
repeated calls, each between two device synchronizes. It measures:

- the eager training step: forward and backward, gradients reset each step;
- the eager forward alone, and the forward replayed from a device graph captured per
  side (the device module's ``graph``; warm-up on a side stream, then capture, both inside the
  side's context so gemsops' kernels are tuned before capture). Capture needs the
  device module's ``CUDAGraph``; elsewhere (the Triton interpreter) it is skipped with
  the reason;
- each side's loss and largest gradient difference against torch's, and the graph
  replay's loss against torch's eager loss, so speed never hides a wrong result.

Times are in ms; ``SIDE_over_torch`` is that side's time over torch's (below 1 is faster).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn
from torch.nn import functional as F

import gemshal
from gemsops import registry
from gemsops.bench_sides import flag_gems, sides_of

__all__ = [
    "GPU_CONFIG",
    "TINY_CONFIG",
    "Llama",
    "ModelConfig",
    "capture",
    "graph_skip_reason",
    "measure_model",
    "model_lines",
    "run_once",
]


@attrs.frozen
class ModelConfig:
    """Model sizes, dtype, and how many calls warm up and are timed."""

    batch: int
    seq: int
    dim: int
    layers: int
    heads: int
    hidden: int
    vocab: int
    dtype: torch.dtype
    warmup: int = 3
    steps: int = 10


GPU_CONFIG = ModelConfig(
    batch=4, seq=512, dim=1024, layers=4, heads=8, hidden=2816, vocab=32000, dtype=torch.bfloat16
)
# Seconds on the Triton interpreter: each gemsops kernel launch is interpreted on the CPU.
TINY_CONFIG = ModelConfig(
    batch=2, seq=8, dim=32, layers=1, heads=2, hidden=64, vocab=64, dtype=torch.float32,
    warmup=1, steps=2,
)  # fmt: skip


class _Layer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(cfg.dim))
        self.gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        h = F.rms_norm(x, (dim,), self.attn_norm, 1e-6)
        q, k, v = (
            t.reshape(batch, seq, self.heads, -1).transpose(1, 2)
            for t in self.qkv(h).chunk(3, dim=-1)
        )
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(masked[:seq, :seq], float("-inf"))
        attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.out(attn)
        h = F.rms_norm(x, (dim,), self.mlp_norm, 1e-6)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


class Llama(nn.Module):
    """A Llama-style decoder (no rotary embedding) returning the mean next-token loss."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        causal = torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).tril()
        self.register_buffer("masked", ~causal, persistent=False)
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the logits at each position against ``targets``."""
        masked: torch.Tensor = self.masked  # type: ignore[assignment]  # a registered buffer
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, masked)
        x = F.rms_norm(x, (x.shape[-1],), self.norm, 1e-6)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def graph_skip_reason() -> str | None:
    """Why device-graph capture cannot run here, or None when it can."""
    dev = gemshal.current_device()
    if dev.interpreter:
        return "the Triton interpreter runs kernels on the CPU: there is no device graph"
    if not hasattr(gemshal.device_module(), "CUDAGraph"):
        return f"torch.{dev.vendor.device_module_name} has no CUDAGraph to capture with"
    return None


def _timed(fn: Callable[[], Any], warmup: int, steps: int) -> tuple[float, Any]:
    """Median ms of ``steps`` calls after ``warmup`` calls, and the last call's result."""
    sync = gemshal.device_module().synchronize
    out = None
    for _ in range(warmup):
        out = fn()
    samples = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), out


def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, then capture it in a device graph; the graph and
    its static output."""
    module = gemshal.device_module()
    stream = module.Stream()
    stream.wait_stream(module.current_stream())
    with module.stream(stream):
        for _ in range(3):
            fn()
    module.current_stream().wait_stream(stream)
    graph = module.CUDAGraph()
    with module.graph(graph):
        out = fn()
    return graph, out


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _timing(ms: dict[str, float]) -> dict[str, float]:
    out = {f"{side}_ms": t for side, t in ms.items()}
    out.update({f"{side}_over_torch": t / ms["torch"] for side, t in ms.items() if side != "torch"})
    return out


def run_once(cfg: ModelConfig) -> float:
    """One training step of the model case on the current side (``gemsops tune`` runs it
    under ``use_gems()``); its loss."""
    dev = gemshal.current_device().torch_device
    torch.manual_seed(0)
    model = Llama(cfg).to(device=dev, dtype=cfg.dtype)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device=dev)
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device=dev)
    loss: torch.Tensor = model(tokens, targets)
    loss.backward()  # type: ignore[no-untyped-call]
    return float(loss.detach())


def measure_model(cfg: ModelConfig) -> dict[str, Any]:
    """Time and check the model case on every side; a JSON-ready dict (see the module doc)."""
    dev = gemshal.current_device().torch_device
    torch.manual_seed(0)
    model = Llama(cfg).to(device=dev, dtype=cfg.dtype)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device=dev)
    targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), device=dev)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss: torch.Tensor = model(tokens, targets)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss.detach()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model(tokens, targets)
            return out

    sides = sides_of(flag_gems())
    step_ms: dict[str, float] = {}
    forward_ms: dict[str, float] = {}
    loss: dict[str, float] = {}
    grads: dict[str, list[torch.Tensor]] = {}
    rec_gems = registry.CallRecord()
    for side, context in sides.items():
        with context(), registry.record() as rec:
            step_ms[side], last = _timed(step, cfg.warmup, cfg.steps)
            loss[side] = float(last)
            grads[side] = [p.grad.detach().clone() for p in params if p.grad is not None]
            forward_ms[side], _ = _timed(forward, cfg.warmup, cfg.steps)
        if side == "gemsops":
            rec_gems = rec
    result: dict[str, Any] = {
        "config": {k: str(v)[6:] if k == "dtype" else v for k, v in attrs.asdict(cfg).items()},
        "eager_step": _timing(step_ms),
        "eager_forward": _timing(forward_ms),
        "loss": loss,
        "loss_diff": {s: abs(loss[s] - loss["torch"]) for s in sides if s != "torch"},
        "gemsops_served": sorted(rec_gems.served),
        "gemsops_fallbacks": rec_gems.fallback_ops(),
        "max_grad": max(float(g.abs().max()) for g in grads["torch"]),
        "max_grad_diff": {s: _max_diff(grads[s], grads["torch"]) for s in sides if s != "torch"},
    }
    del grads
    reason = graph_skip_reason()
    graph: dict[str, Any] = {"skipped": reason}
    if reason is None:
        replay_ms: dict[str, float] = {}
        for side, context in sides.items():
            try:
                with context():
                    captured, static_loss = capture(forward)
            except RuntimeError as exc:  # reported per side, as a failed capture
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                graph[f"{side}_error"] = f"{type(exc).__name__}: {first}"
                continue
            replay_ms[side], _ = _timed(captured.replay, cfg.warmup, cfg.steps)
            graph[f"{side}_loss_diff"] = abs(float(static_loss) - loss["torch"])
            del captured, static_loss
        if "torch" in replay_ms:
            graph.update(_timing(replay_ms))
        else:
            graph.update({f"{s}_ms": t for s, t in replay_ms.items()})
    result["graph_forward"] = graph
    return result


def _by_side(entry: dict[str, Any], suffix: str) -> list[tuple[str, Any]]:
    """(side, value) for each ``SIDE{suffix}`` key of ``entry``."""
    return [(k[: -len(suffix)], v) for k, v in entry.items() if k.endswith(suffix)]


def _times(entry: dict[str, Any]) -> str:
    parts = []
    for side, ms in _by_side(entry, "_ms"):
        ratio = entry.get(f"{side}_over_torch")
        text = f"{side} {ms:.3g} ms" if ms < 100 else f"{side} {ms:.0f} ms"
        parts.append(text + (f" ({ratio:.2f}x torch's time)" if ratio else ""))
    return ", ".join(parts)


def model_lines(result: dict[str, Any]) -> list[str]:
    """The model case's result as printable lines (also from a saved JSON)."""
    c = result["config"]
    lines = [
        f"model: {c['layers']} layer(s), width {c['dim']}, {c['heads']} heads, hidden "
        f"{c['hidden']}, vocab {c['vocab']}, batch {c['batch']} x seq {c['seq']}, {c['dtype']}; "
        f"median of {c['steps']} after {c['warmup']} warm-up",
        f"model eager step: {_times(result['eager_step'])}",
        f"model eager forward: {_times(result['eager_forward'])}",
    ]
    graph = result["graph_forward"]
    if graph.get("skipped"):
        lines.append(f"model graph forward: skipped ({graph['skipped']})")
    else:
        errors = [f"{side} failed: {err}" for side, err in _by_side(graph, "_error")]
        lines.append("model graph forward: " + "; ".join(filter(None, [_times(graph), *errors])))
    checks = [f"loss torch {result['loss']['torch']:.6g}"]
    for side, diff in result["loss_diff"].items():
        checks.append(
            f"{side} |loss diff| {diff:.3g}, max |grad diff| {result['max_grad_diff'][side]:.3g}"
        )
    replays = [f"{side} {diff:.3g}" for side, diff in _by_side(graph, "_loss_diff")]
    lines.append(f"model check: {'; '.join(checks)} (largest |grad| {result['max_grad']:.3g})")
    back = result["gemsops_fallbacks"]
    lines.append(
        f"model ops served by gemsops: {len(result['gemsops_served'])} aten overloads; "
        f"handed back to torch: {', '.join(sorted(back)) or 'none'}"
    )
    if replays:
        lines.append(f"model graph replay |loss diff| against eager torch: {', '.join(replays)}")
    return lines
