"""Attention tuning sweep on one GPU: every candidate config of gemsops' flash-attention
forward, dQ and dK/dV kernels at the model-shape suite's attention cases, each kernel
launch timed alone (do_bench median) beside torch's SDPA and gemsops' SDPA as shipped.

    python3 .ci/sweep_attn.py OUT_DIR                  # compile in parallel, then time
    python3 .ci/sweep_attn.py OUT_DIR --compile I N    # (worker) compile share I of N

A case runs gemsops' SDPA forward and backward once inside ``gemshal.kernel.recording()``
to learn its launches (grid, arguments, constants); each candidate then relaunches the
raw Triton function with those arguments and the candidate's block sizes, warps and
stages, and its outputs are compared with the shipped config's (a candidate that changes
them is marked ``wrong result``). Compiling dominates, so worker processes first launch
their share of the candidates (filling Triton's cache); the timing pass then runs alone.
Writes OUT_DIR/sweep-attn.json after every case and prints the best configs per kernel.
``SWEEP_TINY=1``: a dry run of the logic on small shapes (the interpreter on a CPU box).
``SWEEP_CASES=dropout``: BERT's and GPT-2's training calls instead, with attention
dropout 0.1 (BERT's with its boolean padding mask): the rows the kernels' ``DROPOUT``
key selects.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.testing

import gemshal
import gemsops
from gemshal.kernel import recording
from gemshal.kernel.compile import waiting
from gemsops import registry

TINY = os.environ.get("SWEEP_TINY") == "1"
from compile_workers import compile_then_time  # noqa: E402 - .ci/ on sys.path

DEV = gemshal.current_device().torch_device
DT = torch.float32 if TINY else torch.bfloat16
KERNELS = ("attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv")
# (label, batch, query heads, key/value heads, Lq, Lk, head dim, causal): the suite's
# training-shape attention cases (gemsops/bench_suite.py) and issue 25's D=128 row.
CASES = [("tiny 1x2x64x64x16 causal", 1, 2, 2, 64, 64, 16, True)] if TINY else [
    ("llama-1b 4x32/8x2048x2048x64 causal", 4, 32, 8, 2048, 2048, 64, True),
    ("llama-8b 2x32/8x2048x2048x128 causal", 2, 32, 8, 2048, 2048, 128, True),
    ("gpt2 8x12x1024x1024x64 causal", 8, 12, 12, 1024, 1024, 64, True),
    ("bert-base 16x12x512x512x64", 16, 12, 12, 512, 512, 64, False),
    ("vit-b16 32x12x197x197x64", 32, 12, 12, 197, 197, 64, False),
    ("issue-25 4x16x2048x2048x128", 4, 16, 16, 2048, 2048, 128, False),
]
# (..., causal, boolean padding mask, dropout probability): the dropout cases.
DROPOUT_CASES = [
    ("bert step 4x12x512x512x64 mask dropout 0.1", 4, 12, 12, 512, 512, 64, False, True, 0.1),
    ("gpt2 step 4x12x512x512x64 causal dropout 0.1", 4, 12, 12, 512, 512, 64, True, False, 0.1),
    ("bert-base 16x12x512x512x64 mask dropout 0.1", 16, 12, 12, 512, 512, 64, False, True, 0.1),
]
if os.environ.get("SWEEP_CASES") == "dropout":
    CASES = [("tiny 1x2x64x64x16 mask dropout", 1, 2, 2, 64, 64, 16, False, True, 0.1)] \
        if TINY else DROPOUT_CASES


def candidates() -> list[dict[str, Any]]:
    """Block rows x block columns x stages x warps; 8 warps only on 128-row tiles."""
    if TINY:
        return [{"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2},
                {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}]
    out = []
    for bm, bn, st, w in itertools.product((64, 128), (32, 64, 128), (2, 3, 4), (4, 8)):
        if bm == 64 and w == 8:
            continue
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st})
    return out


def bench(fn: Any) -> float:
    if TINY:
        fn()
        return 1.0
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _mask_of(case: tuple[Any, ...]) -> torch.Tensor | None:
    """A dropout case's boolean padding mask [B, 1, 1, Lk] (the last quarter of the keys
    masked, as `.ci/steps.py`'s BERT step), None for the others."""
    if len(case) < 10 or not case[8]:
        return None
    mask = torch.ones(case[1], 1, 1, case[5], dtype=torch.bool, device=DEV)
    mask[..., case[5] - case[5] // 4:] = False
    return mask


def make(case: tuple[Any, ...]) -> tuple[Any, Any, tuple[torch.Tensor, ...]]:
    _, b, hq, hkv, lq, lk, d, causal = case[:8]
    p = case[9] if len(case) > 9 else 0.0
    mask = _mask_of(case)
    q = torch.randn(b, hq, lq, d, device=DEV, dtype=DT, requires_grad=True)
    k = torch.randn(b, hkv, lk, d, device=DEV, dtype=DT, requires_grad=True)
    v = torch.randn(b, hkv, lk, d, device=DEV, dtype=DT, requires_grad=True)
    gqa = hq != hkv

    def fwd() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                              is_causal=causal, enable_gqa=gqa)

    grad = torch.randn(b, hq, lq, d, device=DEV, dtype=DT)

    def step() -> None:
        fwd().backward(grad)

    return fwd, step, (q, k, v)


