"""``gemsops trace``: what a workload's aten calls are, and which of them gemsops left to torch.

The command a user runs on their own model before reporting a gap::

    gemsops trace --script train.py -- --steps 1     # or the built-in model case
    gemsops trace --json trace.json

It runs the workload once inside ``use_gems()`` (every compile waited for, so no call is
served by torch because its kernel was compiling) under :func:`gemsops.record` and a
``TorchDispatchMode`` that counts every aten overload reaching the backend, and prints:

* the overloads gemsops served, with call counts;
* the calls it handed back to torch, by overload and reason;
* the compute overloads gemsops does not implement (views, metadata queries and
  allocation without compute are left out), and those it implements but this
  registration leaves out (an ``unused`` list);
* composite overloads torch runs through other aten ops (``zeros`` through ``zero_``), which
  the lines above already count;
* ops of other namespaces (``profiler::_record_function_enter_new``, a vision library's
  version query): gemsops serves aten ops only, so these are listed, not counted as gaps.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["NOT_COMPUTE", "TraceReport", "add_parser", "main", "trace"]

NOT_COMPUTE = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "slice",
    "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "split",
    "split_with_sizes", "unbind", "chunk", "narrow", "_reshape_alias", "unflatten",
    "flatten", "view_as", "expand_as", "lift_fresh", "empty", "empty_strided",
    "empty_like", "new_empty", "new_empty_strided", "is_same_size", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "_local_scalar_dense", "set_",
    "resize_", "_has_compatible_shallow_copy_type", "item", "dim", "size", "stride",
    "numel", "is_nonzero", "equal", "contiguous", "_unsafe_split",
    "view_as_real", "view_as_complex", "_conj", "_neg_view", "diagonal", "movedim",
    "unfold", "_reshape_copy", "lift_fresh_copy",
})
"""Overload packets (``aten::view``...) that compute nothing: views, metadata, allocation.
Queries count as nothing too: a packet named ``is_*`` or ``*version``."""


def _query(packet: str) -> bool:
    """A capability or version query (``is_pinned``, a library's ``_..._version``)."""
    return packet.startswith("is_") or packet.endswith("version")


@attrs.frozen
class TraceReport:
    """What one run of a workload called, and who served it.

    Attributes:
        served: Overload -> calls gemsops served.
        handed_back: (overload, reason) -> calls gemsops handed to torch.
        not_implemented: Compute overload gemsops has no implementation of -> calls.
        left_out: Overload gemsops implements but this registration does not serve -> calls.
        composite: Overload torch runs through other aten ops -> calls.
        other: ``namespace::overload`` of a namespace other than aten -> calls.
    """

    served: dict[str, int]
    handed_back: dict[tuple[str, str], int]
    not_implemented: dict[str, int]
    left_out: dict[str, int]
    composite: dict[str, int]
    other: dict[str, int] = attrs.field(factory=dict)

    def lines(self) -> list[str]:
        """The report as text, one line per overload."""

        def total(counts: dict[Any, int]) -> str:
            return f"{len(counts)} overloads, {sum(counts.values())} calls"

        out = [f"served by gemsops: {total(self.served)}"]
        out += [f"  {op} x{n}" for op, n in sorted(self.served.items())]
        out.append(f"handed back to torch: {total(self.handed_back)}")
        out += [f"  {op} x{n}: {why}" for (op, why), n in sorted(self.handed_back.items())]
        out.append(f"not implemented by gemsops: {total(self.not_implemented)}")
        out += [f"  {op} x{n}" for op, n in sorted(self.not_implemented.items())]
        if self.left_out:
            out.append(f"implemented but not enabled here: {total(self.left_out)}")
            out += [f"  {op} x{n}" for op, n in sorted(self.left_out.items())]
        if self.composite:
            out.append("composite (torch runs them through the ops above): "
                       + ", ".join(f"{op} x{n}" for op, n in sorted(self.composite.items())))
        if self.other:
            out.append("not aten (gemsops serves aten ops only): "
                       + ", ".join(f"{op} x{n}" for op, n in sorted(self.other.items())))
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data."""
        return {
            "served": self.served,
            "handed_back": [{"overload": op, "reason": why, "calls": n}
                            for (op, why), n in sorted(self.handed_back.items())],
            "not_implemented": self.not_implemented,
            "left_out": self.left_out,
            "composite": self.composite,
            "other": self.other,
        }


def _op_log(key: str) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLog(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Counts every compute aten overload that reaches the backend (after autograd).

        A composite overload (one torch runs through other aten ops at every backend) is
        counted and then run through its decomposition with the log still on, so the ops
        it is made of are counted too (a mode is off inside its own handler)."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ops: Counter[str] = Counter()
            self.composite: Counter[str] = Counter()
            self.other: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            packet = func.overloadpacket.__name__
            if func.namespace != "aten":
                self.other[f"{func.namespace}::{packet}.{func._overloadname}"] += 1
                return func(*args, **kwargs)
            if packet in NOT_COMPUTE or _query(packet):
                return func(*args, **kwargs)
            name = f"{packet}.{func._overloadname}"
            if _composite(name, key):
                self.composite[name] += 1
                import torch

                composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
                with self:
                    return func.redispatch(composite, *args, **kwargs)
            if _composite(name, key, "CompositeImplicitAutograd"):
                # Reached here only where autograd is off (inference_mode: HF generate's
                # softmax.int); torch then runs its decomposition, which is what is served.
                self.composite[name] += 1
                with self:
                    return func.decompose(*args, **kwargs)
            if packet.rstrip("_") not in NOT_COMPUTE:
                self.ops[name] += 1
            return func(*args, **kwargs)

    return OpLog()


def _composite(overload: str, key: str, kind: str = "CompositeExplicitAutograd") -> bool:
    # An op without a kernel of its own at the vendor's key that torch implements once for
    # every backend runs through other aten ops (zeros -> empty + zero_).
    import torch

    name, _, variant = overload.partition(".")
    qualname = f"aten::{name}" + ("" if variant == "default" else f".{variant}")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        return not has(qualname, key) and has(qualname, kind)
    except RuntimeError:
        return False


def trace(workload: Callable[[], Any]) -> TraceReport:
    """Run ``workload()`` once under ``use_gems()``, ``record()`` and an aten op log."""
    import gemshal
    from gemshal.kernel.compile import waiting
    from gemsops import registry

    key = gemshal.current_vendor().dispatch_key
    log = _op_log(key)
    with waiting(), registry.use_gems(), registry.record() as rec:
        with log:
            workload()
        served_now = set(registry.registered_ops())
    implemented = set(registry.implementations())
    served = dict(rec.served)
    handed = {op for op, _ in rec.fallbacks}
    not_implemented: dict[str, int] = {}
    left_out: dict[str, int] = {}
    for op, n in sorted(log.ops.items()):
        if op in served or op in handed:
            continue
        if op in implemented and op not in served_now:
            left_out[op] = n
        elif op not in implemented:
            not_implemented[op] = n
        # else: served at the autograd key, above the log (cross_entropy_loss's parts)
    composite = {op: n for op, n in sorted(log.composite.items())
                 if op not in served and op not in handed}
    return TraceReport(served, dict(rec.fallbacks), not_implemented, left_out, composite,
                       dict(sorted(log.other.items())))


def add_parser(sub: Any) -> None:
    """Add the ``trace`` subcommand to the gemsops command line."""
    p = sub.add_parser(
        "trace",
        help="run a workload once and list the aten ops gemsops served, handed back or "
             "does not implement",
    )
    p.add_argument("--script", metavar="PATH",
                   help="a Python script to run once (default: the built-in model case)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments for the script (after --)")
    p.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Check the paths, run the workload, print the report (and write its JSON)."""
    import gemshal
    from gemsops.tune_run import refusal, workload

    problem = refusal(args.json, args.script)
    if problem:
        print(f"gemsops trace: {problem}", file=sys.stderr)
        return 2
    dev = gemshal.current_device()
    report = trace(workload(args.script, args.script_args))
    what = args.script or "the built-in model case"
    print(f"gemsops trace: {what} on {dev.name} ({dev.vendor.name} {dev.arch.tag})")
    for line in report.lines():
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0
