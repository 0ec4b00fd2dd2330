"""Host time per call of small ops: torch against gemsops (``use_gems``); then cProfiles.

Two numbers per side: ``host``, the wall time of issuing 200 calls (fewer than the
device's launch queue holds, so no launch waits for the device) after a synchronize, and
``total``, 2000 calls after 50 warm-up calls and one synchronize (the device's time
shows there when the kernel is slower than the host). Medians of 5 repeats. On a GPU
machine:

    PYTHONPATH=. python3 .ci/host_probe.py OUT_DIR [LABEL]

writes OUT_DIR/host-probe-LABEL.txt. With gemsops' tree at PYTHONPATH it times the direct
launch path (GEMS_LAUNCH=direct) and JITFunction.run (GEMS_LAUNCH=jit) side by side; an
older tree without gemshal.launch gets one gemsops column.
"""

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import gemshal
from gemsops import registry

from gemshal import tune

try:
    from gemshal.kernel import launcher as launch
except ImportError:  # a tree from before gemshal.kernel
    try:
        from gemshal import launch
    except ImportError:  # a tree from before gemshal.launch
        launch = None

dev = gemshal.current_device().torch_device
sync = gemshal.device_module().synchronize
out = sys.argv[1]
label = sys.argv[2] if len(sys.argv) > 2 else "probe"
torch.manual_seed(0)
x = torch.randn(64, 1024, device=dev)
xb = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
wn = torch.randn(1024, device=dev, dtype=torch.bfloat16)
a64 = torch.randn(64, 64, device=dev)
a16 = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
b16 = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
tgt = torch.randint(0, 1024, (64,), device=dev)
cases = {
    "add 1024": lambda: torch.add(x[0], x[0]),
    "mul scalar 1024": lambda: x[0] * 2.0,
    "add_ inplace 1024": lambda: x[1].add_(x[2]),
    "silu 1024": lambda: F.silu(x[0]),
    "softmax 64x1024": lambda: torch.softmax(x, -1),
    "sum 64x1024": lambda: x.sum(-1),
    "mm 64x64x64": lambda: a64 @ a64,
    "mm 16x4096x4096 bf16": lambda: a16 @ b16,
    "rms_norm 64x1024": lambda: F.rms_norm(xb, (1024,), wn),
    "layer_norm 64x1024": lambda: F.layer_norm(xb, (1024,), wn, wn),
    "cross_entropy 64x1024": lambda: F.cross_entropy(x, tgt),
}


def per_call(fn, calls=2000, repeats=5, issued=200):
    for _ in range(50):
        fn()
    sync()
    host, total = [], []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        for _ in range(issued):
            fn()
        host.append((time.perf_counter() - t) / issued * 1e6)
        sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        total.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(host), statistics.median(total)


def set_mode(mode):
    os.environ["GEMS_LAUNCH"] = mode
    launch.reset()
    tune.clear_cache()  # kernels re-resolve their launcher under the new setting


modes = ("direct", "jit") if launch else ("tree",)
head = " ".join(f"{m + ' host':>12s} {m + ' total':>12s}" for m in ("torch", *modes))
lines = [f"{'case':24s} {head}  (us/call)"]
for name, fn in cases.items():
    ref = fn()
    res = {"torch": per_call(fn)}
    errs = []
    for mode in modes:
        if launch:
            set_mode(mode)
        with registry.use_gems():
            got = fn()
            res[mode] = per_call(fn)
        r = ref[0] if isinstance(ref, tuple) else ref
        g = got[0] if isinstance(got, tuple) else got
        errs.append((r.float() - g.float()).abs().max().item())
    cells = " ".join(f"{res[m][0]:12.1f} {res[m][1]:12.1f}" for m in ("torch", *modes))
    ratio = res[modes[0]][0] / res["torch"][0]
    lines.append(f"{name:24s} {cells}  host ratio {ratio:4.2f}x  maxerr {max(errs):.3g}")
    print(lines[-1], flush=True)
if launch:
    set_mode("direct")
    for name, fn in cases.items():
        with registry.use_gems():
            fn()
            fn()
            fn()
    lines.append("launch stats: " + repr(launch.stats()))
with open(f"{out}/host-probe-{label}.txt", "w") as fh:
    fh.write("\n".join(lines) + "\n")
    for name in ("add 1024", "softmax 64x1024", "sum 64x1024", "mm 64x64x64"):
        fn = cases[name]
        with registry.use_gems():
            for _ in range(50):
                fn()
            p = cProfile.Profile()
            p.enable()
            for _ in range(2000):
                fn()
            p.disable()
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(25)
        fh.write(f"\n===== cProfile {name}\n" + s.getvalue())
