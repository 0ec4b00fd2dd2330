"""Real models end to end: one training step of Llama, GPT-2, BERT and ViT, torch vs gemsops.

Run on the GPU box (transformers installed, no network): every model is built from a
small config with random weights (``from_config``, bf16, SDPA attention), and one
training step (forward, loss, backward) runs twice on identical weights and inputs:
with torch's kernels and inside ``gemsops.use_gems()``. Per model it prints

* the loss difference and the largest relative gradient difference (over parameters:
  max |g_gems - g_torch| / max |g_torch|, per parameter, the worst one);
* the aten overloads gemsops handed back to torch, with the reasons (gemsops.record());
* the compute aten overloads the step ran that gemsops does not implement
  (:func:`gemsops.trace.trace`: views, metadata and allocation excepted);
* the eager step time of each side (median of ``--repeats`` steps after a warm-up).

With ``$OUT`` set it writes everything to ``$OUT/models.json``. Without transformers it
prints why and exits 0 ("skipped").

    python .ci/models.py [--models llama,gpt2,bert,vit] [--repeats 5] [--batch 2 --seq 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any

MODELS = ("llama", "gpt2", "bert", "vit")

# Overloads that move no data through a kernel of their own: views, metadata, aliasing.
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated models to run (default: {','.join(MODELS)})")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per side (median)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128, help="sequence length (text models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true",
                   help="tiny configs (vocabulary 256, width 64, 32-pixel images): a check "
                        "that runs on the CPU interpreter in minutes")
    return p.parse_args(argv)


def _configs(transformers: Any, seq: int, tiny: bool = False) -> dict[str, Any]:
    """Small configs: 2-4 layers, head dims of 64 (what the kernels serve); ``tiny``:
    vocabulary 256, width 64 (head dim 16), 32-pixel images of 8-pixel patches."""
    if tiny:
        return {
            "llama": transformers.LlamaConfig(
                vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=max(seq, 64)),
            "gpt2": transformers.GPT2Config(
                vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=max(seq, 64)),
            "bert": transformers.BertConfig(
                vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=max(seq, 64)),
            "vit": transformers.ViTConfig(
                image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_labels=10),
        }
    return {
        "llama": transformers.LlamaConfig(
            vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=max(seq, 512)),
        "gpt2": transformers.GPT2Config(
            vocab_size=50257, n_embd=512, n_layer=2, n_head=8, n_positions=max(seq, 512)),
        "bert": transformers.BertConfig(
            vocab_size=30522, hidden_size=512, intermediate_size=2048, num_hidden_layers=2,
            num_attention_heads=8, max_position_embeddings=max(seq, 512)),
        "vit": transformers.ViTConfig(
            image_size=224, patch_size=16, hidden_size=512, intermediate_size=2048,
            num_hidden_layers=2, num_attention_heads=8, num_labels=10),
    }


def _build(name: str, config: Any, transformers: Any) -> Any:
    config._attn_implementation = "sdpa"
    cls = {"llama": transformers.LlamaForCausalLM, "gpt2": transformers.GPT2LMHeadModel,
           "bert": transformers.BertForMaskedLM,
           "vit": transformers.ViTForImageClassification}[name]
    try:
        return cls._from_config(config, attn_implementation="sdpa")
    except TypeError:
        return cls._from_config(config)


def _inputs(name: str, config: Any, batch: int, seq: int, device: Any, torch: Any
            ) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1234)
    if name == "vit":
        pixels = torch.randn(batch, 3, config.image_size, config.image_size, generator=gen)
        labels = torch.randint(0, config.num_labels, (batch,), generator=gen)
        return {"pixel_values": pixels.to(device, torch.bfloat16), "labels": labels.to(device)}
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    if name == "bert":
        mask[:, seq - seq // 4:] = 0  # padding: BERT's SDPA path then takes a mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def _step(model: Any, inputs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return float(loss.detach().float()), grads


def _timed(model: Any, inputs: dict[str, Any], repeats: int, sync: Any) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_model(name: str, args: argparse.Namespace, transformers: Any) -> dict[str, Any]:
    import torch

    import gemshal
    import gemsops
    from gemsops.trace import trace

    device = gemshal.current_device().torch_device
    module = gemshal.device_module()  # the vendor's torch device module (None on the CPU)
    sync = getattr(module, "synchronize", None) or (lambda: None)
    config = _configs(transformers, args.seq, args.tiny)[name]
    torch.manual_seed(args.seed)
    model = _build(name, config, transformers).to(device, torch.bfloat16)
    model.train()
    for module in model.modules():  # identical steps on both sides: no dropout
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs = _inputs(name, config, args.batch, args.seq, device, torch)

    loss_t, grads_t = _step(model, inputs)
    with gemsops.use_gems(), gemsops.record() as rec:
        loss_g, grads_g = _step(model, inputs)
    # what the step calls that gemsops left to torch: gemsops trace's report
    report = trace(lambda: _step(model, inputs))
    # A gradient's difference relative to the largest gradient of its own tensor, with a
    # floor of 1% of the largest gradient of the model: a gradient that is zero in exact
    # arithmetic (the key projection's bias, which softmax cancels) is rounding noise on
    # both sides, and dividing by its own size would report that noise as a difference.
    floor = 0.01 * max((g.float().abs().max().item() for g in grads_t.values()), default=1.0)
    worst, worst_name = 0.0, None
    for pname, gt in grads_t.items():
        gg = grads_g.get(pname)
        if gg is None:
            continue
        scale = max(gt.float().abs().max().item(), floor) or 1.0
        rel = (gg.float() - gt.float()).abs().max().item() / scale
        if rel > worst or worst_name is None:
            worst, worst_name = rel, pname
    model.zero_grad(set_to_none=True)
    _timed(model, inputs, 1, sync)
    torch_ms = _timed(model, inputs, args.repeats, sync)
    with gemsops.use_gems():
        _timed(model, inputs, 1, sync)
        gems_ms = _timed(model, inputs, args.repeats, sync)
    return {
        "model": name,
        "loss_torch": loss_t,
        "loss_gemsops": loss_g,
        "loss_diff": abs(loss_g - loss_t),
        "max_rel_grad_diff": worst,
        "worst_param": worst_name,
        "served": dict(rec.served),
        "handed_back": {f"{o}: {r}": n for (o, r), n in rec.fallbacks.items()},
        "not_implemented": report.not_implemented,
        "composite": report.composite,
        "torch_ms": torch_ms,
        "gemsops_ms": gems_ms,
    }


def _print(r: dict[str, Any]) -> None:
    print(f"== {r['model']}: loss torch {r['loss_torch']:.5f} gemsops {r['loss_gemsops']:.5f} "
          f"(diff {r['loss_diff']:.2e}); max relative grad diff {r['max_rel_grad_diff']:.2e} "
          f"({r['worst_param']}); step {r['torch_ms']:.1f} ms torch, "
          f"{r['gemsops_ms']:.1f} ms gemsops")
    attn = {o: n for o, n in r["served"].items() if "attention" in o}
    print(f"   attention served: {attn or 'none'}")
    for what, n in sorted(r["handed_back"].items()):
        print(f"   handed back: {what} x{n}")
    for op, n in r["not_implemented"].items():
        print(f"   not implemented: {op} x{n}")
    if r.get("composite"):
        print("   composite (runs through the ops above): "
              + ", ".join(f"{op} x{n}" for op, n in r["composite"].items()))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"status": "ok", "models": []}
    try:
        import transformers
    except ImportError as exc:
        print(f"skipped: transformers is not installed ({exc})")
        result = {"status": "skipped", "reason": f"transformers not installed: {exc}"}
    else:
        import torch

        result["torch"] = torch.__version__
        result["transformers"] = transformers.__version__
        for name in names:
            try:
                r = run_model(name, args, transformers)
            except Exception as exc:  # one model's failure must not hide the others
                r = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
                print(f"== {name}: FAILED {r['error']}")
                traceback.print_exc()
                result["status"] = "failed"
            else:
                _print(r)
            result["models"].append(r)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "models.json"), "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 1 if result["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
