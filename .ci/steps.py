"""Model steps on the GPU: steady-state step times, first steps, and generation.

    python3 .ci/steps.py steady [--models llama,gpt2,bert,vit,llama508m] [--repeats 10]
    python3 .ci/steps.py first MODEL [--side torch] [--profile FILE]  # fresh process
    python3 .ci/steps.py generate [--tokens 64]
    python3 .ci/steps.py kernels [--models llama,gpt2] [--top 25]   # device time by kernel
    gemsops tune --out FILE --script .ci/steps.py -- workload   # the sm90 tables' workload

``steady``: per model, one process, the same weights and inputs, torch's kernels and
``gemsops.use_gems()`` each warmed up (3 steps), then the median of ``--repeats`` steps.
A training step is forward, loss, backward (and an AdamW step for ``llama508m``).
``first``: the wall time of the first gemsops step in this process (compiles; with an
empty ``TRITON_CACHE_DIR``, everything), then of the second; prints one JSON line.
``kernels``: per model and side (torch, gemsops), after warm-up, three steps under
``torch.profiler``: the step's wall time, the device time its kernels add up to, the
host time until the last launch was issued (no synchronize inside the step), and the
kernels by device time, so a slow step reads as host-bound or kernel-bound.
``generate``: HF ``generate`` of the small Llama at batch 1 (greedy): tokens per second
of each side, and the wall time of gemsops' first 8 tokens in this process.

Models (transformers, random init, bf16, SDPA attention):
``llama``: width 1024, 4 layers, 8 heads (4 KV heads), 4x512 tokens; ``gpt2``: width
768, 4 layers, 12 heads, 4x512; ``bert``: width 768, 4 layers, 4x512, a quarter padded;
``vit``: ViT-B/16 width, 4 layers, 32 images of 224 pixels; ``llama508m``: width 2048,
8 layers, 16 heads (8 KV heads), 4x2048 tokens, AdamW.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

import gemsops
from gemshal.kernel.compile import mode as compile_mode
from gemshal.kernel.compile import wait_compiles
from gemsops.registry import COMPILING


def _config(name: str) -> tuple[Any, dict[str, Any]]:
    import transformers as tf

    if name == "llama":
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                             max_position_embeddings=2048)
        return cfg, {"batch": 4, "seq": 512}
    if name == "llama508m":
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                             num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                             max_position_embeddings=2048)
        return cfg, {"batch": 4, "seq": 2048, "adamw": True}
    if name == "gpt2":
        return tf.GPT2Config(n_embd=768, n_layer=4, n_head=12, n_positions=1024), {
            "batch": 4, "seq": 512}
    if name == "bert":
        return tf.BertConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                             intermediate_size=3072), {"batch": 4, "seq": 512}
    if name == "vit":
        return tf.ViTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                            intermediate_size=3072, num_labels=1000), {"batch": 32}
    raise SystemExit(f"unknown model {name!r}; known: llama, gpt2, bert, vit, llama508m")


def _build(name: str) -> tuple[Any, dict[str, Any], Any]:
    import transformers as tf

    torch.manual_seed(0)
    cfg, shape = _config(name)
    cls = {"llama": tf.LlamaForCausalLM, "llama508m": tf.LlamaForCausalLM,
           "gpt2": tf.GPT2LMHeadModel, "bert": tf.BertForMaskedLM,
           "vit": tf.ViTForImageClassification}[name]
    model = cls._from_config(cfg, attn_implementation="sdpa").to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    if name == "vit":
        b = shape["batch"]
        inputs = {"pixel_values": torch.randn(b, 3, 224, 224, generator=gen).to("cuda", torch.bfloat16),
                  "labels": torch.randint(0, 1000, (b,), generator=gen).cuda()}
    else:
        ids = torch.randint(0, cfg.vocab_size, (shape["batch"], shape["seq"]), generator=gen).cuda()
        mask = torch.ones_like(ids)
        if name == "bert":
            mask[:, -shape["seq"] // 4:] = 0
        inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if shape.get("adamw") else None
    return model, inputs, opt


def _step(model: Any, inputs: dict[str, Any], opt: Any) -> None:
    model.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    if opt is not None:
        opt.step()


def _compiled(step: Any) -> int:
    """Run ``step`` until, after its compiles finish, a run of it hands nothing back to
    torch for a compile (gemsops' kernels reach their later kernels one step at a time
    while earlier ones compile in the background); returns how many runs that took."""
    for runs in range(1, 13):
        with gemsops.record() as rec:
            step()
        wait_compiles()
        if not any(reason == COMPILING for _, reason in rec.fallbacks):
            return runs
    print(f"still compiling after 12 runs: {rec.summary()}", file=sys.stderr, flush=True)
    return -1


def _median_ms(model: Any, inputs: dict[str, Any], opt: Any, repeats: int,
               gems: bool = False) -> float:
    for _ in range(3):
        _step(model, inputs, opt)
    if gems:
        _compiled(lambda: _step(model, inputs, opt))
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        _step(model, inputs, opt)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def steady(models: list[str], repeats: int, unused: tuple[str, ...] = ()) -> None:
    for name in models:
        model, inputs, opt = _build(name)
        torch_ms = _median_ms(model, inputs, opt, repeats)
        with gemsops.use_gems(unused=unused):
            gems_ms = _median_ms(model, inputs, opt, repeats, gems=True)
        torch_again = _median_ms(model, inputs, opt, repeats)
        from gemshal.kernel import stats

        launchers = stats()
        slow = sorted((r for r in launchers if r["jit"] > 20 or r["disabled"]),
                      key=lambda r: -r["jit"])[:8]
        print(json.dumps({"model": name, "unused": list(unused), "torch_ms": round(torch_ms, 2),
                          "torch_again_ms": round(torch_again, 2),
                          "gemsops_ms": round(gems_ms, 2),
                          "ratio": round(gems_ms / min(torch_ms, torch_again), 3),
                          "compile": compile_mode(),
                          "direct_off": sum(1 for r in launchers if r["disabled"]),
                          "jit_heavy": slow}), flush=True)
        del model, inputs, opt
        torch.cuda.empty_cache()


def first(name: str, side: str, profile: str | None = None) -> None:
    """The first step's wall time; with ``profile``, that step runs under cProfile (the
    main thread only) and the functions by cumulative and by own time go to that file."""
    import cProfile
    import pstats

    t0 = time.perf_counter()
    model, inputs, opt = _build(name)
    torch.cuda.synchronize()
    built = time.perf_counter() - t0
    out: dict[str, Any] = {"model": name, "side": side, "build_s": round(built, 2),
                           "compile": compile_mode()}
    with gemsops.use_gems() if side == "gemsops" else _null(), gemsops.record() as rec:
        prof = cProfile.Profile() if profile else None
        t = time.perf_counter()
        if prof is not None:
            prof.enable()
        _step(model, inputs, opt)
        torch.cuda.synchronize()
        out["first_step_s"] = round(time.perf_counter() - t, 2)
        if prof is not None and profile is not None:
            prof.disable()
            with open(profile, "w") as f:
                stats = pstats.Stats(prof, stream=f)
                stats.sort_stats("cumulative").print_stats(45)
                stats.sort_stats("tottime").print_stats(45)
        print(json.dumps(out), flush=True)
        if side == "gemsops":
            out["first_step_handed_back_compiling"] = sum(
                n for (_, reason), n in rec.fallbacks.items() if reason == COMPILING)
            wait_compiles()
            # from the start of the first step until every compile it started is done
            out["first_step_compiles_done_s"] = round(time.perf_counter() - t, 2)
            t = time.perf_counter()
            out["steps_until_compiled"] = _compiled(lambda: _step(model, inputs, opt))
            out["until_compiled_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        _step(model, inputs, opt)
        torch.cuda.synchronize()
        out["next_step_s"] = round(time.perf_counter() - t, 3)
    print(json.dumps(out), flush=True)


def generate(tokens: int) -> None:
    model, _inputs, _opt = _build("llama")
    model.eval()
    ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(2)).cuda()
    kw = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    out: dict[str, Any] = {}
    with torch.no_grad():
        with gemsops.use_gems():
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            torch.cuda.synchronize()
            out["gemsops_first_8_tokens_s"] = round(time.perf_counter() - t, 2)
            out["gemsops_first_8_tokens_compiling"] = compile_mode() == "background"
            out["gemsops_runs_until_compiled"] = _compiled(
                lambda: model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False))
        for side in ("torch", "gemsops", "torch_again"):
            ctx = gemsops.use_gems() if side == "gemsops" else _null()
            with ctx:
                model.generate(ids, **kw)  # warm
                if side == "gemsops":
                    _compiled(lambda: model.generate(ids, **kw))
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                out[f"{side}_tokens_per_s"] = round(tokens / (time.perf_counter() - t), 1)
    out["ratio"] = round(out["gemsops_tokens_per_s"] / max(out["torch_tokens_per_s"],
                                                           out["torch_again_tokens_per_s"]), 3)
    print(json.dumps(out), flush=True)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def profile_generate(tokens: int) -> None:
    """cProfile of gemsops' greedy decode (after a warm-up), by own time, and the calls."""
    import cProfile
    import pstats

    from gemsops import registry

    model, _inputs, _opt = _build("llama")
    model.eval()
    ids = torch.randint(0, 32000, (1, 32), generator=torch.Generator().manual_seed(2)).cuda()
    kw = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    with torch.no_grad(), gemsops.use_gems():
        model.generate(ids, **kw)
        _compiled(lambda: model.generate(ids, **kw))
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        with registry.record() as rec:
            prof.enable()
            model.generate(ids, **kw)
            torch.cuda.synchronize()
            prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(35)
    print(rec.summary())


