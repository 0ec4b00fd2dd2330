"""How many distinct kernel specializations each selftest case launches (CPU census).

Runs each case's derandomized draws (the ones ``gemsops selftest`` makes) on the current
device under gemshal's launch recording and counts, per case, the distinct
(kernel, constexpr keywords, specialization of every argument) triples: what Triton
would compile once each on a device. On the interpreter the config is pinned, so the
count is of specializations, not of configs. Prints the cases with most first and the
total per kernel.

    python .ci/compile_census.py [--examples 10] [--nospec kernel:arg,arg ...]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from typing import Any

import torch

import gemshal
from gemshal.kernel import decorator
from gemsops.selftest.cases import CASES
from gemsops.selftest.runner import check


def _spec(value: Any, nospec: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, not value.data_ptr() & 15)
    if type(value) is int:
        if nospec:
            return "int"
        return ("int", value == 1, value % 16 == 0)
    if isinstance(value, (float, bool)) or value is None:
        return type(value).__name__
    return repr(value)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--examples", type=int, default=10)
    p.add_argument("--ops", default="")
    p.add_argument("--nospec", nargs="*", default=[],
                   help="KERNEL:ARG,ARG: count these arguments as do_not_specialize")
    ns = p.parse_args()
    extra = {k: set(v.split(",")) for k, v in (s.split(":") for s in ns.nospec)}
    cases = [c for c in CASES if not ns.ops or c.op in ns.ops.split(",")]
    per_case: dict[str, set[Any]] = {}
    everything: set[Any] = set()
    t0 = time.perf_counter()
    warnings.simplefilter("ignore")
    for case in cases:
        keys: set[Any] = set()
        with decorator.recording() as rec:
            for dtype in case.dtypes:
                check(case, dtype, examples=ns.examples, light=True)
        for kern, _grid, args, kwargs in rec.launches:
            jit = kern.fn
            if hasattr(jit, "params"):  # a JITFunction
                names = [p.name for p in jit.params]
                skip = {p.name for p in jit.params if p.do_not_specialize}
            else:  # the interpreter's InterpretedFunction
                names = list(jit.arg_names)
                skip = set(jit.kwargs.get("do_not_specialize") or ())
            skip |= extra.get(kern.__name__, set())
            spec = tuple(_spec(v, n in skip) for n, v in zip(names, args, strict=False))
            frozen = tuple(sorted((k, repr(v)) for k, v in dict(kwargs).items()))
            key = (kern.__name__, frozen, spec)
            keys.add(key)
        per_case[case.op] = keys
        everything |= keys
        print(f"{case.op:<28} {len(keys):5d}", file=sys.stderr, flush=True)
    by_kernel = collections.Counter(k[0] for k in everything)
    print(f"\n{len(everything)} distinct specializations over {len(cases)} cases "
          f"({time.perf_counter() - t0:.0f} s on {gemshal.current_device().name})")
    for name, count in by_kernel.most_common():
        print(f"  {name:<36} {count:5d}")
    print("cases with most:")
    for op, keys in sorted(per_case.items(), key=lambda kv: -len(kv[1]))[:30]:
        print(f"  {op:<28} {len(keys):5d}")


if __name__ == "__main__":
    main()
