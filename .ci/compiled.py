"""torch.compile on the GPU: Inductor alone against backend="gemsops", with and without CUDA graphs.

    python3 .ci/compiled.py [--models llama,gpt2,bert,vit] [--sets S,...] [--budget-s 120]

Per model (the 4-layer configs of .ci/steps.py), one process: eager torch's loss and
gradients of one training step (no optimizer) as the reference, then each
configuration compiled fresh (``torch._dynamo.reset()``): its first call (compile time),
3 warm-up steps, the median of 20 steps, the loss difference and the largest relative
gradient difference against eager, and for gemsops the overloads each graph keeps.
Configurations: ``inductor``, ``inductor-ro`` (``mode="reduce-overhead"``), and
``gemsops-<set>`` / ``gemsops-<set>-ro`` for each keep set in ``KEEP_SETS``. One JSON
line each, printed as it ends; a model's configurations past its ``--budget-s`` (seconds
per model, so every model gets its share) are skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps  # (.ci/steps.py: the models)

from gemsops import compiler

REPEATS = 20

KEEP_SETS: dict[str, list[str]] = {
    "matmul": ["mm", "addmm", "bmm"],
    "rest": ["_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
             "nll_loss_forward", "nll_loss_backward", "native_layer_norm",
             "native_layer_norm_backward", "embedding_dense_backward",
             "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_efficient_attention_backward"],
}
KEEP_SETS["all"] = KEEP_SETS["matmul"] + KEEP_SETS["rest"]
# One family each (issue 26: the default set keeps a family only where it measures faster
# than Inductor's own kernels for it).
KEEP_SETS["softmax"] = KEEP_SETS["rest"][:4]
KEEP_SETS["loss"] = ["nll_loss_forward", "nll_loss_backward"]
KEEP_SETS["norm"] = ["native_layer_norm", "native_layer_norm_backward"]
KEEP_SETS["embedding"] = ["embedding_dense_backward"]
KEEP_SETS["attention"] = ["_scaled_dot_product_efficient_attention",
                          "_scaled_dot_product_efficient_attention_backward"]


def _grads(model: Any) -> list[torch.Tensor]:
    return [p.grad.detach().float().clone() for p in model.parameters() if p.grad is not None]


def _one(model: Any, inputs: dict[str, Any]) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return float(loss), _grads(model)


def _configs(sets: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [
        ("inductor", {}), ("inductor-ro", {"mode": "reduce-overhead"})]
    for name in sets:
        keep = KEEP_SETS[name]
        out.append((f"gemsops-{name}", {"backend": compiler.compile_backend,
                                        "options": {"keep": keep}}))
        out.append((f"gemsops-{name}-ro", {"backend": compiler.compile_backend, "options": {
            "keep": keep, "mode": "reduce-overhead"}}))
    return out


def run(name: str, sets: list[str], deadline: float, sink: Any) -> None:
    model, inputs, _ = steps._build(name)
    model.eval()  # dropout off (GPT-2, BERT, ViT): every run computes the same step
    ref_loss, ref_grads = _one(model, inputs)
    for label, kwargs in _configs(sets):
        if time.monotonic() > deadline:
            print(json.dumps({"model": name, "config": label, "skipped": "past the budget"}),
                  file=sink, flush=True)
            continue
        torch._dynamo.reset()
        before = len(compiler.graphs())
        compiled = torch.compile(model, **kwargs)
        row: dict[str, Any] = {"model": name, "config": label}
        try:
            torch.cuda.synchronize()
            t = time.perf_counter()
            compiled.zero_grad(set_to_none=True)
            compiled(**inputs).loss.backward()
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - t, 1)
            for _ in range(3):
                loss, grads = _one(compiled, inputs)
            times = []
            for _ in range(REPEATS):
                torch.cuda.synchronize()
                t = time.perf_counter()
                _one_fast(compiled, inputs)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
            row["step_ms"] = round(statistics.median(times), 2)
            row["loss"] = round(loss, 5)
            row["loss_diff"] = round(abs(loss - ref_loss), 5)
            row["grad_rel_diff"] = round(max(
                float((g - r).norm() / r.norm().clamp_min(1e-12))
                for g, r in zip(grads, ref_grads, strict=True)), 5)
            row["graphs"] = [{"name": g.name, "kept": g.kept}
                             for g in compiler.graphs()[before:]]
        except Exception as error:  # report and go on to the next configuration
            row["error"] = f"{type(error).__name__}: {str(error)[:400]}"
        print(json.dumps(row), file=sink, flush=True)
        del compiled
    del model, inputs
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def _one_fast(model: Any, inputs: dict[str, Any]) -> None:
    model.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="llama,gpt2,bert,vit")
    p.add_argument("--sets", default="all,matmul,rest")
    p.add_argument("--budget-s", type=float, default=120, help="seconds per model")
    a = p.parse_args(argv)
    for name in a.models.split(","):
        run(name, a.sets.split(","), time.monotonic() + a.budget_s, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
