"""Tuning sweep: for each `gemsops bench` case (pointwise, scan, softmax and loss rows
excepted), time torch, then run gemsops once so the autotuner benchmarks every candidate
config, and record its per-config medians. Run with the candidates as the user tune file:

    GEMS_TUNE_CONFIG=.ci/sweep-candidates.toml python3 .ci/sweep.py OUT_DIR [OPS]

(OPS: a comma-separated list of bench ops, e.g. ``layer_norm,rms_norm``; default all)

writes OUT_DIR/sweep.json and prints the best six configs per kernel and case.
"""
import json
import os
import sys
import time

import torch
import triton

from gemshal.kernel import decorator as at
from gemsops import bench, registry

os.environ.setdefault("GEMS_AUTOTUNE", "all")  # benchmark every bucket, tables or not
out = sys.argv[1]
dev = torch.device("cuda")
skip = ("add", "mul", "gelu", "silu", "exp", "cumsum", "softmax", "log_softmax", "cross_entropy")
only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None  # e.g. layer_norm,rms_norm
results = []
for case in bench.cases(tiny=False):
    if case.op in skip or (only is not None and case.op not in only):
        continue
    t0 = time.time()
    fn = case.make(dev)
    torch_ms = triton.testing.do_bench(fn)
    for k in list(at._KERNELS):
        if k._state.tuner is not None:
            k._state.tuner.configs_timings = None
    with registry.use_gems():
        fn()
        torch.cuda.synchronize()
        gems_ms = triton.testing.do_bench(fn)
    rec = {"case": case.label, "torch_ms": torch_ms, "gems_ms": gems_ms, "kernels": {}}
    for k in list(at._KERNELS):
        tuner = k._state.tuner
        timings = getattr(tuner, "configs_timings", None) if tuner is not None else None
        if timings:
            rows = sorted(
                ((v[0] if isinstance(v, (list, tuple)) else v), str(c)) for c, v in timings.items()
            )
            rec["kernels"][k.op] = rows
    results.append(rec)
    print(f"== {case.label}: torch {torch_ms*1e3:.1f} us, gemsops {gems_ms*1e3:.1f} us "
          f"({time.time()-t0:.0f} s)", flush=True)
    for op, rows in rec["kernels"].items():
        for ms, c in rows[:6]:
            print(f"   {op:16s} {ms*1e3:9.1f} us  {c}", flush=True)
        print(f"   {op:16s} ... {len(rows)} configs, worst {rows[-1][0]*1e3:.1f} us", flush=True)
    with open(f"{out}/sweep.json", "w") as fh:
        json.dump(results, fh, indent=1)
