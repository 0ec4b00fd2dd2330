"""The kernel rows of ``gemsops bench`` with the native replay off and on, in one process.

    GEMS_AUTOTUNE=0 python3 .ci/native_ab.py [--rounds 3] [--json out.json]

Per row, ``--rounds`` rounds of: torch's own call, then the call under
``gemsops.use_gems()`` with ``GEMS_NATIVE=0`` (the Python path) and with ``GEMS_NATIVE=1``
(a new registration each block; do_bench's warm-up records the replay), the two in
alternating order by round, each timed by ``triton.testing.do_bench`` (median ms).
Reported: the medians over rounds, the native/Python ratio of the medians and the median
of the per-round ratios (``paired``: a drift of the machine's speed over a row cancels),
so the replay's effect on kernel rows is read beside the noise of torch's own row in the
same rounds. Run it with ``GEMS_COMPILE=wait``: a compile on the background thread would
hand part of a side to torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton.testing

import gemsops
from gemsops.bench import cases


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    rows = []
    for case in cases(tiny=False):
        fn = case.make(dev)
        times: dict[str, list[float]] = {"torch": [], "python": [], "native": []}
        paired = []
        for r in range(args.rounds):
            times["torch"].append(bench(fn))
            sides = [("python", "0"), ("native", "1")]
            got = {}
            for side, value in sides if r % 2 == 0 else sides[::-1]:
                os.environ["GEMS_NATIVE"] = value
                with gemsops.use_gems():
                    got[side] = bench(fn)
                times[side].append(got[side])
            paired.append(got["native"] / got["python"])
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"case": case.label, "dtype": str(case.dtype).removeprefix("torch."),
               **{f"{k}_ms": round(v, 5) for k, v in med.items()},
               "native_over_python": round(med["native"] / med["python"], 4),
               "paired": round(statistics.median(paired), 4),
               "torch_spread": round(max(times["torch"]) / min(times["torch"]), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del fn
        torch.cuda.empty_cache()
    ratios = [r["paired"] for r in rows]
    print(f"native/python over {len(rows)} rows: median {statistics.median(ratios):.4f}, "
          f"max {max(ratios):.4f} ({rows[ratios.index(max(ratios))]['case']}), "
          f"rows above 1.03: {sum(r > 1.03 for r in ratios)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
