"""The command line: ``gemsops selftest``."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

import gemshal
from gemshal.kernel import AUTOTUNE_ENV
from gemshal.kernel.compile import threads
from gemsops import registry
from gemsops.selftest.cases import CASES
from gemsops.selftest.records import DEFAULT_EXAMPLES, OUTCOMES, Case, Row
from gemsops.selftest.runner import prepare, run
from gemsops.selftest.workers import (
    WORKERS_ENV,
    OpTiming,
    check_in_workers,
    checks,
    plan,
    serve,
)

__all__ = [
    "add_parser",
    "main",
    "summary",
]

_OP_WIDTH = 14
"""The op column's width; wider when a checked case's name is longer."""


def _header(width: int = _OP_WIDTH) -> str:
    return f"{'op':<{width}} {'dtype':<9} {'outcome':<16} {'examples':>8}  detail"


def _line(row: Row, width: int = _OP_WIDTH) -> str:
    detail = row.detail
    if row.example:
        detail = f"{detail}\n{'':<{width + 36}}smallest example: {row.example}"
    return (f"{row.op:<{width}} {row.dtype:<9} {row.outcome:<16} {row.examples:>8}  "
            f"{detail}").rstrip()


def summary(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows ended in each outcome."""
    return {outcome: sum(r.outcome == outcome for r in rows) for outcome in OUTCOMES}


