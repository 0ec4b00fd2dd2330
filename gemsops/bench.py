"""``gemsops bench``: gemsops against torch's own kernels and FlagGems, side by side.

Every case builds its inputs once; torch, gemsops (through ``use_gems``, the path
users take) and FlagGems (through ``flag_gems.use_gems()`` when installed) run the
same torch call on the same tensors in the same process, each warmed up, timed with
``triton.testing.do_bench`` (median). Bandwidth-bound cases report GB/s and the
percentage of the device-to-device copy bandwidth measured in the same run; matmuls
report TFLOP/s. Without an accelerator it runs a tiny mode that only proves the
harness works. After the rows (or alone, with ``--model``) it runs the model case of
``gemsops.bench_model``: a Llama-style training step, eager and replayed from a graph.
The cases themselves are built in :mod:`gemsops.bench_cases`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import torch

import gemshal
from gemshal.kernel import tuned
from gemshal.kernel.compile import wait_compiles
from gemsops.bench_cases import BenchCase, Thunk, cases
from gemsops.bench_host import host_overhead, host_profile, import_cost, kernel_profile
from gemsops.bench_sides import flag_gems, sides_of, timer_for

__all__ = ["BenchCase", "add_parser", "cases", "main", "output_problem"]


def _progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = width * done // max(total, 1)
    bar = "#" * filled + "-" * (width - filled)
    sys.stderr.write(f"\r[{bar}] {done}/{total} {label[:40]:<40}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _copy_bandwidth(dev: torch.device, timer: Callable[[Thunk], float], tiny: bool) -> float:
    n = 2**14 if tiny else 2**29  # 1 GiB of bf16-sized elements, as fp16
    x = torch.empty(n, device=dev, dtype=torch.float16).fill_(1.0)
    y = torch.empty_like(x)
    ms = timer(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9


def run_cases(
    selected: list[BenchCase],
    *,
    interpreter: bool,
    dev: torch.device,
    on_row: Callable[[float, list[dict[str, Any]]], None] = lambda copy, rows: None,
    profile: TextIO | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """Time every case on every side; returns the copy bandwidth (GB/s) and the rows.

    ``on_row(copy_gbs, rows)`` is called after each case, so a run cut short still
    leaves the rows it finished. With ``profile``, each side of each case is also run
    under ``torch.profiler`` and its busiest kernels are written there.
    """
    timer = timer_for(interpreter)
    copy_gbs = _copy_bandwidth(dev, timer, interpreter)
    sides = sides_of(flag_gems())
    rows: list[dict[str, Any]] = []
    for i, case in enumerate(selected):
        _progress(i, len(selected), case.label)
        fn = case.make(dev)
        row: dict[str, Any] = {"op": case.op, "case": case.label, "dtype": str(case.dtype)[6:]}
        for side, context in sides.items():
            with context():
                fn()  # warm-up: compiles and tunes gemsops kernels once
                if side != "torch":
                    # A kernel compiling in the background hands its calls to torch until
                    # it is done: timed before then, part of the side would be torch's.
                    wait_compiles()
                    fn()
                ms = timer(fn)
            row[f"{side}_ms"] = ms
            if case.bytes:
                row[f"{side}_gbs"] = case.bytes / (ms * 1e-3) / 1e9
            if case.flops:
                row[f"{side}_tflops"] = case.flops / (ms * 1e-3) / 1e12
        if profile is not None:
            for side, context in sides.items():
                with context():
                    profile.write(
                        f"== {case.label} ({row['dtype']}): {side}, "
                        f"{row[f'{side}_ms'] * 1e3:.1f} us per call\n"
                    )
                    profile.write(kernel_profile(fn) + "\n\n")
                    profile.flush()
        row["vs_torch"] = row["torch_ms"] / row["gemsops_ms"]
        if "flag_gems_ms" in row:
            row["vs_flag_gems"] = row["flag_gems_ms"] / row["gemsops_ms"]
        if case.bytes:
            row["pct_copy"] = 100.0 * row["gemsops_gbs"] / copy_gbs
        rows.append(row)
        on_row(copy_gbs, rows)
        del fn
    _progress(len(selected), len(selected), "done")
    return copy_gbs, rows


def _table(rows: list[dict[str, Any]], copy_gbs: float) -> str:
    head = (
        f"{'case':<36} {'dtype':<9} {'torch ms':>9} {'gems ms':>9} {'x torch':>8} "
        f"{'x FG':>7} {'perf':>14} {'%copy':>6}"
    )
    lines = [f"copy bandwidth: {copy_gbs:.0f} GB/s", head, "-" * len(head)]
    for r in rows:
        perf = (
            f"{r['gemsops_tflops']:.0f} TFLOP/s"
            if "gemsops_tflops" in r
            else (f"{r['gemsops_gbs']:.0f} GB/s")
        )
        vs_fg = f"{r['vs_flag_gems']:.2f}" if "vs_flag_gems" in r else "-"
        pct = f"{r['pct_copy']:.0f}" if "pct_copy" in r else "-"
        lines.append(
            f"{r['case']:<36} {r['dtype']:<9} {r['torch_ms']:>9.4f} {r['gemsops_ms']:>9.4f} "
            f"{r['vs_torch']:>8.2f} {vs_fg:>7} {perf:>14} {pct:>6}"
        )
    for key, name in (("vs_torch", "torch"), ("vs_flag_gems", "FlagGems")):
        ratios = [r[key] for r in rows if r.get(key, 0) > 0]
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            lines.append(f"geometric mean vs {name}: {geo:.3f}x over {len(ratios)} rows")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: str, notes: list[str] | None = None) -> bool:
    """Speedup and bandwidth bars per row; ``notes`` (the model case's lines) as text below."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return False
    notes = notes or []
    text_h = 0.16 * len(notes) + (0.2 if notes else 0.0)
    if not rows:
        fig = plt.figure(figsize=(16, text_h))
        fig.text(0.01, 0.5, "\n".join(notes), family="monospace", fontsize=9, va="center")
        fig.savefig(path, dpi=110)
        return True
    labels = [r["case"] for r in rows]
    y = list(range(len(rows)))
    height_in = 0.4 * len(rows) + 2 + text_h
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, height_in))
    peer = any("vs_flag_gems" in r for r in rows)
    height = 0.4 if peer else 0.8
    ax1.barh(
        [i - height / 2 if peer else i for i in y],
        [r["vs_torch"] for r in rows],
        height=height,
        color="tab:blue",
        label="gemsops / torch",
    )
    if peer:
        ax1.barh(
            [i + height / 2 for i in y],
            [r.get("vs_flag_gems", 0) for r in rows],
            height=height,
            color="tab:orange",
            label="gemsops / FlagGems",
        )
    ax1.set_yticks(y, labels)
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.set_xlabel("speedup (higher is better)")
    ax1.legend()
    ax1.invert_yaxis()
    ax2.barh(y, [r.get("pct_copy", 0) for r in rows], color="tab:green")
    ax2.set_yticks(y, [""] * len(y))
    ax2.axvline(90, color="r", lw=0.8, ls="--")
    ax2.set_xlabel("gemsops bandwidth, % of copy")
    ax2.invert_yaxis()
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), family="monospace", fontsize=9, va="bottom")
    fig.tight_layout(rect=(0.0, text_h / height_in, 1.0, 1.0))
    fig.savefig(path, dpi=110)
    return True


