"""Matmul tuning sweep on one GPU: every candidate config of the persistent kernel on the
large shapes, and every (split, tile) of the split-K and matrix-vector kernels on the
decode shapes, each timed end to end (do_bench median, L2 flushed) beside torch.

    python3 .ci/sweep_mm.py OUT_DIR            # compile in parallel, then time
    python3 .ci/sweep_mm.py OUT_DIR --compile I N   # (worker) compile share I of N

Compiling dominates a sweep, so N worker processes first launch their share of the
configs once (filling Triton's cache); the timing pass then runs alone on the device.
Writes OUT_DIR/sweep-mm.json and prints the best configs per case.
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
from gemsops.ops.matmul import persistent as P

TINY = os.environ.get("SWEEP_TINY") == "1"  # a dry run of the logic on small shapes
from compile_workers import compile_then_time, worker_share  # noqa: E402

DEV = gemshal.current_device().torch_device
BF16 = torch.bfloat16
BIG, WIDE, DEPTH = (64, 64, 64) if TINY else (4096, 14336, 4096)


REFINE = os.environ.get("SWEEP_SET") == "refine"  # the second pass: the first's leaders
# The 768-wide models (GPT-2, BERT-base, ViT-B/16): their linears' three products (forward
# with bias, input gradient, weight gradient) at 8192 and 6304 tokens, over the first
# sweep's candidates and smaller tiles, no decode cases.
MODELS = os.environ.get("SWEEP_SET") == "models"


def refine_configs() -> list[dict[str, Any]]:
    """The first sweep's leaders and their neighbours (group size, clusters, deeper
    pipelines of thinner K slices, warp specialization)."""
    def cfg(bm: int, bn: int, bk: int, st: int, w: int, epi: bool, fl: bool,
            **more: Any) -> dict[str, Any]:
        return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                "EPILOGUE_SPLIT": epi, "FLATTEN": fl, "num_stages": st, "num_warps": w,
                **more}
    out = [cfg(128, 256, 64, 3, 8, True, True), cfg(128, 128, 64, 5, 4, False, True),
           cfg(128, 256, 64, 4, 8, True, False), cfg(256, 128, 64, 4, 8, True, False),
           cfg(128, 256, 64, 3, 8, False, True), cfg(128, 128, 128, 3, 4, False, True),
           cfg(128, 256, 64, 4, 8, True, True), cfg(256, 128, 64, 3, 8, True, True),
           cfg(128, 256, 32, 5, 8, True, True), cfg(128, 256, 32, 6, 8, True, True),
           cfg(128, 256, 32, 6, 8, False, True), cfg(128, 128, 32, 8, 4, False, True),
           cfg(128, 128, 64, 5, 8, False, True), cfg(128, 128, 64, 6, 4, False, True)]
    for g in (4, 16, 32):
        out.append(cfg(128, 256, 64, 3, 8, True, True, GROUP_M=g))
        out.append(cfg(128, 128, 64, 5, 4, False, True, GROUP_M=g))
    # two programs per multiprocessor: one's epilogue under the other's main loop
    for st, epi, bk in [(3, True, 64), (2, False, 64), (2, True, 64), (4, True, 32),
                        (5, True, 32)]:
        out.append(cfg(128, 128, bk, st, 4, epi, True, OCCUPANCY=2))
        out.append(cfg(128, 128, bk, st, 4, epi, False, OCCUPANCY=2))
    out.append(cfg(128, 256, 64, 3, 8, True, True, num_ctas=2))
    out.append(cfg(128, 128, 64, 5, 4, False, True, num_ctas=2))
    out.append(cfg(128, 128, 64, 4, 4, True, True, WARP_SPECIALIZE=True))
    out.append(cfg(128, 256, 64, 4, 8, True, True, WARP_SPECIALIZE=True))
    return out


def small_configs() -> list[dict[str, Any]]:
    """Tiles for short K and narrow N (768): 64-row and 64-column tiles, two programs a
    multiprocessor, thinner K slices."""
    out = []
    for (bm, bn, bk), st, w in [((64, 128, 64), 4, 4), ((64, 128, 64), 5, 4),
                                ((64, 256, 64), 4, 4), ((64, 256, 64), 3, 8),
                                ((128, 64, 64), 4, 4), ((128, 64, 64), 5, 4),
                                ((256, 64, 64), 3, 8), ((128, 128, 32), 6, 4),
                                ((128, 256, 32), 5, 8), ((256, 128, 32), 5, 8)]:
        for epi in (False, True):
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                        "EPILOGUE_SPLIT": epi and bn >= 128, "FLATTEN": True,
                        "num_stages": st, "num_warps": w})
    for bm, bn, st in [(64, 128, 4), (128, 64, 4), (128, 128, 4), (64, 256, 3)]:
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8,
                    "EPILOGUE_SPLIT": False, "FLATTEN": True, "OCCUPANCY": 2,
                    "num_stages": st, "num_warps": 4})
    return out


def persistent_configs() -> list[dict[str, Any]]:
    if REFINE:
        return refine_configs()
    out = small_configs() if MODELS else []
    shapes = [((128, 128, 64), (3, 4, 5), (4, 8)), ((128, 256, 64), (3, 4), (8,)),
              ((128, 128, 128), (2, 3), (4, 8)), ((256, 128, 64), (3, 4), (8,))]
    for (bm, bn, bk), stages, warps in shapes:
        for st, w, epi, fl in itertools.product(stages, warps, (False, True), (False, True)):
            out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                        "EPILOGUE_SPLIT": epi, "FLATTEN": fl, "num_stages": st,
                        "num_warps": w})
    for (bm, bn, bk), st, w in [((128, 128, 64), 4, 8), ((128, 256, 64), 3, 8),
                                ((128, 128, 64), 3, 4)]:
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                    "EPILOGUE_SPLIT": True, "FLATTEN": True, "WARP_SPECIALIZE": True,
                    "num_stages": st, "num_warps": w})
    return out


def split_configs() -> list[dict[str, Any]]:
    tiles = [(16, 64, 128, 4, 4), (16, 128, 128, 3, 4), (16, 128, 64, 5, 4),
             (16, 64, 256, 3, 4), (16, 32, 256, 4, 4), (16, 256, 64, 4, 8),
             (32, 64, 128, 4, 4), (16, 32, 128, 6, 2)]
    return [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 1, "num_stages": s,
             "num_warps": w} for m, n, k, s, w in tiles]


def large_cases() -> list[tuple[str, Any, Any]]:
    """(label, make() -> (a, b, bias), torch fn)"""
    def mm(s: int) -> Any:
        return lambda: (torch.randn(s, s, device=DEV, dtype=BF16),
                        torch.randn(s, s, device=DEV, dtype=BF16), None)

    def linear(s: int) -> Any:
        return lambda: (torch.randn(s, s, device=DEV, dtype=BF16),
                        torch.randn(s, s, device=DEV, dtype=BF16).t(),
                        torch.randn(s, device=DEV, dtype=BF16))

    def bmm(t: bool) -> Any:
        def make() -> Any:
            a = torch.randn(64, 2048, 128, device=DEV, dtype=BF16)
            b = (torch.randn(64, 2048, 128, device=DEV, dtype=BF16).transpose(1, 2) if t
                 else torch.randn(64, 128, 2048, device=DEV, dtype=BF16))
            return a, b, None
        return make

    def product(m: int, n: int, k: int, kind: str) -> Any:
        def make() -> Any:
            if kind == "fwd":  # x @ W^T + bias
                return (torch.randn(m, k, device=DEV, dtype=BF16),
                        torch.randn(n, k, device=DEV, dtype=BF16).t(),
                        torch.randn(n, device=DEV, dtype=BF16))
            if kind == "dgrad":  # grad_out @ W: [m, n] @ [n, k]
                return (torch.randn(m, n, device=DEV, dtype=BF16),
                        torch.randn(n, k, device=DEV, dtype=BF16), None)
            # wgrad: grad_out^T @ x: [n, m] @ [m, k]
            return (torch.randn(m, n, device=DEV, dtype=BF16).t(),
                    torch.randn(m, k, device=DEV, dtype=BF16), None)
        return make

    if TINY:
        return [("mm tiny", mm(64)), ("linear tiny +bias", linear(64))]
    if MODELS:
        out = []
        for m in (8192, 6304):
            for name, n, k in [("qkv", 2304, 768), ("out", 768, 768), ("up", 3072, 768),
                               ("down", 768, 3072)]:
                for kind in ("fwd", "dgrad", "wgrad"):
                    out.append((f"{name} {kind} {m}x{n}x{k}", product(m, n, k, kind)))
        return out
    if REFINE:
        return [("mm 4096^3", mm(4096)), ("mm 8192^3", mm(8192)),
                ("linear 4096^3 +bias", linear(4096)), ("linear 8192^3 +bias", linear(8192)),
                ("bmm 64x2048x2048x128", bmm(False)), ("bmm 64x2048x2048x128 (b^T)", bmm(True))]
    return [("mm 4096^3", mm(4096)), ("mm 8192^3", mm(8192)), ("linear 4096^3 +bias", linear(4096)),
            ("bmm 64x2048x2048x128", bmm(False)), ("bmm 64x2048x2048x128 (b^T)", bmm(True))]


def decode_cases() -> list[tuple[str, Any]]:
    out = []
    for n in (BIG, WIDE):
        for m in (1, 4, 16):
            for lin in (False, True):
                def make(m: int = m, n: int = n, lin: bool = lin) -> Any:
                    a = torch.randn(m, DEPTH, device=DEV, dtype=BF16)
                    b = (torch.randn(n, DEPTH, device=DEV, dtype=BF16).t() if lin
                         else torch.randn(DEPTH, n, device=DEV, dtype=BF16))
                    return a, b, None
                out.append((f"{'linear' if lin else 'mm'} {m}x{n}x{DEPTH}", make))
    return out


def torch_fn(a: Any, b: Any, bias: Any) -> Any:
    if bias is not None:
        return lambda: torch.addmm(bias, a, b)
    return (lambda: torch.bmm(a, b)) if a.dim() == 3 else (lambda: torch.mm(a, b))


def bench(fn: Any, timing: bool) -> float:
    if TINY:
        fn()
        return 1.0
    if not timing:
        fn()
        return 0.0
    rep = 100 if REFINE else 30
    return float(triton.testing.do_bench(fn, warmup=5, rep=rep, return_mode="median"))


def record(label: str, kind: str, a: Any, b: Any, bias: Any, timing: bool) -> dict[str, Any]:
    """A case's record: torch's time and gemsops' (as a user calls it) when timing."""
    rec: dict[str, Any] = {"case": label, "kind": kind, "configs": []}
    if timing:
        rec["torch_ms"] = bench(torch_fn(a, b, bias), True)
        with registry.use_gems():
            f = torch_fn(a, b, bias)
            f()
            rec["gemsops_ms"] = bench(f, True)
    return rec


