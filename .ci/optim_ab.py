"""The AdamW step over the width-2048 Llama's parameters (75 tensors, 508M, bf16), torch's
foreach and fused kernels against gemsops' under several tile layouts, in one process.

    python3 .ci/optim_ab.py [--warps 4] [--layouts 2048x8192,2048x2048] [--rounds 5]
        [--json out.json]

The parameters, gradients and optimizer states are made once; each side is a fresh
``torch.optim.AdamW`` over clones of them (the same values on every side), warmed up
(three steps, so every kernel is compiled and every table kept) and timed with CUDA
events around single steps: per round ``--iters`` steps, the median reported, rounds
interleaving the sides so a clock drift hits every side alike. ``default`` is gemsops'
own layout (``tables.layout``: 2048-element steps, fused 8192-element tiles, foreach one
step per program); an ``NxM`` layout is ``tables.set_layout(N, M)`` for both kinds.
``--warps`` writes a tuning file giving the three optimizer kernels that ``num_warps``
and points ``GEMS_TUNE_CONFIG`` at it before gemsops is imported (0: the shipped
entries). The step is GPU-bound (milliseconds of memory traffic, a handful of launches),
so the eager step time is the kernel time to within the launches' host time, which
CUDA events cannot see past: the profiler-free number is what a user waits.
The ``GB/s`` column counts 7 bytes of bf16 per parameter (p, g, m, v read; p, m, v
written), the fused kernels' traffic; the foreach chain moves about 42.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any


def _tuning_file(warps: int) -> str:
    text = "".join(f"[ops.{op}]\nconfigs = [{{ num_warps = {warps} }}]\n\n"
                   for op in ("foreach", "fused_adam", "fused_sgd"))
    fd, path = tempfile.mkstemp(suffix=".toml", prefix="optim-ab-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warps", type=int, default=0)
    parser.add_argument("--layouts", default="default,2048x2048,2048x8192,1024x4096,4096x16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", default="")
    ns = parser.parse_args(argv)
    if ns.warps:
        os.environ["GEMS_TUNE_CONFIG"] = _tuning_file(ns.warps)

    import torch

    import gemshal
    import gemsops
    from gemsops.bench_cases import _llama_508m_shapes
    from gemsops.ops.optim import tables

    dev = gemshal.current_device().torch_device
    shapes = _llama_508m_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    gen = torch.Generator(device=dev).manual_seed(0)
    base = [torch.randn(s, device=dev, dtype=torch.bfloat16, generator=gen) for s in shapes]
    grads = [torch.randn_like(p) for p in base]

    def make(fused: bool) -> Callable[[], Any]:
        params = [torch.nn.Parameter(p.clone()) for p in base]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=not fused,
                                fused=fused)
        return opt.step

    layouts = [s.strip() for s in ns.layouts.split(",") if s.strip()]

    def use(layout: str) -> None:
        if layout == "default":
            tables.reset_layout()
        else:
            block, tile = (int(v) for v in layout.split("x"))
            tables.set_layout(block, tile)

    sides: dict[str, tuple[str | None, Callable[[], Any]]] = {}
    for fused in (False, True):
        kind = "fused" if fused else "foreach"
        sides[f"torch {kind}"] = (None, make(fused))
        for layout in layouts:
            sides[f"gemsops {kind} {layout}"] = (layout, make(fused))

    def step(name: str) -> None:
        layout, fn = sides[name]
        if layout is None:
            fn()
            return
        use(layout)
        with gemsops.use_gems():
            fn()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name in sides:  # warm-up: compiles, tables, torch's lazy state
        for _ in range(3):
            step(name)
    torch.cuda.synchronize()
    for name, (layout, fn) in sides.items():  # what each gemsops side serves
        if layout is not None:
            use(layout)
            with gemsops.use_gems(), gemsops.record() as rec:
                fn()
            print(f"{name}: served {sum(rec.served.values())} calls "
                  f"({', '.join(sorted(rec.served))}); handed back {dict(rec.fallbacks)}")
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(ns.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            layout, fn = sides[name]
            if layout is not None:
                use(layout)
            # use_gems() is entered once per side and round, outside the timed steps:
            # entering it registers every kernel (tens of ms, not a step's cost).
            with gemsops.use_gems() if layout is not None else contextlib.nullcontext():
                for _ in range(ns.iters):
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end))
    print(f"AdamW step over {len(shapes)} tensors, {numel / 1e6:.0f}M bf16 parameters on "
          f"{torch.cuda.get_device_name()}; warps {ns.warps or 'shipped'}; medians of "
          f"{ns.rounds}x{ns.iters} steps")
    print(f"{'side':36} {'ms':>8} {'x torch':>8} {'GB/s (7 B/param)':>17}")
    rows = []
    for name in names:
        ms = statistics.median(times[name])
        kind = name.split()[1]
        ref = statistics.median(times[f"torch {kind}"])
        gbs = 7 * 2 * numel / ms / 1e6
        print(f"{name:36} {ms:8.3f} {ref / ms:8.2f} {gbs:17.0f}")
        rows.append({"side": name, "ms": ms, "x_torch": ref / ms, "warps": ns.warps})
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