def add_parser(sub: Any) -> None:
    """Add the ``selftest`` subcommand to the gemsops command line."""
    p = sub.add_parser(
        "selftest", help="check which ops pass on this device (the test suite's properties)"
    )
    p.add_argument(
        "--ops",
        help=f"comma-separated case names to check (default: all {len(CASES)}, which cover "
        "every op `gemsops ops` lists; an unknown name prints the known ones)",
    )
    p.add_argument("--dtypes", help="comma-separated dtypes to check, e.g. bfloat16,float32")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"examples drawn per op and dtype (default: {DEFAULT_EXAMPLES})",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--tune",
        action="store_true",
        help="benchmark every size bucket's configs, as GEMS_AUTOTUNE=all does (default: "
        "every bucket launches its kernel's first config, as GEMS_AUTOTUNE=first does, "
        "benchmarking nothing: the check is of results, and one config per kernel "
        "compiles fewest kernels)",
    )
    how.add_argument(
        "--tables",
        action="store_true",
        help="launch the tuning tables' configs, as GEMS_AUTOTUNE=0 does (a kernel "
        "compiles once per config its rows name)",
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    # --serve: a worker of a sharded run, checking the case named on each stdin line
    p.add_argument(
        "--compile-only",
        action="store_true",
        help="launch each check's examples once so their kernels land in Triton's cache, "
        "check nothing, and exit (warms the cache for a later run)",
    )
    p.set_defaults(run=main)


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _selected(args: argparse.Namespace) -> tuple[list[Case], list[torch.dtype] | None]:
    """The cases and dtypes the arguments pick, or a one-line exit naming a bad value."""
    by_name = {case.op: case for case in CASES}
    ops = _names(args.ops)
    if ops is not None:
        bad = [op for op in ops if op not in by_name]
        if bad or not ops:
            raise SystemExit(
                f"gemsops selftest: unknown op(s) {bad}; known: {', '.join(sorted(by_name))}"
            )
    known = {str(d)[6:]: d for case in CASES for d in case.dtypes}
    names = _names(args.dtypes)
    dtypes = None
    if names is not None:
        names = [n.removeprefix("torch.") for n in names]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise SystemExit(
                f"gemsops selftest: unknown dtype(s) {bad}; known: {', '.join(sorted(known))}"
            )
        dtypes = [known[n] for n in names]
    if args.examples < 1:
        raise SystemExit(f"gemsops selftest: --examples must be at least 1, not {args.examples}")
    cases = list(CASES) if ops is None else [by_name[op] for op in dict.fromkeys(ops)]
    return cases, dtypes


def _in_order(rows: Sequence[Row], cases: Sequence[Case]) -> list[Row]:
    """``rows`` in the order one process would check them: by case, then by the case's
    dtypes."""
    rank = {(case.op, str(d)[6:]): (i, j) for i, case in enumerate(cases)
            for j, d in enumerate(case.dtypes)}
    return sorted(rows, key=lambda r: rank.get((r.op, r.dtype), (len(rank), 0)))


def main(args: argparse.Namespace) -> int:
    """Run the self-test; print a row per op and dtype and a summary. 1 when any failed."""
    from gemsops.bench import output_problem

    problem = output_problem(args.json)
    if problem:
        raise SystemExit(f"gemsops selftest: {problem}")
    cases, dtypes = _selected(args)
    if getattr(args, "tune", False):
        os.environ[AUTOTUNE_ENV] = "all"  # this process only: the command exits after
    elif getattr(args, "tables", False):
        os.environ[AUTOTUNE_ENV] = "0"
    elif AUTOTUNE_ENV not in os.environ:
        # Every bucket the first config: the fewest compiles (workers inherit it).
        os.environ[AUTOTUNE_ENV] = "first"
    if getattr(args, "serve", False):
        return serve(cases, dtypes, args.examples)
    dev = gemshal.current_device()
    print(f"gemsops selftest on {dev.vendor.display_name} ({dev.name}), {args.examples} examples")
    for overload, where in registry.overrides().items():
        print(f"vendor override: {overload} <- {where}")
    width = max([_OP_WIDTH, *(len(case.op) for case in cases)])
    start = time.perf_counter()
    started, compile_s = 0, 0.0
    timings: list[OpTiming] = []
    if getattr(args, "compile_only", False):
        started = prepare(cases, dtypes, examples=args.examples)
        print(f"{started} kernels compiled in {time.perf_counter() - start:.1f} s", flush=True)
        return 0
    workers, per = plan()
    if dev.interpreter and WORKERS_ENV not in os.environ:
        workers = 0  # nothing compiles on the interpreter; set it to shard anyway
    units = len(checks(cases, dtypes))
    if workers > 1 and units > 1:
        print(f"checking {len(cases)} ops ({units} op-dtype checks) in "
              f"{min(workers, units)} worker processes "
              f"side by side ({per} compile threads each), an op in one dtype at a time, "
              "the costliest first, each worker taking the next as it finishes one; a "
              "line as each worker ends...",
              flush=True)
        rows, left = check_in_workers(cases, dtypes, args.examples, workers, per,
                                      say=lambda line: print(line, flush=True),
                                      timings=timings)
        started = sum(t.compiled for t in timings)
        compile_s = sum(t.compile_s for t in timings)
        if left:
            print(f"making the {len(left)} checks of the workers that ended early here...",
                  flush=True)
            prepare(left, dtypes, examples=args.examples)
            rows += run(left, dtypes, examples=args.examples)
        rows = _in_order(rows, cases)
        print(_header(width))
        for row in rows:
            print(_line(row, width))
    else:
        if not dev.interpreter:
            print(f"compiling the checks' kernels first, on {threads()} threads...",
                  flush=True)
            started = prepare(cases, dtypes, examples=args.examples)
            compile_s = time.perf_counter() - start
            print(f"{started} kernels compiled in {compile_s:.1f} s", flush=True)
        print(_header(width))
        rows = run(cases, dtypes, examples=args.examples,
                   on_row=lambda row: print(_line(row, width), flush=True))
    counts = summary(rows)
    took = time.perf_counter() - start
    print(", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + f" ({took:.1f} s)")
    if args.json:
        result = {
            "device": dev.as_dict(),
            "examples": args.examples,
            "compiled": started,
            "compile_s": round(compile_s, 2),
            "rows": [attrs.asdict(row) for row in rows],
            "ops": [attrs.asdict(t) for t in sorted(timings, key=lambda t: -t.check_s)],
            "summary": counts,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 1 if counts["failed"] else 0
