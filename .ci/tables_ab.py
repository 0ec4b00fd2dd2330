"""Two tuning sources side by side in one process: the shipped tables against a file
(issue 23's 3% rule, read without the 35% swing of torch's own speed between processes).

    GEMS_COMPILE=wait python3 .ci/tables_ab.py --b tuned.toml [--what bench,models]
        [--models llama,gpt2,bert,vit] [--rounds 3] [--json out.json]

``--b`` is a tuning file written by ``gemsops tune`` in a runtime-autotuned run
(``GEMS_AUTOTUNE=all``), so its rows are the configs runtime autotuning chose; side
``a`` is what a user gets (``GEMS_TUNE_CONFIG`` unset: the shipped tables). Each switch
sets or unsets ``GEMS_TUNE_CONFIG`` and clears gemshal's tuning cache (a new generation:
every kernel resolves its config again and the native recipes are dropped), then warms
up. Per bench kernel row: ``--rounds`` rounds of torch's call and both sides (the order
of the sides alternating by round), each a ``triton.testing.do_bench`` median. Per model:
torch's steady step, then rounds of both sides (``.ci/steps.py``'s median of steady
steps after every compile is done). Reported per row: each side's median, ``a/b``
(above 1: the shipped tables are slower), and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton.testing

import gemsops
from gemshal import tune
from gemsops.bench import cases

_HERE = Path(__file__).resolve().parent


def _steps() -> Any:
    spec = importlib.util.spec_from_file_location("gems_ci_steps", _HERE / "steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


A_FILE: list[str | None] = [None]  # --a: side a's file (None: the shipped tables)


def _use(side: str, b_file: str) -> None:
    """Make ``side``'s tuning source current: a new tuning generation."""
    chosen = A_FILE[0] if side == "a" else b_file
    if chosen is None:
        os.environ.pop("GEMS_TUNE_CONFIG", None)
    else:
        os.environ["GEMS_TUNE_CONFIG"] = chosen
    tune.clear_cache()


def _orders(rounds: int) -> list[tuple[str, str]]:
    return [("a", "b") if r % 2 == 0 else ("b", "a") for r in range(rounds)]


def _row(label: str, times: dict[str, list[float]], paired: list[float]) -> dict[str, Any]:
    med = {k: statistics.median(v) for k, v in times.items() if v}
    return {"case": label, **{f"{k}_ms": round(v, 5) for k, v in med.items()},
            "a_over_b": round(med["a"] / med["b"], 4),
            "paired_a_over_b": round(statistics.median(paired), 4),
            "torch_spread": round(max(times["torch"]) / min(times["torch"]), 4)
            if times["torch"] else None}


def bench_rows(b_file: str, rounds: int, tiny: bool, limit: int | None,
               timer: Callable[[Callable[[], Any]], float]) -> list[dict[str, Any]]:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = []
    for case in cases(tiny=tiny)[:limit]:
        fn = case.make(dev)
        times: dict[str, list[float]] = {"torch": [], "a": [], "b": []}
        paired = []
        for order in _orders(rounds):
            times["torch"].append(timer(fn))
            got = {}
            for side in order:
                _use(side, b_file)
                with gemsops.use_gems():
                    got[side] = timer(fn)
                times[side].append(got[side])
            paired.append(got["a"] / got["b"])
        row = _row(f"{case.label} {str(case.dtype).removeprefix('torch.')}", times, paired)
        out.append(row)
        print(json.dumps(row), flush=True)
        del fn
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _device_ms(steps: Any, model: Any, inputs: Any, opt: Any, gems: bool) -> float:
    """One side's device time a step (the profiler's kernel time over 3 steps, after
    the compiles are done): what the tables change, without the host's noise."""
    from torch.profiler import ProfilerActivity, profile

    steps._median_ms(model, inputs, opt, 2, gems=gems)  # compiles finished, warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            steps._step(model, inputs, opt)
        torch.cuda.synchronize()
    total = 0.0
    for ev in prof.key_averages():
        dt = getattr(ev, "self_device_time_total", 0.0) or getattr(ev, "self_cuda_time_total", 0)
        total += max(float(dt), 0.0)
    return total / 3 / 1e3


def _timed(steps: Any, model: Any, inputs: Any, opt: Any, repeats: int, measure: str,
           gems: bool) -> float:
    if measure == "device":
        return _device_ms(steps, model, inputs, opt, gems)
    return float(steps._median_ms(model, inputs, opt, repeats, gems=gems))


