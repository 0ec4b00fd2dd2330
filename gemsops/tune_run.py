"""``gemsops tune``: run a workload once, benchmark every kernel and bucket it meets, and
write the choices as a tuning file.

    gemsops tune --out my-gpu.toml                    # the built-in model case
    gemsops tune --out my-gpu.toml --script train.py  # a user's script, run once
    GEMS_TUNE_CONFIG=my-gpu.toml python train.py      # later runs launch the tables

The workload runs under ``GEMS_AUTOTUNE=all`` inside ``gemsops.use_gems()``: the first
launch of each kernel at each size bucket benchmarks the op entry's candidate configs
(one progress line per bucket on stderr), and every later launch uses the choice. The
file written has, for every op met, the entry's configs and heuristics as they are now
plus a ``table`` row per bucket (rows of the current entry for buckets this run did not
meet are kept), so it can be given as ``GEMS_TUNE_CONFIG`` or shipped by a vendor
plugin as ``<vendor>-<arch>.toml``. While the workload runs the file is rewritten every
30 s with the buckets so far, and SIGINT or SIGTERM stop the run and write them, so a
run cut short (a time limit, a crash of the script, a kill) loses at most 30 s of it.

On the Triton interpreter nothing can be benchmarked: each bucket met gets the entry's
first config, which is what a CI test of this command checks.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gemshal
from gemshal import tune
from gemshal.kernel import AUTOTUNE_ENV, choices

__all__ = ["add_parser", "main", "render", "run"]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to a tuning file")


def _config_dict(config: Mapping[str, Any]) -> dict[str, Any]:
    # A chosen config as Triton's all_kwargs() gives it, less the launch keywords Triton
    # fills with its defaults (None) and the ones it adds on its own.
    return {k: v for k, v in config.items()
            if v is not None and k not in ("num_ctas", "maxnreg", "ir_override", "pre_hook")}


def render(rows: Iterable[Mapping[str, Any]], header: str) -> str:
    """A tuning file: per op met, its current entry with a ``table`` row per bucket."""
    by_op: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_op.setdefault(row["op"], []).append(row)
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines.append("")
    for op in sorted(by_op):
        entry = tune.lookup(op)
        data = entry.as_dict()
        table: dict[tuple[Any, ...], dict[str, Any]] = {}
        old_rows = data.get("table", [])
        assert isinstance(old_rows, list)
        for old in old_rows:
            assert isinstance(old, dict)
            key = tuple(sorted((k, v) for k, v in old.items() if k != "config"))
            table[key] = old
        configs = data.get("configs", [])
        assert isinstance(configs, list)
        for row in by_op[op]:
            if not row["when"]:
                # A kernel without a key has one bucket, which a table row cannot name:
                # its choice leads the configs instead (launched first, as a row would be).
                chosen = _config_dict(row["config"])
                configs = [chosen, *(c for c in configs if c != chosen)]
                continue
            new: dict[str, Any] = dict(row["when"])
            if row["dtype"] is not None:
                new["dtype"] = row["dtype"]
            new["config"] = _config_dict(row["config"])
            table[tuple(sorted((k, v) for k, v in new.items() if k != "config"))] = new
        lines.append(f"[ops.{op}]")
        lines.append(f"# from {entry.source.path}; {len(by_op[op])} buckets measured")
        lines.append("configs = [")
        for config in configs:
            lines.append(f"    {_toml_value(config)},")
        lines.append("]")
        if "interpreter" in data:
            lines.append(f"interpreter = {_toml_value(data['interpreter'])}")
        if table:
            lines.append("table = [")
            for item in table.values():
                lines.append(f"    {_toml_value(item)},")
            lines.append("]")
        heuristics = data.get("heuristics")
        if isinstance(heuristics, Mapping) and heuristics:
            lines.append(f"[ops.{op}.heuristics]")
            for name, rule in heuristics.items():
                lines.append(f"{name} = {_toml_value(rule)}")
        lines.append("")
    return "\n".join(lines)


def _model_case() -> None:
    from gemsops import bench_model

    dev = gemshal.current_device()
    cfg = bench_model.TINY_CONFIG if dev.interpreter else bench_model.GPU_CONFIG
    bench_model.run_once(cfg)


def workload(script: str | None, script_args: list[str]) -> Callable[[], None]:
    """The workload of ``gemsops tune`` and ``gemsops trace``: ``script`` run once as
    ``__main__`` with ``script_args`` as its arguments, or the built-in model case."""

    def run_script() -> None:
        assert script is not None
        saved = sys.argv
        sys.argv = [script, *(a for a in script_args if a != "--")]
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = saved

    return _model_case if script is None else run_script


def refusal(output: str | None, script: str | None) -> str | None:
    """Why a run with this output file and script cannot start (one line), or None."""
    from gemsops.bench import output_problem

    problem = output_problem(output) if output else None
    if problem:
        return problem
    if script is not None and not os.path.isfile(script):
        return f"no script at {script!r}"
    return None


class _Stopped(Exception):
    """The tuning run was asked to stop (SIGTERM, SIGINT): write what it measured."""


CHECKPOINT_S = 30.0
"""How often a running ``gemsops tune`` rewrites its output file with the buckets so far."""


def _measured(dev: gemshal.Device) -> list[dict[str, Any]]:
    """The rows to write for the buckets met so far: the benchmarked ones (on the
    interpreter, every bucket met with its entry's first config)."""
    met = choices()
    if dev.interpreter:
        out = []
        for row in met:
            first = tune.lookup(row["op"]).configs[0]
            out.append({**row, "how": "first", "config": first.to_triton().all_kwargs()})
        return out
    return [row for row in met if row["how"] == "benchmark"]


def _write(out: str, rows: list[dict[str, Any]], header: str) -> None:
    """Write the tuning file through a temporary file, so a reader (or a run killed while
    writing) never sees half a file."""
    tmp = f"{out}.partial"
    with open(tmp, "w") as f:
        f.write(render(rows, header))
    os.replace(tmp, out)


def _checkpoints(out: str, header: str, every: float) -> Callable[[], None]:
    """Start rewriting ``out`` every ``every`` seconds with the buckets measured so far
    (a run killed outright keeps its last checkpoint); returns the function that stops it."""
    done = threading.Event()
    dev = gemshal.current_device()
    written = [-1]

    def loop() -> None:
        while not done.wait(every):
            try:
                rows = _measured(dev)
                if len(rows) != written[0]:
                    _write(out, rows, header + "\na checkpoint: the run had not finished")
                    written[0] = len(rows)
            except Exception:  # read while the run changes it: try again next time
                continue

    thread = threading.Thread(target=loop, name="gemsops-tune-checkpoint", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()

    return stop


def run(script: str | None, script_args: list[str], out: str | None = None,
        header: str = "", every: float = CHECKPOINT_S) -> list[dict[str, Any]]:
    """Run the workload once under ``GEMS_AUTOTUNE=all`` and ``use_gems()``; the buckets met.

    With ``out``, the file is rewritten every ``every`` seconds while the workload runs
    (the buckets so far, under ``header``), so a run killed outright keeps them.
    Interpreted kernels are pinned, so there each bucket's row is the entry's first config.
    """
    from gemsops import registry

    os.environ[AUTOTUNE_ENV] = "all"
    tune.clear_cache()  # kernels resolved before take the new policy
    dev = gemshal.current_device()

    def stop(signum: int, _frame: Any) -> None:
        raise _Stopped(signal.Signals(signum).name)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop_checkpoints = _checkpoints(out, header, every) if out else None
    try:
        with registry.use_gems():
            workload(script, script_args)()
    except (_Stopped, KeyboardInterrupt) as why:
        # What was measured so far is kept: the file is written with the buckets met.
        print(f"gemsops tune: stopped ({str(why) or 'interrupted'}); writing the buckets "
              "tuned so far", file=sys.stderr)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if stop_checkpoints is not None:
            stop_checkpoints()
    return _measured(dev)


def add_parser(sub: Any) -> None:
    """Add the ``tune`` subcommand to the gemsops command line."""
    p = sub.add_parser(
        "tune",
        help="run a workload once, benchmark every kernel and bucket, write a tuning file",
    )
    p.add_argument("--out", required=True, metavar="PATH", help="the tuning file to write")
    p.add_argument("--script", metavar="PATH",
                   help="a Python script to run once (default: the built-in model case)")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments for the script (after --)")
    p.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Check the output path, run the workload, write the file and a summary."""
    out = os.path.abspath(args.out)
    problem = refusal(args.out, args.script)
    if problem:
        print(f"gemsops tune: {problem}", file=sys.stderr)
        return 2
    dev = gemshal.current_device()
    what = args.script or "the built-in model case"
    title = (f"gemsops tune on {dev.name} ({dev.vendor.name} {dev.arch.tag}), "
             f"{what}, {time.strftime('%Y-%m-%d')}")
    start = time.perf_counter()
    rows = run(args.script, args.script_args, out, title)
    took = time.perf_counter() - start
    header = (f"{title}\n{len(rows)} kernel buckets in {took:.0f} s"
              + ("; the interpreter benchmarks nothing: first configs" if dev.interpreter
                 else ""))
    _write(out, rows, header)
    ops = sorted({r["op"] for r in rows})
    print(f"gemsops tune: {len(rows)} buckets of {len(ops)} ops in {took:.1f} s -> {out}")
    for op in ops:
        print(f"  {op}: {sum(r['op'] == op for r in rows)} buckets")
    return 0
