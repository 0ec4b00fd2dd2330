"""Split-K for the long-K, few-tile products of a linear layer's weight gradient, on one
GPU: torch's matmul, gemsops' product as shipped (the persistent kernel), and the
portable tile kernel with K split over 1, 2, 4 and 8 programs per output tile (fp32
partials summed by the reduce kernel), over a few large-tile configs, each timed end to
end (do_bench median, the partials' allocation and the reduction included).

    python3 .ci/splitk_probe.py OUT_DIR                 # compile in parallel, then time
    python3 .ci/splitk_probe.py OUT_DIR --compile I N   # (worker) compile share I of N

The weight gradient of a [tokens, k] -> [tokens, n] linear is grad_out^T @ x: an
[n, tokens] (transposed view) by [tokens, k] product. At GPT-2/BERT/ViT widths its output
has 36-144 tiles of 128x128 for 132 multiprocessors, with K = 6304-8192. Writes
OUT_DIR/splitk.json and prints each case's best.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

import torch
import triton
import triton.testing

import gemshal
import gemsops
from gemsops import registry
from gemsops.ops.grid import cdiv
from gemsops.ops.matmul import mm as MM

from compile_workers import compile_then_time  # noqa: E402 - .ci/ on sys.path

DEV = gemshal.current_device().torch_device
BF16 = torch.bfloat16
TINY = os.environ.get("SWEEP_TINY") == "1"
# (label, n, k, tokens): the product is [n, tokens] @ [tokens, k]
CASES = [("tiny 64x32 K256", 64, 32, 256)] if TINY else [
    (f"{name} wgrad {n}x{k} K{t}", n, k, t)
    for t in (8192, 6304)
    for name, n, k in [("out", 768, 768), ("up", 3072, 768), ("down", 768, 3072),
                       ("qkv", 2304, 768)]
] + [("llama-1b out wgrad 2048x2048 K8192", 2048, 2048, 8192)]
SPLITS = (1, 2) if TINY else (1, 2, 4, 8)
TILES = [(16, 16, 16, 2, 4)] if TINY else [
    (128, 128, 64, 4, 4), (128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (128, 128, 32, 5, 4),
    (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 3, 8)]


def bench(fn: Any, timing: bool) -> float:
    if not timing or TINY:
        fn()
        return 0.0 if not timing else 1.0
    return float(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))


def run(timing: bool, share: tuple[int, int] | None) -> list[dict[str, Any]]:
    gemshal.ensure_scratch_allocator()
    mk, rk = MM._mm_kernel.fn, MM._splitk_reduce_kernel.fn
    index = itertools.count()
    results = []
    for label, n, k, t in CASES:
        g = torch.randn(t, n, device=DEV, dtype=BF16)
        x = torch.randn(t, k, device=DEV, dtype=BF16)
        a, b = g.t(), x
        M, K, N = n, t, k
        c = torch.empty(M, N, device=DEV, dtype=BF16)
        rec: dict[str, Any] = {"case": label, "configs": []}
        if timing:
            rec["torch_ms"] = bench(lambda: torch.mm(a, b), True)
            with registry.use_gems():
                torch.mm(a, b)
                rec["gemsops_ms"] = bench(lambda: torch.mm(a, b), True)
            want = (a.float() @ b.float())
        sa, sb, sc = (0, *a.stride()), (0, *b.stride()), (0, *c.stride())
        for split, (bm, bn, bk, st, w) in itertools.product(SPLITS, TILES):
            i = next(index)
            if share is not None and i % share[1] != share[0]:
                continue
            mmc, red = MM._consts(BF16, False, None, split)
            meta = {**mmc, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                    "num_stages": st, "num_warps": w}

            def once(split: int = split, meta: dict[str, Any] = meta,
                     red: dict[str, Any] = red) -> None:
                tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
                if split == 1:
                    mk[(tiles, 1)](a, b, c, c, M, N, K, *sa, *sb, *sc, *sc, 1.0, 0.0, **meta)
                    return
                work = torch.empty((split, M, N), device=DEV, dtype=torch.float32)
                mk[(tiles, split)](a, b, work, c, M, N, K, *sa, *sb, *work.stride(), *sc,
                                   1.0, 0.0, **meta)
                rk[(cdiv(M, 16), cdiv(N, 256))](work, c, c, M, N, *sc[1:], *sc[1:], 1.0, 0.0,
                                                **red, BLOCK_M=16, BLOCK_N=256, num_warps=4)
            try:
                ms, err = bench(once, timing), None
                if timing and not torch.allclose(c.float(), want, atol=1.0, rtol=0.05):
                    err = "wrong result"
            except Exception as e:  # noqa: BLE001 - a probe records what fails
                ms, err = float("inf"), f"{type(e).__name__}: {str(e)[:160]}"
            rec["configs"].append({"split": split, "tile": [bm, bn, bk, st, w], "ms": ms,
                                   "error": err})
        results.append(rec)
        if timing:
            rows = sorted(rec["configs"], key=lambda r: r["ms"])
            print(f"== {label}: torch {rec['torch_ms'] * 1e3:.1f} us, gemsops now "
                  f"{rec['gemsops_ms'] * 1e3:.1f} us", flush=True)
            for s in SPLITS:
                best = min((r for r in rows if r["split"] == s), key=lambda r: r["ms"])
                print(f"   split {s}: {best['ms'] * 1e3:8.1f} us  tile {best['tile']}  "
                      f"{best['error'] or ''}", flush=True)
            with open(f"{sys.argv[1]}/splitk.json", "w") as fh:
                json.dump(results, fh, indent=1)
    return results


def main() -> None:
    gemsops.mm  # noqa: B018 - loads the op declarations
    compile_then_time(__file__, run, 1 if TINY else 14)


if __name__ == "__main__":
    main()