def _native_hits() -> int:
    """Calls the native replay served so far (GEMS_NATIVE=1), over every overload."""
    from gemsops import native

    return sum(v["hits"] for v in native.stats().values()) if native.available() else 0


def _native_by_overload() -> dict[str, int]:
    """Native hits so far per overload."""
    from gemsops import native

    if not native.available():
        return {}
    return {k: v["hits"] for k, v in native.stats().items()}


def kernels(models: list[str], top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    from gemshal.kernel import stats

    for name in models:
        model, inputs, opt = _build(name)
        for side in ("torch", "gemsops"):
            ctx = gemsops.use_gems() if side == "gemsops" else _null()
            with ctx:
                for _ in range(3):
                    _step(model, inputs, opt)
                if side == "gemsops":
                    _compiled(lambda: _step(model, inputs, opt))
                torch.cuda.synchronize()
                issue = []
                for _ in range(5):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    _step(model, inputs, opt)
                    issue.append((time.perf_counter() - t) * 1e3)
                    torch.cuda.synchronize()
                wall = _median_ms(model, inputs, opt, 5)
                hits0 = _native_hits()
                by0 = _native_by_overload()
                with profile(activities=[ProfilerActivity.CUDA]) as prof, \
                        gemsops.record() as rec:
                    for _ in range(3):
                        _step(model, inputs, opt)
                    torch.cuda.synchronize()
                native_hits = _native_hits() - hits0
                by1 = _native_by_overload()
            rows = []
            total = 0.0
            for ev in prof.key_averages():
                dt = getattr(ev, "self_device_time_total", 0.0) or getattr(
                    ev, "self_cuda_time_total", 0.0)
                if dt <= 0:
                    continue
                total += dt
                rows.append((dt / 3 / 1e3, ev.count // 3, ev.key[:90]))
            rows.sort(reverse=True)
            print(json.dumps({"model": name, "side": side, "wall_ms": round(wall, 2),
                              "issue_ms": round(statistics.median(issue), 2),
                              "device_ms": round(total / 3 / 1e3, 2),
                              "kernels_per_step": sum(r[1] for r in rows),
                              "served_per_step": sum(rec.served.values()) // 3,
                              "native_per_step": native_hits // 3,
                              "handed_back_per_step": sum(rec.fallbacks.values()) // 3,
                              "direct_off": sum(1 for r in stats() if r["disabled"])}),
                  flush=True)
            if side == "gemsops" and rec.fallbacks:
                print("  handed back:", dict(rec.fallbacks.most_common(8)), flush=True)
            if side == "gemsops":
                # Served calls that took the Python path (served less native hits), per step.
                python = {k: (n - by1.get(k, 0) + by0.get(k, 0)) // 3
                          for k, n in rec.served.items()}
                python = {k: n for k, n in sorted(python.items(), key=lambda kv: -kv[1]) if n}
                print("  python path per step:", python, flush=True)
            for ms, count, key in rows[:top]:
                print(f"  {ms:8.3f} ms  {count:5d}x  {key}", flush=True)
        del model, inputs, opt
        torch.cuda.empty_cache()


def hostprof(name: str, out_file: str | None) -> None:
    """Where a steady step's host time goes: forward and backward timed apart, for each
    side, with autograd's device threads and without them (backward on this thread),
    then a cProfile of gemsops' step with backward on this thread (cProfile sees one)."""
    import cProfile
    import pstats

    model, inputs, opt = _build(name)

    def parts() -> dict[str, float]:
        fw, bw = [], []
        for _ in range(7):
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = model(**inputs).loss
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            loss.backward()
            torch.cuda.synchronize()
            fw.append((t2 - t) * 1e3)
            bw.append((time.perf_counter() - t2) * 1e3)
        return {"forward_ms": round(statistics.median(fw), 2),
                "backward_ms": round(statistics.median(bw), 2)}

    for side in ("torch", "gemsops"):
        ctx = gemsops.use_gems() if side == "gemsops" else _null()
        with ctx:
            for _ in range(3):
                _step(model, inputs, opt)
            if side == "gemsops":
                _compiled(lambda: _step(model, inputs, opt))
            row: dict[str, Any] = {"model": name, "side": side, **parts()}
            with torch.autograd.set_multithreading_enabled(False):
                one = parts()
            row["one_thread_forward_ms"] = one["forward_ms"]
            row["one_thread_backward_ms"] = one["backward_ms"]
            print(json.dumps(row), flush=True)
            if side == "gemsops":
                prof = cProfile.Profile()
                with torch.autograd.set_multithreading_enabled(False):
                    prof.enable()
                    for _ in range(3):
                        _step(model, inputs, opt)
                    torch.cuda.synchronize()
                    prof.disable()
                with open(out_file or "/dev/stdout", "w") as f:
                    stats = pstats.Stats(prof, stream=f)
                    stats.sort_stats("tottime").print_stats(60)
                    stats.sort_stats("cumulative").print_stats(90)


def workload(models: list[str], decode: bool = True) -> None:
    """One gemsops training step of each model, then (``decode``) greedy decode of the
    small Llama at batches 1 and 8: the workload ``gemsops tune`` benchmarks for the sm90
    tables."""
    for name in models:
        model, inputs, opt = _build(name)
        with gemsops.use_gems():
            t = time.perf_counter()
            _step(model, inputs, opt)
            torch.cuda.synchronize()
        print(f"tune workload: {name} step {time.perf_counter() - t:.1f} s", flush=True)
        del model, inputs, opt
        torch.cuda.empty_cache()
    if not decode:
        return
    model, _inputs, _opt = _build("llama")
    model.eval()
    for batch in (1, 8):
        ids = torch.randint(0, 32000, (batch, 64), generator=torch.Generator().manual_seed(3)).cuda()
        with torch.no_grad(), gemsops.use_gems():
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
            torch.cuda.synchronize()
        print(f"tune workload: generate batch {batch} {time.perf_counter() - t:.1f} s", flush=True)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("steady", "first", "generate", "workload", "profile",
                                           "kernels", "hostprof"))
    p.add_argument("model", nargs="?", default="llama")
    p.add_argument("--models", default="llama,gpt2,bert,vit,llama508m")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--no-decode", action="store_true",
                   help="workload: the training steps only, no generate")
    p.add_argument("--side", choices=("gemsops", "torch"), default="gemsops")
    p.add_argument("--profile", help="first: cProfile the first step into this file")
    p.add_argument("--unused", default="",
                   help="steady: op names left to torch (comma-separated), as use_gems(unused=)")
    a = p.parse_args(argv)
    if a.what == "steady":
        steady(a.models.split(","), a.repeats, tuple(n for n in a.unused.split(",") if n))
    elif a.what == "first":
        first(a.model, a.side, a.profile)
    elif a.what == "profile":
        profile_generate(a.tokens)
    elif a.what == "hostprof":
        hostprof(a.model, a.profile)
    elif a.what == "kernels":
        kernels(a.models.split(","), a.top)
    elif a.what == "workload":
        workload(a.models.split(","), not a.no_decode)
    else:
        generate(a.tokens)


if __name__ == "__main__":
    main(sys.argv[1:])
