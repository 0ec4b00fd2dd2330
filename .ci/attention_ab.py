"""Training-shape attention on a GPU: torch's SDPA (cuDNN or flash on an H200) against
gemsops', forward and forward + backward, eager and graph-replayed, in one process.

    GEMS_AUTOTUNE=1 python3 .ci/attention_ab.py [--rounds 3] [--label new] [--no-desc-ab]

Cases (issue 25's attention rows, plus the GPT-2/BERT head size): bf16, q/k/v as
[B, L, H, D] projections seen as [B, H, L, D] (what HF models hand SDPA):
4x16x2048x128 and the GQA 2x32/8x4096x128, causal and not, and 8x12x512x64 (GPT-2/BERT),
causal and not. Sides: ``torch``; ``gemsops`` (``F.scaled_dot_product_attention`` under
``use_gems()``); with ``--desc-ab`` (the default, where the tree has the switch) also
``gemsops-nodesc``, the forward's tensor descriptors off. Run it with ``PYTHONPATH`` at an
older tree (``--label old``) for a before/after pair: each run times torch beside itself.

With ``GEMS_AUTOTUNE=1`` each gemsops side benchmarks its candidate configs at the first
call of a case (inside ``waiting()``: compiles on this thread), so each side runs its
best configs; without it, the tables'.

Per case: eager median us (``triton.testing.do_bench``, median over ``--rounds``), graph
replay us per call (10 calls per graph), the ratio torch / side (above 1: gemsops faster;
issue 25 asks >= 0.9 forward and >= 0.85 forward + backward), TFLOP/s, and the max abs
differences of output and gradients from torch's. Lines go to stdout and, with ``OUT``
set, to ``$OUT/attention_ab-<label>.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.testing

import gemshal

gemshal.current_device()

import gemsops  # noqa: E402
from gemshal.kernel.compile import waiting  # noqa: E402
from gemsops import native  # noqa: E402
from gemsops.ops import replay  # noqa: E402
from gemsops.ops.attention import sdpa  # noqa: E402

GRAPH_CALLS = 10
CASES = [  # B, Hq, Hkv, L, D, causal
    (4, 16, 16, 2048, 128, True), (4, 16, 16, 2048, 128, False),
    (2, 32, 8, 4096, 128, True), (2, 32, 8, 4096, 128, False),
    (8, 12, 12, 512, 64, True), (8, 12, 12, 512, 64, False),
]


SMOKE = [False]  # --smoke: tiny cases on the CPU interpreter, wall-clock timing


def bench_us(fn: Callable[[], object]) -> float:
    if SMOKE[0]:
        import time

        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return 1e3 * float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_us(fn: Callable[[], object]) -> float | None:
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
        return bench_us(graph.replay) / GRAPH_CALLS
    except Exception as exc:
        print(f"  graph capture failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return None


def set_desc(on: bool) -> None:
    if hasattr(sdpa, "DESCRIPTORS"):
        sdpa.DESCRIPTORS[0] = on
    replay.clear()
    native.clear()


def run_case(spec: tuple[int, ...], sides: list[str], rounds: int, graphs: bool,
             gen: torch.Generator) -> list[dict[str, Any]]:
    B, Hq, Hkv, L, D, causal = spec
    dev, dt = gemshal.current_device().torch_device, torch.bfloat16
    q = torch.randn(B, L, Hq, D, generator=gen).to(dev, dt).transpose(1, 2).requires_grad_()
    k = torch.randn(B, L, Hkv, D, generator=gen).to(dev, dt).transpose(1, 2).requires_grad_()
    v = torch.randn(B, L, Hkv, D, generator=gen).to(dev, dt).transpose(1, 2).requires_grad_()
    go = torch.randn(B, Hq, L, D, generator=gen).to(dev, dt)
    gqa = Hq != Hkv

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def both() -> tuple[torch.Tensor, ...]:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        return (o, *torch.autograd.grad(o, (q, k, v), go))

    flops = 4 * B * Hq * L * L * D // (2 if causal else 1)
    want = [t.float() for t in both()]
    rows = []
    for what, fn, work in (("fwd", fwd, flops), ("fwd+bwd", both, flops * 7 // 2)):
        times: dict[str, list[float]] = {s: [] for s in sides}
        graph: dict[str, float | None] = {}
        diffs: dict[str, float] = {}
        for side in sides:
            if side == "torch":
                continue
            set_desc(side != "gemsops-nodesc")
            with gemsops.use_gems(), waiting():
                got = both() if what == "fwd+bwd" else (fwd(),)
                fn()
            if not SMOKE[0]:
                torch.cuda.synchronize()
            pairs = zip(got, want, strict=False)  # a forward-only side: the output alone
            diffs[side] = max(float((g.float() - w).abs().max()) for g, w in pairs)
        for r in range(rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                if side == "torch":
                    times[side].append(bench_us(fn))
                    continue
                set_desc(side != "gemsops-nodesc")
                with gemsops.use_gems():
                    times[side].append(bench_us(fn))
        if graphs:
            for side in sides:
                if side == "torch":
                    graph[side] = graph_us(fn)
                    continue
                set_desc(side != "gemsops-nodesc")
                with gemsops.use_gems():
                    graph[side] = graph_us(fn)
        med = {s: statistics.median(t) for s, t in times.items()}
        row = {"case": f"{B}x{Hq}/{Hkv}x{L}x{D}{' causal' if causal else ''} {what}",
               "eager_us": {s: round(t, 2) for s, t in med.items()},
               "graph_us": {s: (None if g is None else round(g, 2)) for s, g in graph.items()},
               "x_torch": {s: round(med["torch"] / t, 3) for s, t in med.items() if s != "torch"},
               "tflops": {s: round(work / t / 1e6, 1) for s, t in med.items()},
               "maxdiff": {s: round(d, 4) for s, d in diffs.items()}}
        g = row["graph_us"]
        if g.get("torch"):
            row["graph_x_torch"] = {s: round(g["torch"] / t, 3) for s, t in g.items()
                                    if s != "torch" and t}
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--label", default="new")
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--no-desc-ab", action="store_true")
    p.add_argument("--smoke", action="store_true",
                   help="tiny cases, one round, no graphs: the harness on the CPU interpreter")
    args = p.parse_args(argv)
    cases = CASES
    if args.smoke:
        SMOKE[0] = True
        args.rounds, args.no_graph = 1, True
        cases = [(1, 2, 1, 40, 16, True), (1, 2, 2, 24, 16, False)]
    sides = ["torch", "gemsops"]
    if hasattr(sdpa, "DESCRIPTORS") and not args.no_desc_ab:
        sides.append("gemsops-nodesc")
    out_dir = os.environ.get("OUT")
    sink = (open(os.path.join(out_dir, f"attention_ab-{args.label}.txt"), "w")  # noqa: SIM115
            if out_dir else None)

    def emit(line: str) -> None:
        print(line, flush=True)
        if sink is not None:
            sink.write(line + "\n")
            sink.flush()

    name = "cpu" if args.smoke else torch.cuda.get_device_name()
    emit(f"# {args.label}: {name} torch {torch.__version__} triton "
         f"{triton.__version__} GEMS_AUTOTUNE={os.environ.get('GEMS_AUTOTUNE', '')} "
         f"sides {','.join(sides)}")
    gen = torch.Generator().manual_seed(0)
    import json

    for spec in cases:
        try:
            for row in run_case(spec, sides, args.rounds, not args.no_graph, gen):
                emit(json.dumps(row))
        except Exception as exc:  # one failing case must not hide the others
            emit(f"# {spec}: {type(exc).__name__}: {str(exc)[:300]}")
        if not args.smoke:
            torch.cuda.empty_cache()
    from gemshal.kernel import decorator

    # The configs runtime tuning chose (GEMS_AUTOTUNE=1): rows for the sm90 tables.
    for c in getattr(decorator, "choices", list)():
        if "attention" in c["op"] or "attention" in c["kernel"]:
            emit("# choice " + json.dumps(c, default=str))
    if sink is not None:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
