"""``gemsops`` command line: ``demo``, ``ops``, ``bench``, ``selftest``, ``tune``, ``trace``.

Bad arguments print a usage message and exit 2. A bad value for ``bench`` or
``selftest``'s ``--ops`` or ``--dtypes``, for ``bench --from-json`` or ``selftest
--examples``, and any gemshal or gemsops error (a vendor whose extension or devices are
missing here, say), print one line and exit 1. None of them shows a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import attrs

import gemshal
from gemshal.errors import GemshalError
from gemsops.errors import GemsopsError

__all__ = ["main"]

# Demo sizes: small enough for the Triton interpreter on a laptop, real on a GPU.
_CPU_SIZES = {"batch": 2, "seq": 16, "vocab": 256, "dim": 64, "heads": 4, "hidden": 128}
_GPU_SIZES = {"batch": 4, "seq": 256, "vocab": 8192, "dim": 512, "heads": 8, "hidden": 1408}


def _demo(args: argparse.Namespace) -> int:
    from gemsops import demo

    dev = gemshal.current_device()
    sizes = _CPU_SIZES if dev.interpreter else _GPU_SIZES
    report = demo.run_demo(**sizes)
    if args.json:
        print(json.dumps(attrs.asdict(report), indent=2))
    else:
        demo.print_report(report)
    return 0


def _ops(args: argparse.Namespace) -> int:
    from gemsops import registry

    impls = registry.implementations()
    overrides = registry.overrides()
    vendor = gemshal.current_vendor().name
    if args.json:
        if args.sources:
            print(json.dumps({o: registry.source(o) for o in sorted(impls)}, indent=2))
        else:
            print(json.dumps(sorted(impls), indent=2))
        return 0
    if args.sources:
        width = max((len(o) for o in impls), default=0)
        for overload in sorted(impls):
            print(f"{overload:<{width}}  {registry.source(overload)}")
        return 0
    by_op: dict[str, list[str]] = {}
    for overload in sorted(impls):
        shown = f"{overload}*" if overload in overrides else overload
        by_op.setdefault(registry.base_name(overload), []).append(shown)
    for op, overloads in by_op.items():
        print(f"{op:<28} {', '.join(overloads)}")
    print(f"{len(by_op)} ops, {len(impls)} aten overloads")
    if overrides:
        print(f"* served by a vendor override on {vendor} ({len(overrides)}):")
        for overload, where in overrides.items():
            print(f"  {overload:<26} {where}")
    return 0


def _native(args: argparse.Namespace) -> int:
    import gemshal
    from gemsops import native
    from gemsops.native import build

    vendor = gemshal.current_vendor()
    try:
        setting = native.setting()
    except ValueError as exc:
        print(f"gemsops: error: {exc}", file=sys.stderr)
        return 2
    on = native.wanted(vendor)
    print(f"setting      {native.ENV}={setting}")
    print(f"vendor       {vendor.name} (native launch: {vendor.native_launch or 'none'})")
    print(f"serves       {'yes' if on else 'no: every call takes the Python path'}")
    path = build.library_path()
    if path is None:
        print("library      no C++ compiler found (tried $CXX, c++, g++, clang++)")
        return 1 if args.build else 0
    if args.build and not path.exists():
        try:
            build.build()
        except build.BuildError as exc:
            print(f"gemsops: error: {exc}", file=sys.stderr)
            return 1
    state = "built" if path.exists() else "not built yet (built on first use, or with --build)"
    print(f"library      {path} ({state})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemsops", description="Triton kernels for aten ops.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = sub.add_parser(
        "demo", help="a decoder block, forward and backward, with and without gemsops"
    )
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(run=_demo)
    ops = sub.add_parser("ops", help="the aten ops and overloads gemsops implements")
    ops.add_argument("--json", action="store_true", help="machine-readable output")
    ops.add_argument(
        "--sources",
        action="store_true",
        help="each overload with the implementation serving it (module.function [vendor])",
    )
    ops.set_defaults(run=_ops)
    native = sub.add_parser(
        "native", help="the native replay: its setting, whether its library is built, and where"
    )
    native.add_argument("--build", action="store_true",
                        help="build the library now when it is not built (once per torch install)")
    native.set_defaults(run=_native)
    from gemsops import bench, selftest, trace, tune_run

    bench.add_parser(sub)
    selftest.add_parser(sub)
    tune_run.add_parser(sub)
    trace.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    from gemshal.kernel.compile import waiting

    try:
        # What the commands time and check is gemsops' own kernels from the first call:
        # no call is served by torch while its kernel compiles.
        with waiting():
            code: int = args.run(args)
    except (GemshalError, GemsopsError) as exc:
        print(f"gemsops: error: {exc}", file=sys.stderr)
        return 1
    return code
