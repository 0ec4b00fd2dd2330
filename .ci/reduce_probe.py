"""Where the small Llama step's reduce_rows time goes (issue 23's Llama row): one
steady step profiled with input shapes, the aten ops by device time (kernels included),
each reduce_rows launch's duration, then the step's reductions alone beside torch.

    GEMS_COMPILE=wait python3 .ci/reduce_probe.py [--b tuned.toml]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

import gemsops
from gemshal import tune

spec = importlib.util.spec_from_file_location("steps", Path(__file__).with_name("steps.py"))
assert spec is not None and spec.loader is not None
steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(steps)

p = argparse.ArgumentParser()
p.add_argument("--b", default=None, help="a tuning file (GEMS_TUNE_CONFIG) instead of the tables")
p.add_argument("--hook", action="store_true",
               help="also time each reduce launch of one step from Python (replay memo and "
                    "native replay off), with its view and the config it launched")
a = p.parse_args()
if a.hook:
    import sys as _sys

    import gemsops.ops.replay as _replay
    import gemsops.ops.rowwise.tiles as _tiles

    class _NoMemo(dict):  # type: ignore[type-arg]
        def __setitem__(self, k: object, v: object) -> None:
            pass

    _replay._MEMO = _NoMemo()
    _orig = _tiles.launch
    HOOKED: list[dict[str, object]] = []

    def _timed(rows_kernel, mid_kernel, lay, pointers, scalars, consts, parts=None):  # type: ignore[no-untyped-def]
        src, m, n, k, sm, sn = lay
        kern = rows_kernel if k == 1 else mid_kernel
        seen: dict[str, object] = {}
        launch_fn = kern.launch

        def spy(grid, args, kw):  # type: ignore[no-untyped-def]
            def g(meta):  # type: ignore[no-untyped-def]
                seen.update({kk: vv for kk, vv in meta.items() if kk.isupper() or kk.startswith("num_")})
                return grid(meta)
            return launch_fn(g, args, kw)

        kern.launch = spy
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        try:
            return _orig(rows_kernel, mid_kernel, lay, pointers, scalars, consts, parts)
        finally:
            s1.record()
            del kern.launch
            torch.cuda.synchronize()
            HOOKED.append({"op": str(kern)[:40], "shape": list(src.shape), "dtype": str(src.dtype),
                           "M": m, "N": n, "K": k, "sm": sm, "sn": sn, "parts": parts,
                           "scalars": [str(x) for x in scalars], "meta": {kk: str(vv) for kk, vv in seen.items()},
                           "ms": round(s0.elapsed_time(s1), 4)})

    for _mod in list(_sys.modules.values()):
        if getattr(_mod, "__name__", "").startswith("gemsops.ops") and getattr(_mod, "launch", None) is _orig:
            _mod.launch = _timed  # type: ignore[attr-defined]
if a.b:
    os.environ["GEMS_TUNE_CONFIG"] = a.b
tune.clear_cache()
model, inputs, opt = steps._build("llama")
with gemsops.use_gems():
    print("steady ms", round(steps._median_ms(model, inputs, opt, 3, gems=True), 2), flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        steps._step(model, inputs, opt)
        torch.cuda.synchronize()
if a.hook:
    HOOKED.clear()
    with gemsops.use_gems():
        steps._step(model, inputs, opt)
        torch.cuda.synchronize()
    for h in sorted(HOOKED, key=lambda h: -float(h["ms"]))[:40]:  # type: ignore[arg-type]
        print(json.dumps(h), flush=True)
rows = []
for ev in prof.key_averages(group_by_input_shape=True):
    dt = getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
    if ev.key.startswith("aten::") and dt > 100:
        rows.append((round(dt / 1e3, 3), ev.count, ev.key, str(ev.input_shapes)[:160]))
rows.sort(reverse=True)
for r in rows[:25]:
    print(json.dumps(r), flush=True)
durs = sorted((round(e.device_time / 1e3, 4) if hasattr(e, "device_time") else round(e.cuda_time / 1e3, 4))
              for e in prof.events() if "_reduce_rows_kernel" in e.name and e.device_type.name == "CUDA")
print("reduce_rows launches (ms):", durs, flush=True)
x = torch.randn(4, 512, 1024, device="cuda")
g = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16)
for label, fn in (("sum(-1,keepdim) f32", lambda: x.sum(-1, keepdim=True)),
                  ("mean(-1,keepdim) f32", lambda: x.mean(-1, keepdim=True)),
                  ("sum((0,1)) bf16", lambda: g.sum((0, 1))),
                  ("all() bool 4x512", lambda: (inputs["attention_mask"] == 1).all())):
    t = triton.testing.do_bench(fn)
    with gemsops.use_gems():
        fn()
        torch.cuda.synchronize()
        u = triton.testing.do_bench(fn)
    print(json.dumps({"case": label, "torch_ms": round(t, 4), "gems_ms": round(u, 4)}), flush=True)