def add_parser(sub: Any) -> None:
    """Add the ``bench`` subcommand to the gemsops command line."""
    p = sub.add_parser("bench", help="time gemsops against torch (and FlagGems when installed)")
    p.add_argument(
        "--suite",
        choices=("kernels", "models"),
        default="kernels",
        help="kernels: the kernel rows (default); models: the ops of Llama 3.2 1B, Llama 3.1 "
        "8B, GPT-2, BERT-base and ViT-B/16 at their shapes, eager and graph-replayed",
    )
    p.add_argument("--ops", help="comma-separated op names to run (default: all)")
    p.add_argument("--dtypes", help="comma-separated dtypes to run, e.g. bfloat16,float32")
    p.add_argument(
        "--match",
        metavar="REGEX",
        help="run only the cases whose label matches, e.g. '^(mm|linear) (1|4|16)x'",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of speedups and bandwidth")
    p.add_argument(
        "--no-host", action="store_true", help="skip the host-overhead and import timings"
    )
    p.add_argument(
        "--profile-host",
        metavar="PATH",
        help="also write a cProfile of tiny adds through use_gems (where host time goes)",
    )
    p.add_argument(
        "--profile-kernels",
        metavar="PATH",
        help="also write torch.profiler's busiest kernels per case and side (where time goes)",
    )
    p.add_argument(
        "--tiny", action="store_true", help="the tiny cases only (the default without a GPU)"
    )
    model = p.add_mutually_exclusive_group()
    model.add_argument(
        "--model",
        action="store_true",
        help="only the model case: a Llama-style training step, eager and graph-replayed",
    )
    model.add_argument(
        "--no-model",
        action="store_true",
        help="skip the model case (it runs after the rows unless --ops or --dtypes is given)",
    )
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="print the table (and with --plot, draw the plot) of a saved run; time nothing",
    )
    p.add_argument(
        "--host",
        action="store_true",
        help="only host time per served op beside torch's (without a GPU: the launch stubbed)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="with --host: a cProfile of each case's gemsops side (where the microseconds go)",
    )
    p.add_argument(
        "--calls", type=int, default=500, help="with --host: calls per timing (default 500)"
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="only the model case's first step in fresh processes: torch, gemsops with an "
        "empty Triton cache, then with the cache that run filled",
    )
    p.set_defaults(run=main)


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _filtered(all_cases: list[BenchCase], args: argparse.Namespace) -> Iterator[BenchCase]:
    ops = set(_names(args.ops)) if args.ops else None
    dtypes = {d.removeprefix("torch.") for d in _names(args.dtypes)} if args.dtypes else None
    known_ops = {c.op for c in all_cases}
    if ops is not None and not ops <= known_ops:
        raise SystemExit(
            f"gemsops bench: unknown op(s) {sorted(ops - known_ops)}; known: {sorted(known_ops)}"
        )
    known_dtypes = {str(c.dtype)[6:] for c in all_cases}
    if dtypes is not None and not dtypes <= known_dtypes:
        raise SystemExit(
            f"gemsops bench: unknown dtype(s) {sorted(dtypes - known_dtypes)}; "
            f"known: {sorted(known_dtypes)}"
        )
    try:
        pattern = re.compile(args.match) if args.match else None
    except re.error as exc:
        raise SystemExit(f"gemsops bench: --match {args.match!r}: not a regex: {exc}") from exc
    selected = [
        case
        for case in all_cases
        if (ops is None or case.op in ops)
        and (dtypes is None or str(case.dtype)[6:] in dtypes)
        and (pattern is None or pattern.search(case.label))
    ]
    if not selected:
        raise SystemExit(
            f"gemsops bench: no case has op(s) {sorted(ops or known_ops)} "
            f"in dtype(s) {sorted(dtypes or known_dtypes)}"
            + (f" with a label matching {args.match!r}" if pattern else "")
        )
    yield from selected