def launches(fwd: Any, case: tuple[Any, ...],
             inputs: tuple[torch.Tensor, ...]) -> list[tuple[Any, Any, tuple[Any, ...], Any]]:
    """The swept kernels' launches in one forward and backward (the first of each). The
    backward is called here, not through autograd, whose device thread a recording on
    this one would not see."""
    from gemsops.ops.attention import sdpa
    from gemsops.ops.attention.dropout import draw

    p = case[9] if len(case) > 9 else 0.0
    mask = _mask_of(case)
    q, k, v = (t.detach() for t in inputs)
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    drop = draw(p, q.device)[1] if p else None
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    with registry.use_gems(), waiting(), recording() as rec:
        sdpa._forward(q, k, v, mask, case[7], case[6] ** -0.5, out, lse, drop)
    with registry.use_gems(), waiting(), recording() as rec_b:
        sdpa._backward(torch.randn_like(out), q, k, v, mask, out, lse, case[7],
                       case[6] ** -0.5, drop=drop)
    rec.launches.extend(rec_b.launches)
    seen: dict[str, tuple[Any, Any, tuple[Any, ...], Any]] = {}
    for kernel, grid, args, kwargs in rec.launches:
        if kernel.op in KERNELS and kernel.op not in seen:
            seen[kernel.op] = (kernel, grid, args, kwargs)
    return list(seen.values())


def fire(kernel: Any, grid: Any, args: tuple[Any, ...], kwargs: Any,
         cfg: dict[str, Any]) -> None:
    meta = {**kwargs, **cfg}
    g = grid(meta) if callable(grid) else grid
    kernel.fn[g](*args, **meta)


def run(timing: bool, share: tuple[int, int] | None) -> list[dict[str, Any]]:
    gemshal.ensure_scratch_allocator()
    index = itertools.count()
    results: list[dict[str, Any]] = []
    out_dir = sys.argv[1]
    for case in CASES:
        fwd, step, inputs = make(case)
        rec: dict[str, Any] = {"case": case[0], "kernels": {}}
        if timing:
            rec["torch_fwd_ms"] = bench(fwd)
            rec["torch_fwd_bwd_ms"] = bench(step)
            with registry.use_gems():
                with waiting():
                    step()
                rec["gemsops_fwd_ms"] = bench(fwd)
                rec["gemsops_fwd_bwd_ms"] = bench(step)
        for kernel, grid, args, kwargs in launches(fwd, case, inputs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            want = []
            if timing:
                # The shipped config through gemshal's launch path: its time, and the
                # outputs every candidate must reproduce.
                kernel.launch(grid, args, kwargs)
                want = [t.detach().clone() for t in tensors]
                rec[kernel.op + " shipped_ms"] = bench(
                    lambda: kernel.launch(grid, args, kwargs))
            rows = []
            for cfg in candidates():
                i = next(index)
                if share is not None and i % share[1] != share[0]:
                    continue
                try:
                    ms = bench(lambda: fire(kernel, grid, args, kwargs, cfg)) if timing else (
                        fire(kernel, grid, args, kwargs, cfg) or 0.0)
                    err = None
                    if timing and any(
                            not torch.allclose(t.float(), w.float(), atol=2e-2, rtol=2e-2,
                                               equal_nan=True)
                            for t, w in zip(tensors, want, strict=True)):
                        err = "wrong result"
                except Exception as e:  # noqa: BLE001 - a sweep records what fails
                    ms, err = float("inf"), f"{type(e).__name__}: {str(e)[:160]}"
                rows.append({"config": cfg, "ms": ms, "error": err})
            rec["kernels"][kernel.op] = rows
        results.append(rec)
        if timing:
            report(rec)
            with open(f"{out_dir}/sweep-attn.json", "w") as fh:
                json.dump(results, fh, indent=1)
        del fwd, step, inputs
    return results


def report(rec: dict[str, Any]) -> None:
    print(f"== {rec['case']}: fwd torch {rec['torch_fwd_ms'] * 1e3:.1f} us, gemsops "
          f"{rec['gemsops_fwd_ms'] * 1e3:.1f} us; fwd+bwd torch "
          f"{rec['torch_fwd_bwd_ms'] * 1e3:.1f} us, gemsops "
          f"{rec['gemsops_fwd_bwd_ms'] * 1e3:.1f} us", flush=True)
    for op in KERNELS:
        rows = rec["kernels"].get(op)
        if not rows:
            continue
        rows = sorted(rows, key=lambda r: r["ms"])
        print(f"   {op}: shipped {rec[op + ' shipped_ms'] * 1e3:.1f} us", flush=True)
        for r in rows[:5]:
            print(f"      {r['ms'] * 1e3:9.1f} us  {r['config']}  {r['error'] or ''}",
                  flush=True)
        bad = [r for r in rows if r["error"]]
        if bad:
            print(f"      {len(bad)} failed, e.g. {bad[0]['config']}: {bad[0]['error']}",
                  flush=True)


def main() -> None:
    gemsops.mm  # noqa: B018 - loads the op declarations
    compile_then_time(__file__, run, 1 if TINY else 14)


if __name__ == "__main__":
    main()