def run(timing: bool, share: tuple[int, int] | None) -> list[dict[str, Any]]:
    gemshal.ensure_scratch_allocator()
    results = []
    index = itertools.count()

    def mine() -> bool:
        i = next(index)
        return share is None or i % share[1] == share[0]

    pk = P._mm_persistent_kernel.fn
    for label, make in large_cases():
        a, b, bias = make()
        shape = (*a.shape[:-1], b.shape[-1])
        c = torch.empty(shape, device=DEV, dtype=a.dtype)
        s = None if bias is None else bias.expand(shape)
        flops = 2 * a.shape[-2] * b.shape[-1] * a.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        rec = record(label, "persistent", a, b, bias, timing)
        grid, args, consts = P.plan(a, b, c, s, 1.0, 1.0)
        for cfg in persistent_configs():
            if not mine():
                continue
            meta = {**consts, **cfg}
            try:
                ms = bench(lambda: pk[grid](*args, **meta), timing)
                err = None
                if timing:
                    want = torch_fn(a, b, bias)()
                    if not torch.allclose(c.float(), want.float(), atol=0.5, rtol=0.05):
                        err = "wrong result"
            except Exception as e:  # noqa: BLE001 - a sweep records what fails
                ms, err = float("inf"), f"{type(e).__name__}: {str(e)[:160]}"
            rec["configs"].append({"config": cfg, "ms": ms, "error": err,
                                   "tflops": flops / (ms * 1e-3) / 1e12 if ms else 0})
        results.append(rec)
        report(rec)
        del a, b, c, s

    if timing:
        # torch again after the candidates: how far the device's clocks drifted
        for rec in results:
            a, b, bias = dict(large_cases())[rec["case"]]()
            rec["torch_ms_after"] = bench(torch_fn(a, b, bias), True)
            print(f"   {rec['case']}: torch {rec['torch_ms'] * 1e3:.1f} us before the "
                  f"candidates, {rec['torch_ms_after'] * 1e3:.1f} us after", flush=True)
            del a, b, bias
    mk, rk = MM._mm_kernel.fn, MM._splitk_reduce_kernel.fn
    for label, make in [] if REFINE or MODELS else decode_cases():
        a, b, _ = make()
        M, K, N = a.shape[0], a.shape[1], b.shape[1]
        c = torch.empty(M, N, device=DEV, dtype=a.dtype)
        rec = record(label, "decode", a, b, None, timing)
        sa, sb, sc = (0, *a.stride()), (0, *b.stride()), (0, *c.stride())
        for split in (1, 2, 4, 8, 16):
            mmc, red = MM._consts(a.dtype, False, None, split)
            for cfg in split_configs():
                if not mine():
                    continue
                meta = {**mmc, **cfg}
                nw = cfg["num_warps"]

                def once(split: int = split, meta: dict[str, Any] = meta, nw: int = nw,
                         red: dict[str, Any] = red) -> None:
                    bm, bn = meta["BLOCK_M"], meta["BLOCK_N"]
                    if split == 1:
                        mk[(cdiv(M, bm) * cdiv(N, bn), 1)](
                            a, b, c, c, M, N, K, *sa, *sb, *sc, *sc, 1.0, 0.0, **meta)
                        return
                    work = torch.empty((split, M, N), device=DEV, dtype=torch.float32)
                    mk[(cdiv(M, bm) * cdiv(N, bn), split)](
                        a, b, work, c, M, N, K, *sa, *sb, *work.stride(), *sc, 1.0, 0.0,
                        **meta)
                    rk[(cdiv(M, 16), cdiv(N, 256))](
                        work, c, c, M, N, *sc[1:], *sc[1:], 1.0, 0.0, **red, BLOCK_M=16,
                        BLOCK_N=256, num_warps=4)
                try:
                    ms, err = bench(once, timing), None
                    if timing and not torch.allclose(c.float(), (a.float() @ b.float()),
                                                     atol=0.5, rtol=0.05):
                        err = "wrong result"
                except Exception as e:  # noqa: BLE001
                    ms, err = float("inf"), f"{type(e).__name__}: {str(e)[:160]}"
                rec["configs"].append({"config": {"split": split, **cfg}, "ms": ms,
                                       "error": err})
        results.append(rec)
        report(rec)
    return results


def report(rec: dict[str, Any]) -> None:
    if "torch_ms" not in rec:
        return
    rows = sorted(rec["configs"], key=lambda r: r["ms"])
    print(f"== {rec['case']}: torch {rec['torch_ms'] * 1e3:.1f} us, gemsops now "
          f"{rec['gemsops_ms'] * 1e3:.1f} us", flush=True)
    for r in rows[:8]:
        print(f"   {r['ms'] * 1e3:9.1f} us  {r['config']}  {r['error'] or ''}", flush=True)
    bad = [r for r in rows if r["error"]]
    if bad:
        print(f"   {len(bad)} failed, e.g. {bad[0]['config']}: {bad[0]['error']}", flush=True)


def main() -> None:
    out = sys.argv[1]
    gemsops.mm  # noqa: B018 - loads the op declarations
    results = compile_then_time(__file__, run, 12)
    if results is not None and worker_share() is None:
        with open(f"{out}/sweep-mm.json", "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
