"""``gemshal config``: the tuning configs in effect, and the files they come from.

``gemshal config OP`` prints the entry that wins for OP on this device (or on
``--vendor``/``--arch``) with its file; ``gemshal config --list`` prints the search
path, every op with the file its entry comes from, and the ops left to torch.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from gemshal import tune as _tune
from gemshal.errors import ConfigError
from gemshal.tune_format import TuneConfig

__all__ = ["add_parser", "config_main"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` command to the ``gemshal`` command line.

    The command's handler is stored as ``run`` in the parsed namespace.
    """
    parser = subparsers.add_parser(
        "config",
        help="the tuning configs in effect on this device and the files they come from",
        description=(
            "Show the tuning entry that wins for an op, or list every op with its source. "
            "Lookup order: GEMS_TUNE_CONFIG, then <vendor>-<arch>.toml, <vendor>.toml and "
            "default.toml in each tuning directory."
        ),
    )
    parser.add_argument("op", nargs="?", help="the op whose effective configs to show")
    parser.add_argument(
        "--list", action="store_true", help="list the search path, every op and its source"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--vendor", help="look up for this vendor instead of detecting the device (needs --arch)"
    )
    parser.add_argument("--arch", help="architecture tag with --vendor, e.g. sm90 or gfx942")
    parser.add_argument(
        "--dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also search this tuning directory (after the registered ones); repeatable",
    )
    parser.set_defaults(run=config_main, config_parser=parser)


def _context(args: argparse.Namespace) -> _tune.TuneContext:
    if args.vendor is None:
        return _tune.current_context()
    from gemshal import registry
    from gemshal.vendor import Arch

    info = registry.vendor(args.vendor)
    return _tune.context_for(info, Arch(args.arch).tag)


def _flat(config: TuneConfig) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in config.as_dict().items())


def _show_op(op: str, ctx: _tune.TuneContext, as_json: bool) -> None:
    tuning = _tune.lookup(op, context=ctx)
    unused = op in _tune.unused_ops(ctx)
    pinned = tuning.pinned if ctx.interpreter else None
    if as_json:
        payload: dict[str, Any] = {
            "op": op,
            "context": _context_dict(ctx),
            "source": tuning.source.as_dict(),
            **tuning.as_dict(),
            "pinned": pinned.as_dict() if pinned else None,
            "unused": unused,
        }
        print(json.dumps(payload, indent=2))
        return
    mode = "Triton interpreter" if ctx.interpreter else "compiled"
    print(f"op {op} on {ctx.vendor} {ctx.arch} ({mode})")
    source = tuning.source
    print(f"  source: {source.path} ({source.level}, {source.origin})")
    if unused:
        print("  note: listed as unused: the op library leaves it to torch here")
    if tuning.configs:
        print(f"  configs ({len(tuning.configs)}):")
        for config in tuning.configs:
            print(f"    {_flat(config)}")
    if tuning.interpreter is not None:
        print(f"  interpreter: {_flat(tuning.interpreter)}")
    if pinned is not None:
        print(f"  pinned here: {_flat(pinned)}")
    if tuning.heuristics:
        print("  heuristics:")
        for rule in tuning.heuristics:
            print(f"    {rule.name} = {json.dumps(rule.as_data())}")


def _context_dict(ctx: _tune.TuneContext) -> dict[str, Any]:
    return {
        "vendor": ctx.vendor,
        "arch": ctx.arch,
        "interpreter": ctx.interpreter,
        "vendor_dirs": list(ctx.vendor_dirs),
        "user_file": ctx.user_file,
        "launch_options": list(ctx.extra_launch_keys),
    }


def _show_list(ctx: _tune.TuneContext, as_json: bool) -> None:
    path = [(s, s.path.is_file()) for s in _tune.search_path(ctx)]
    ops = _tune.list_ops(ctx)
    unused = sorted(_tune.unused_ops(ctx))
    if as_json:
        payload = {
            "context": _context_dict(ctx),
            "search_path": [{**s.as_dict(), "exists": exists} for s, exists in path],
            "ops": {op: s.as_dict() for op, s in ops.items()},
            "unused": unused,
        }
        print(json.dumps(payload, indent=2))
        return
    print(f"tuning files for {ctx.vendor} {ctx.arch}, highest precedence first:")
    if not path:
        print("  (none: no tuning directory is registered)")
    for source, exists in path:
        state = "" if exists else "  (does not exist)"
        print(f"  {source.level:<11}  {source.path} [{source.origin}]{state}")
    print(f"ops ({len(ops)}):")
    width = max((len(op) for op in ops), default=0)
    for op, source in ops.items():
        print(f"  {op:<{width}}  {source.level:<11}  {source.path}")
    print(f"unused, left to torch ({len(unused)}): {', '.join(unused) or '-'}")


def config_main(args: argparse.Namespace) -> int:
    """Run ``gemshal config`` with parsed arguments; returns the exit status.

    Raises:
        GemshalError: a tuning file is malformed or missing, the op has no entry,
            or ``--vendor`` names no known vendor (the caller prints it, exit 1).
        SystemExit: the arguments contradict each other (usage message, exit 2).
    """
    parser: argparse.ArgumentParser = args.config_parser
    if (args.op is None) == (not args.list):
        parser.error("give either an op name or --list")
    if (args.vendor is None) != (args.arch is None):
        parser.error("--vendor and --arch go together")
    for directory in args.dir:
        if not os.path.isdir(directory):
            raise ConfigError(f"--dir {directory!r}: no such directory")
        _tune.add_tune_dir(directory, origin="--dir")
    ctx = _context(args)
    if args.list:
        _show_list(ctx, args.json)
    else:
        _show_op(args.op, ctx, args.json)
    return 0
