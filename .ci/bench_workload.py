"""Every kernel row of ``gemsops bench``, called once under gemsops: the workload
``gemsops tune`` benchmarks for the bench rows' buckets of the sm90 tables.

    gemsops tune --out sm90.toml --script .ci/bench_workload.py
"""

from __future__ import annotations

import time

import torch

from gemsops.bench import cases

dev = torch.device("cuda")
for case in cases(tiny=False):
    t = time.perf_counter()
    fn = case.make(dev)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"bench workload: {case.label} {case.dtype} {time.perf_counter() - t:.1f} s", flush=True)
    del fn
    torch.cuda.empty_cache()