def model_rows(b_file: str, rounds: int, models: list[str], repeats: int,
               profile: bool = False, measure: str = "wall") -> list[dict[str, Any]]:
    steps = _steps()
    out = []
    for name in models:
        model, inputs, opt = steps._build(name)
        times: dict[str, list[float]] = {"torch": [], "a": [], "b": []}
        paired = []
        for order in _orders(rounds):
            times["torch"].append(_timed(steps, model, inputs, opt, repeats, measure, False))
            got = {}
            for side in order:
                _use(side, b_file)
                with gemsops.use_gems():
                    got[side] = _timed(steps, model, inputs, opt, repeats, measure, True)
                times[side].append(got[side])
            paired.append(got["a"] / got["b"])
        row = _row(name, times, paired)
        out.append(row)
        print(json.dumps(row), flush=True)
        if profile:
            for side in ("a", "b"):
                _use(side, b_file)
                with gemsops.use_gems():
                    steps._median_ms(model, inputs, opt, 3, gems=True)
                    print(json.dumps({"case": name, "side": side,
                                      **_profiled(steps, model, inputs, opt)}), flush=True)
        del model, inputs, opt
        torch.cuda.empty_cache()
    return out


def _profiled(steps: Any, model: Any, inputs: Any, opt: Any) -> dict[str, Any]:
    """Where one side's step goes: device time (the profiler, 3 steps), the top kernels,
    the launches off the direct path, the native replay's hits, what was handed back."""
    from torch.profiler import ProfilerActivity, profile

    from gemshal.kernel import stats

    hits0 = steps._native_hits()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, gemsops.record() as rec:
        for _ in range(3):
            steps._step(model, inputs, opt)
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        dt = getattr(ev, "self_device_time_total", 0.0) or getattr(ev, "self_cuda_time_total", 0)
        if dt > 0:
            rows.append((round(dt / 3 / 1e3, 3), ev.count // 3, ev.key[:70]))
    rows.sort(reverse=True)
    return {"device_ms": round(sum(r[0] for r in rows), 2), "top": rows[:12],
            "native_per_step": (steps._native_hits() - hits0) // 3,
            "handed_back": {" ".join(map(str, k)) if isinstance(k, tuple) else str(k): v
                            for k, v in rec.fallbacks.most_common(6)},
            "direct_off": [(r["kernel"], r["disabled"]) for r in stats() if r["disabled"]][:8]}


def _do_bench(fn: Callable[[], Any]) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _summary(what: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    ratios = [r["paired_a_over_b"] for r in rows]
    worst = max(rows, key=lambda r: r["paired_a_over_b"])
    side_a = A_FILE[0] or "shipped"
    print(f"{what}: a/b (a: {side_a}) over {len(rows)} rows: "
          f"median {statistics.median(ratios):.4f}, max {worst['paired_a_over_b']:.4f} "
          f"({worst['case']}), rows above 1.03: {sum(r > 1.03 for r in ratios)}", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--b", required=True, help="the tuning file to set against the shipped tables")
    p.add_argument("--a", default=None,
                   help="a file standing in for the shipped tables on side a (an older "
                        "nvidia-sm90.toml, for a before/after in one call)")
    p.add_argument("--what", default="bench,models")
    p.add_argument("--measure", choices=("wall", "device"), default="wall",
                   help="models: a step's wall time (median of --repeats), or its device "
                        "time (the profiler's kernel time: host-bound steps on a noisy host)")
    p.add_argument("--models", default="llama,gpt2,bert,vit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="the bench's tiny rows (a CPU smoke run)")
    p.add_argument("--limit", type=int, help="the first N bench rows only")
    p.add_argument("--json")
    p.add_argument("--profile", action="store_true",
                   help="per model, each side's device time and top kernels (the profiler)")
    a = p.parse_args(argv)
    if not Path(a.b).is_file():
        p.error(f"--b {a.b!r}: no such file")
    if a.a is not None and not Path(a.a).is_file():
        p.error(f"--a {a.a!r}: no such file")
    A_FILE[0] = a.a
    parts = a.what.split(",")
    unknown = sorted(set(parts) - {"bench", "models"})
    if unknown:
        p.error(f"--what {unknown[0]!r}: valid parts are bench, models")
    result: dict[str, Any] = {"a": a.a or "shipped", "b": a.b}
    if "bench" in parts:
        timer = _do_bench if torch.cuda.is_available() else _wall
        result["bench"] = bench_rows(a.b, a.rounds, a.tiny, a.limit, timer)
        _summary("bench", result["bench"])
    if "models" in parts:
        result["models"] = model_rows(a.b, a.rounds, a.models.split(","), a.repeats,
                                      a.profile, a.measure)
        result["measure"] = a.measure
        _summary("models", result["models"])
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


def _wall(fn: Callable[[], Any]) -> float:
    import time

    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