def _read_json(path: str) -> dict[str, Any]:
    """A saved run, or a one-line exit naming the file and what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
    except OSError as exc:
        raise SystemExit(
            f"gemsops bench: --from-json {path}: cannot read it: {exc.strerror or exc}"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SystemExit(f"gemsops bench: --from-json {path}: not valid JSON: {exc}") from exc
    keys: dict[str, type | tuple[type, ...]] = {
        "device": dict,
        "torch": str,
        "triton": str,
        "rows": list,
        "copy_gbs": (int, float),
    }
    if not isinstance(result, dict):
        wrong = list(keys)
    else:
        wrong = [k for k, kind in keys.items() if not isinstance(result.get(k), kind)]
    if wrong:
        raise SystemExit(
            f"gemsops bench: --from-json {path}: not a saved gemsops bench run "
            f"(missing or malformed: {', '.join(wrong)}); write one with "
            "`gemsops bench --json PATH`"
        )
    saved: dict[str, Any] = result
    return saved


def _report(result: dict[str, Any]) -> None:
    dev = result["device"]
    print(
        f"gemsops bench on {dev.get('name')} ({dev.get('vendor')}, {dev.get('arch')}); "
        f"torch {result['torch']}, triton {result['triton']}, "
        f"FlagGems {result.get('flag_gems') or 'not installed'}"
    )
    if result["rows"]:
        print(_table(result["rows"], result["copy_gbs"]))
    for r in result.get("host_us", []):
        print(
            "host "
            + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else str(v) for k, v in r.items())
        )
    if "import" in result:
        print("import " + ", ".join(f"{k} {v:.2f}" for k, v in result["import"].items()))
    for line in _model_lines(result):
        print(line)


def _model_lines(result: dict[str, Any]) -> list[str]:
    if "model" not in result:
        return []
    from gemsops.bench_model import model_lines

    return model_lines(result["model"])


def _save(result: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=2)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and print the table; write JSON and a plot when asked."""
    for path in (args.json, args.plot):
        problem = output_problem(path)
        if problem:
            raise SystemExit(f"gemsops bench: {problem}")
    if args.cold:
        from gemsops import bench_cold

        bench_cold.report(bench_cold.measure_cold(), args.json)
        return 0
    if args.host:
        from gemsops import bench_host

        if args.calls < 1:
            raise SystemExit(f"gemsops bench: --calls must be at least 1; got {args.calls}")
        host = bench_host.measure_host(calls=args.calls, profile=args.profile, match=args.match)
        bench_host.report(host, args.json)
        return 0
    if args.suite == "models":
        return _models_suite(args)
    result = _read_json(args.from_json) if args.from_json else measure(args)
    _report(result)
    if args.plot and not _plot(result["rows"], args.plot, _model_lines(result)):
        print("gemsops bench: matplotlib is not installed; no plot written", file=sys.stderr)
    return 0


