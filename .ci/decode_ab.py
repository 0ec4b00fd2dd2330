"""Decode attention on a GPU: torch's SDPA against gemsops' with its split-KV decode path
off (the forward kernel, "old") and on ("new"), in one process.

    python3 .ci/decode_ab.py [--rounds 3] [--no-graph] [--kv-layout bhld|blhd]

Cases: B in {1, 4, 16}, Hq/Hkv in {32/8, 32/32}, Lq 1, Lk in {512, 2048, 4096, 8192},
D 128, bf16; q is a [B, Lq, Hq, D] projection seen as [B, Hq, Lq, D], K/V a
[B, Hkv, Lk, D] cache (``--kv-layout blhd``: [B, Lk, Hkv, D] memory). Each side is
``F.scaled_dot_product_attention(q, k, v, enable_gqa=...)``: torch's own call, then the
call under ``gemsops.use_gems()`` with ``decode.ENABLED`` False and True (the replay
memos cleared at each switch: a kept recipe replays what it recorded), timed by
``triton.testing.do_bench`` (median us, ``--rounds`` rounds, median of the rounds), and
by the replay of a CUDA graph holding 10 calls (us per call), unless ``--no-graph``.

One line per case: torch us, old us, new us, old/torch and new/torch ratios (the target
is new/torch <= 1.11, i.e. gemsops at 0.9x torch's speed or better), the kernels the
new side launched, and the max abs difference of each side's output from torch's.
Lines go to stdout and, when ``OUT`` is set, to ``$OUT/decode_ab.txt``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton.testing

import gemshal

gemshal.current_device()  # resolve the device before gemsops' kernel modules load

import gemsops  # noqa: E402
from gemshal.kernel import recording  # noqa: E402
from gemshal.kernel.compile import waiting  # noqa: E402
from gemsops import native  # noqa: E402
from gemsops.ops import replay  # noqa: E402
from gemsops.ops.attention import decode  # noqa: E402

GRAPH_CALLS = 10


def bench_us(fn: Callable[[], object]) -> float:
    return 1e3 * float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def graph_us(fn: Callable[[], object]) -> float | None:
    """us per call of a CUDA graph replaying GRAPH_CALLS calls (None: capture failed)."""
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
    except Exception as exc:  # a side that cannot be captured: report, go on
        print(f"  graph capture failed: {type(exc).__name__}: {exc}", flush=True)
        return None


def switch(enabled: bool) -> None:
    decode.ENABLED = enabled
    replay.clear()
    native.clear()


def case(B: int, Hq: int, Hkv: int, Lk: int, args: argparse.Namespace,
         gen: torch.Generator, dev: torch.device, dtype: torch.dtype) -> tuple[str, float]:
    """One case's line and its new/torch ratio."""
    Lq, D = 1, 128
    q = torch.randn(B, Lq, Hq, D, generator=gen).to(dev, dtype).transpose(1, 2)
    if args.kv_layout == "blhd":
        k, v = (torch.randn(B, Lk, Hkv, D, generator=gen).to(dev, dtype).transpose(1, 2)
                for _ in range(2))
    else:
        k, v = (torch.randn(B, Hkv, Lk, D, generator=gen).to(dev, dtype) for _ in range(2))
    call = functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=Hq != Hkv)
    want = call()
    sides: dict[str, list[float]] = {"torch": [], "old": [], "new": []}
    graphs: dict[str, float | None] = {}
    diffs: dict[str, float] = {}
    launched = ""
    for side in ("old", "new"):
        switch(side == "new")
        with gemsops.use_gems(), waiting():
            with recording() as rec:
                got = call()  # compiles here (waiting), on the host path
            call()
            torch.cuda.synchronize()
        diffs[side] = float((got.float() - want.float()).abs().max())
        if side == "new":
            launched = "+".join(launch[0].op for launch in rec.launches)
    for r in range(args.rounds):
        sides["torch"].append(bench_us(call))
        for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
            switch(side == "new")
            with gemsops.use_gems():
                sides[side].append(bench_us(call))
    if not args.no_graph:
        graphs["torch"] = graph_us(call)
        for side in ("old", "new"):
            switch(side == "new")
            with gemsops.use_gems():
                graphs[side] = graph_us(call)
    med = {s: statistics.median(t) for s, t in sides.items()}
    ratio_new = med["new"] / med["torch"]
    line = (f"B={B:<2} Hq/Hkv={Hq}/{Hkv:<2} Lq={Lq} Lk={Lk:<4} D={D} | "
            f"torch {med['torch']:8.2f} us  old {med['old']:8.2f} us  "
            f"new {med['new']:8.2f} us | old/torch {med['old'] / med['torch']:5.2f}"
            f"  new/torch {ratio_new:5.2f}")
    if graphs:
        parts = [f"{s} {g:.2f}" if g is not None else f"{s} n/a" for s, g in graphs.items()]
        line += " | graph us/call " + "  ".join(parts)
    line += (f" | maxdiff old {diffs['old']:.3g} new {diffs['new']:.3g}"
             f" | new launches {launched or '(none recorded)'}")
    return line, ratio_new


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--kv-layout", choices=("bhld", "blhd"), default="bhld")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    out_dir = os.environ.get("OUT")
    sink = open(os.path.join(out_dir, "decode_ab.txt"), "w") if out_dir else None  # noqa: SIM115

    def emit(line: str) -> None:
        print(line, flush=True)
        if sink is not None:
            sink.write(line + "\n")
            sink.flush()

    emit(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton "
         f"{triton.__version__} kv {args.kv_layout} GEMS_NATIVE="
         f"{os.environ.get('GEMS_NATIVE', 'auto')}")
    gen = torch.Generator().manual_seed(0)
    ratios: list[float] = []
    with waiting():  # every compile on this thread: each side is gemsops' own kernels
        for B in (1, 4, 16):
            for Hq, Hkv in ((32, 8), (32, 32)):
                for Lk in (512, 2048, 4096, 8192):
                    line, ratio = case(B, Hq, Hkv, Lk, args, gen, dev, dtype)
                    ratios.append(ratio)
                    emit(line)
                    torch.cuda.empty_cache()
    switch(True)
    emit(f"# new/torch over {len(ratios)} cases: median {statistics.median(ratios):.3f}, "
         f"max {max(ratios):.3f}; cases over 1.11 (slower than 0.9x torch): "
         f"{sum(r > 1.11 for r in ratios)}")
    if sink is not None:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
