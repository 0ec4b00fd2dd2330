"""Data-parallel training of a small Llama with gemsops, under DDP or FSDP2.

Run by torchrun, one process per device::

    python -m torch.distributed.run --nproc-per-node 2 examples/train_ddp.py --engine ddp
    python -m torch.distributed.run --nproc-per-node 2 examples/train_ddp.py \
        --engine fsdp2 --no-gems

Each rank binds its device through :func:`gemshal.distributed.bind_local_rank` (no
vendor named here), builds the same randomly initialised ``LlamaForCausalLM`` (one
seed on every rank), wraps it in ``DistributedDataParallel`` or shards it with FSDP2
(``fully_shard`` per decoder layer, then the root), and trains ``--steps`` AdamW steps
on its own fixed random token batches. With ``--gems`` (the default) the steps run
inside ``gemsops.use_gems()``, entered after the device is chosen and the model built,
and ``gemsops.record()`` counts the calls handed back to torch and their reasons.

Every rank reports its per-step losses, the median step time after warm-up, the calls
handed back, and a parameter check: under DDP the parameters are identical on every
rank (the largest ``|p - p_rank0|``, all-reduced with max, must be 0); under FSDP2 the
gathered full parameters (``p.full_tensor()``) agree the same way. Rank 0 prints one
JSON line with every rank's report (and writes it to ``--json``). The exit status is 1
when the parameters disagree or a call was handed back for a device or stream reason.

The defaults are the issue's shapes: width 1024, 4 layers, 4 x 512 tokens per rank, in
bf16 on an accelerator (float32 on the CPU, where ``--tiny`` or the shape flags shrink it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import gemshal
import gemsops
from gemshal.distributed import bind_local_rank

# Handed-back reasons that mean a tensor was on a device (or a stream) gemsops did not
# expect: none of these may occur in a data-parallel step.
DEVICE_OR_STREAM = re.compile(r"device|stream|\b(?:cpu|cuda|xpu|npu|mlu|musa)(?::\d+)?\b", re.I)

# The CPU test's preset: on the Triton interpreter a step costs about 13 us per element
# of each pointwise op (AdamW runs ten per parameter), so the model stays this small.
SHAPE_KEYS = ("width", "layers", "heads", "vocab", "batch", "seq")
TINY = {"width": 16, "layers": 2, "heads": 1, "vocab": 32, "batch": 2, "seq": 8}


def _fully_shard() -> tuple[Callable[..., Any] | None, str]:
    """FSDP2's ``fully_shard``, or None and why this torch lacks it."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:  # torch 2.4/2.5 kept it under _composable
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError as error:
            return None, f"torch {torch.__version__} has no FSDP2 fully_shard ({error})"
    return fully_shard, ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--model", choices=("transformers", "plain"), default="transformers",
                   help="transformers' LlamaForCausalLM, or the same shape in plain torch "
                        "(no transformers needed; the CPU test's)")
    p.add_argument("--gems", action=argparse.BooleanOptionalAction, default=True,
                   help="serve aten ops with gemsops during the steps (default: on)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the median step time (default: min(5, steps // 2))")
    p.add_argument("--tiny", action="store_true",
                   help="the CPU test's preset: " + ", ".join(f"{k} {v}" for k, v in TINY.items()))
    p.add_argument("--width", type=int, default=None, help="hidden size (default 1024)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 4)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default width/64)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000)")
    p.add_argument("--batch", type=int, default=None, help="sequences per rank (default 4)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 512)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="auto: bfloat16 on an accelerator, float32 on the CPU")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write rank 0's summary here")
    args = p.parse_args(argv)
    base = TINY if args.tiny else {"width": 1024, "layers": 4, "vocab": 32000, "batch": 4,
                                   "seq": 512}  # fmt: skip
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.heads is None:
        args.heads = max(1, args.width // 64)
    if args.width % args.heads:
        p.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.warmup is None:
        args.warmup = min(5, args.steps // 2)
    return args


class _Output:
    """What the training loop reads from a forward: the loss (as transformers returns)."""

    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss


class _Block(torch.nn.Module):
    """One Llama decoder layer in plain torch: RMSNorm, causal attention with rotary
    positions (SDPA), RMSNorm, SwiGLU MLP, each with its residual."""

    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = torch.nn.RMSNorm(width, eps=1e-6)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.mlp_norm = torch.nn.RMSNorm(width, eps=1e-6)
        self.gate_up = torch.nn.Linear(width, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, -1)
        q, k, v = qkv.transpose(1, 3).unbind(2)  # each [b, heads, s, head dim]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, width))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        out: torch.Tensor = x + self.down(torch.nn.functional.silu(gate) * up)
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class _Decoder(torch.nn.Module):
    """The layers, as ``model.model.layers`` (where FSDP2 shards), and the final norm."""

    def __init__(self, width: int, heads: int, ffn: int, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(width, heads, ffn) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(width, eps=1e-6)


class PlainLlama(torch.nn.Module):
    """A Llama-shaped causal LM in plain torch (``--model plain``: no transformers), with
    the interface the loop uses: ``model(input_ids=..., labels=...).loss``."""

    def __init__(self, vocab: int, width: int, heads: int, ffn: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.model = _Decoder(width, heads, ffn, layers)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head_dim = width // heads

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> _Output:
        s = input_ids.shape[1]
        x = self.embed(input_ids)
        inv = 1.0 / 10000 ** (torch.arange(0, self.head_dim, 2, device=x.device) / self.head_dim)
        angles = torch.outer(torch.arange(s, device=x.device, dtype=inv.dtype), inv)
        angles = torch.cat((angles, angles), dim=-1).to(x.dtype)
        cos, sin = angles.cos(), angles.sin()
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.model.norm(x))
        # next-token loss, as LlamaForCausalLM computes it from labels
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1))
        return _Output(loss)


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Any:
    """The same randomly initialised Llama on every rank (built on the CPU, then moved)."""
    ffn = -(-args.width * 8 // 3 // 32) * 32  # Llama's 8/3 ratio, rounded up to 32
    if args.model == "plain":
        torch.manual_seed(args.seed)
        plain = PlainLlama(args.vocab, args.width, args.heads, ffn, args.layers)
        return plain.to(device=device, dtype=dtype).train()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.width, intermediate_size=ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, max_position_embeddings=max(args.seq, 128),
        tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).train()


def batches(args: argparse.Namespace, rank: int, device: torch.device) -> list[torch.Tensor]:
    """This rank's fixed token batches, one per step (a per-rank seed)."""
    gen = torch.Generator().manual_seed(args.seed + 1000 + rank)
    shape = (args.batch, args.seq)
    return [torch.randint(args.vocab, shape, generator=gen).to(device) for _ in range(args.steps)]


def parameter_spread(model: torch.nn.Module) -> float:
    """The largest ``|p - p_rank0|`` over every parameter element and rank.

    DTensor (FSDP2) parameters are gathered whole with ``full_tensor()`` first. Every
    rank must call this: it broadcasts and all-reduces.
    """
    worst = torch.zeros((), dtype=torch.float64)
    for param in model.parameters():
        full = param.detach()
        if hasattr(full, "full_tensor"):
            full = full.full_tensor()
        mine = full.contiguous()
        ref = mine.clone()
        dist.broadcast(ref, src=0)
        diff = (mine.double() - ref.double()).abs().max().cpu()
        worst = torch.maximum(worst, diff)
    device = next(model.parameters()).device
    total = worst.to(device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return float(total.item())


def checksum(model: torch.nn.Module) -> float:
    """The float64 sum of this rank's (local shard of the) parameters, for reading."""
    out = 0.0
    for param in model.parameters():
        local = param.detach()
        if hasattr(local, "to_local"):
            local = local.to_local()
        out += float(local.double().sum().item())
    return out


@contextmanager
def gems_block(enabled: bool) -> Iterator[gemsops.CallRecord]:
    """``use_gems()`` and ``record()`` when enabled; otherwise an empty record."""
    if not enabled:
        yield gemsops.CallRecord()
        return
    with gemsops.use_gems(), gemsops.record() as rec:
        yield rec


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fully_shard, missing = _fully_shard()
    if args.engine == "fsdp2" and fully_shard is None:
        sys.stderr.write(f"--engine fsdp2: {missing}\n")
        return 2

    setup = bind_local_rank()
    dist.init_process_group(backend=setup.backend)
    device = setup.device.torch_device
    on_cpu = device.type == "cpu"
    if args.dtype == "auto":
        dtype = torch.float32 if on_cpu else torch.bfloat16
    else:
        dtype = getattr(torch, args.dtype)
    sync = gemshal.device_module().synchronize

    model = build_model(args, device, dtype)
    wrapped: torch.nn.Module
    if args.engine == "ddp":
        ids = None if on_cpu else [device]
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    else:
        assert fully_shard is not None
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
    optim = torch.optim.AdamW(wrapped.parameters(), lr=args.lr)
    data = batches(args, setup.rank, device)

    losses: list[float] = []
    times: list[float] = []
    guard: AbstractContextManager[Any] = (
        nullcontext() if on_cpu else gemshal.device_guard(device)
    )
    with ExitStack() as stack:
        stack.enter_context(guard)
        rec = stack.enter_context(gems_block(args.gems))
        for tokens in data:
            sync()
            start = time.perf_counter()
            loss = wrapped(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
            losses.append(float(loss.detach().float().item()))

    spread = parameter_spread(model)
    handed_back = [
        {"op": op, "reason": reason, "count": count}
        for (op, reason), count in sorted(rec.fallbacks.items())
    ]
    bad = sum(h["count"] for h in handed_back if DEVICE_OR_STREAM.search(str(h["reason"])))
    timed = times[args.warmup:] or times
    report = {
        "rank": setup.rank,
        "device": str(device),
        "losses": losses,
        "median_step_s": statistics.median(timed),
        "served": sum(rec.served.values()),
        "handed_back": sum(rec.fallbacks.values()),
        "handed_back_reasons": handed_back,
        "device_or_stream_handed_back": bad,
        "param_checksum": checksum(model),
    }
    sys.stdout.write(
        f"rank {setup.rank}/{setup.world_size} on {device} ({args.engine}, "
        f"{'gemsops' if args.gems else 'torch'}): losses "
        f"{' '.join(f'{x:.5f}' for x in losses)}; median step "
        f"{report['median_step_s'] * 1e3:.1f} ms; served {report['served']}, "
        f"handed back {report['handed_back']} ({bad} for a device or stream reason)\n"
    )
    sys.stdout.flush()
    reports: list[Any] = [None] * setup.world_size
    dist.all_gather_object(reports, report)
    ok = spread == 0.0 and all(r["device_or_stream_handed_back"] == 0 for r in reports)
    if setup.rank == 0:
        summary = {
            "engine": args.engine,
            "gems": args.gems,
            "backend": setup.backend,
            "world_size": setup.world_size,
            "torch": torch.__version__,
            "dtype": str(dtype).removeprefix("torch."),
            "shape": {k: getattr(args, k) for k in SHAPE_KEYS},
            "steps": args.steps,
            "warmup": args.warmup,
            "lr": args.lr,
            "seed": args.seed,
            "median_step_s": max(r["median_step_s"] for r in reports),
            "param_spread": spread,
            "params_agree": spread == 0.0,
            "ok": ok,
            "ranks": reports,
        }
        line = json.dumps(summary, sort_keys=True)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(line + "\n")
    # Both ranks leave together: a rank tearing gloo down while the other still sends
    # hung the job after its summary (seen once in about eight CPU runs). The process
    # group is not destroyed: the script's caller leaves with os._exit (below).
    dist.barrier()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Every result is printed and both ranks have passed the last barrier. torch's gloo
    # teardown (destroy_process_group, or the destructors at interpreter exit) now and
    # then hangs or aborts ("terminate called without an active exception", seen in CI
    # in a torch-only FSDP2 run), which would turn a finished run into a failed one; so
    # the process leaves at once, its sockets closed by the OS.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