def _models_suite(args: argparse.Namespace) -> int:
    """``--suite models``: time the model-shape cases, print the table, write JSON."""
    import triton

    from gemsops import bench_suite
    from gemsops.bench_model import graph_skip_reason

    dev = gemshal.current_device()
    selected = list(_filtered(bench_suite.suite_cases(tiny=dev.interpreter or args.tiny), args))
    peer = flag_gems()
    result: dict[str, Any] = {
        "suite": "models",
        "device": dev.as_dict(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "flag_gems": getattr(peer, "__version__", None) if peer else None,
        "rows": [],
        "graph_skipped": graph_skip_reason(),
    }

    def on_row(rows: list[dict[str, Any]]) -> None:
        result["rows"] = rows
        _save(result, args.json)

    bench_suite.measure_suite(
        selected, dev=dev.torch_device, interpreter=dev.interpreter, on_row=on_row
    )
    result["tuned"] = tuned()
    _save(result, args.json)
    print(
        f"gemsops bench --suite models on {dev.as_dict().get('name')}; torch "
        f"{result['torch']}, triton {result['triton']}, FlagGems "
        f"{result['flag_gems'] or 'not installed'}"
    )
    for line in bench_suite.suite_lines(result["rows"], result["graph_skipped"]):
        print(line)
    return 0


def output_problem(path: str | None) -> str | None:
    """Why ``path`` cannot be written (checked before a run, not after it), or None."""
    if path is None:
        return None
    import os

    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        return f"cannot write {path!r}: it is a directory"
    if not os.path.isdir(folder):
        return f"cannot write {path!r}: folder {folder!r} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(full) and not os.access(full, os.W_OK)):
        return f"cannot write {path!r}: permission denied"
    return None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time host overhead and import cost, the selected cases, then the model case.

    With ``--model``, the model case alone; it also runs after a full run of the rows
    (no ``--ops``, ``--dtypes`` or ``--no-model``).
    """
    import triton

    from gemsops import bench_model

    dev = gemshal.current_device()
    tiny = dev.interpreter or args.tiny
    peer = flag_gems()
    result: dict[str, Any] = {
        "device": dev.as_dict(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "flag_gems": getattr(peer, "__version__", None) if peer else None,
        "copy_gbs": 0.0,
        "rows": [],
    }

    def on_row(copy_gbs: float, rows: list[dict[str, Any]]) -> None:
        result["copy_gbs"], result["rows"], result["tuned"] = copy_gbs, rows, tuned()
        _save(result, args.json)

    model_cfg = bench_model.TINY_CONFIG if tiny else bench_model.GPU_CONFIG
    if args.model:
        result["model"] = bench_model.measure_model(model_cfg)
        result["tuned"] = tuned()
        _save(result, args.json)
        return result
    selected = list(_filtered(cases(tiny=tiny), args))
    if not args.no_host and not dev.interpreter:
        # First: they take seconds, and a run cut short by a time limit still has them.
        result["host_us"] = host_overhead(dev.torch_device)
        result["import"] = import_cost()
        _save(result, args.json)
        if args.profile_host:
            host_profile(dev.torch_device, args.profile_host)
    with contextlib.ExitStack() as stack:
        profile = (
            stack.enter_context(open(args.profile_kernels, "w")) if args.profile_kernels else None
        )
        run_cases(
            selected,
            interpreter=dev.interpreter,
            dev=dev.torch_device,
            on_row=on_row,
            profile=profile,
        )
    result["tuned"] = tuned()
    _save(result, args.json)
    if not (args.no_model or args.ops or args.dtypes or args.match):
        result["model"] = bench_model.measure_model(model_cfg)
        result["tuned"] = tuned()
        _save(result, args.json)
    return result
