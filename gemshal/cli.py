"""``gemshal`` command line: ``info``, ``vendors`` and ``config``.

Bad arguments print a usage message and exit 2; gemshal errors (a bad setting, or a
vendor that is unknown, a failed plugin, or missing its extension or devices here)
print one line, ``gemshal: error: ...``, and exit 1. Neither shows a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import attrs

from gemshal import device as _device
from gemshal import registry as _registry
from gemshal.errors import GemshalError
from gemshal.kernel import launcher as _launch

__all__ = ["main"]


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "unknown"


def _info(args: argparse.Namespace) -> int:
    dev = _device.current_device()
    found = _device.detection()
    path = _launch.launch_path()
    if args.json:
        payload = {
            "device": dev.as_dict(),
            "vendor": dev.vendor.as_dict(),
            "launch": {"direct": path.direct, "reason": path.reason},
            "stage": found.stage,
            "trace": [
                {"stage": s.stage, "vendor": s.vendor, "verdict": s.verdict, "detail": s.detail}
                for s in found.trace
            ],
        }
        print(json.dumps(payload, indent=2))
        return 0
    v = dev.vendor
    caps = ", ".join(k for k, on in attrs.asdict(v.capabilities).items() if on)
    rows = [
        ("device", f"{dev.torch_device} ({dev.index + 1} of {dev.count})"),
        ("name", dev.name),
        ("architecture", str(dev.arch)),
        ("multiprocessors", str(dev.multiprocessor_count)),
        ("warp size", str(dev.warp_size)),
        ("memory", _size(dev.total_memory)),
        ("triton interpreter", "yes" if dev.interpreter else "no"),
        ("hardware features", ", ".join(sorted(dev.features)) or "-"),
        ("vendor", f"{v.name} ({v.display_name})"),
        ("torch device type", v.device_type),
        ("dispatch key", v.dispatch_key),
        ("triton backends", ", ".join(v.triton_backends)),
        ("torch extension", v.torch_module or "(built into torch)"),
        ("visible-devices env", v.visible_devices_env or "-"),
        ("distributed backend", v.dist_backend),
        ("capabilities", caps or "-"),
        ("launch path", ("direct" if path.direct else "JITFunction.run") + f" ({path.reason})"),
    ]
    width = max(len(k) for k, _ in rows)
    print("gemshal device report")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    print(f"detection (decided at stage {found.stage!r}):")
    for step in found.trace:
        print(f"  {step}")
    return 0


def _vendors(args: argparse.Namespace) -> int:
    infos = _registry.vendors()
    failures = _registry.plugin_failures()
    if args.json:
        payload = {
            "vendors": [
                {**v.as_dict(), "source": _registry.vendor_source(v.name), "status": "loaded"}
                for v in infos
            ],
            "failed_plugins": [
                {"name": f.name, "entry_point": f.entry_point, "error": repr(f.error)}
                for f in failures
            ],
        }
        print(json.dumps(payload, indent=2))
        return 0
    header = ("name", "device", "dispatch", "triton", "dist", "extension", "source")
    table = [header] + [
        (
            v.name,
            v.device_type,
            v.dispatch_key,
            ",".join(v.triton_backends),
            v.dist_backend,
            v.torch_module or "-",
            _registry.vendor_source(v.name),
        )
        for v in infos
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for failure in failures:
        print(f"FAILED  {failure.describe()}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemshal", description="Inspect the device, the vendors and the tuning configs."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="the current device, its vendor record and detection trace")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=_info)
    vend = sub.add_parser("vendors", help="built-in and plugin vendors with their load status")
    vend.add_argument("--json", action="store_true", help="machine-readable output")
    vend.set_defaults(run=_vendors)
    from gemshal import cli_config as cli_config

    cli_config.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["info", *(argv or sys.argv[1:])])
    try:
        code: int = args.run(args)
    except GemshalError as exc:
        print(f"gemshal: error: {exc}", file=sys.stderr)
        return 1
    return code
