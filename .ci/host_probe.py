"""Host time per call of small ops: torch against gemsops (``use_gems``), 2000 calls after
50 warm-up calls, one synchronize; then cProfiles of four of them. On a GPU machine:

    GEMS_AUTOTUNE=0 PYTHONPATH=. python3 .ci/host_probe.py OUT_DIR

writes OUT_DIR/host-probe.txt. At commit a08d294 it also timed gemshal.launch's
compiled-kernel cache (the "fast" column), which was reverted after this measurement.
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch
import torch.nn.functional as F

try:  # the compiled-kernel cache measured at commit a08d294 (reverted: it was slower)
    from gemshal import launch
except ImportError:
    launch = None
from gemsops import registry

dev = torch.device("cuda")
out = sys.argv[1]
torch.manual_seed(0)
w = torch.randn(32000, 4096, device=dev, dtype=torch.bfloat16)
idx = torch.randint(0, 32000, (16,), device=dev)
a16 = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
b16 = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
x = torch.randn(64, 1024, device=dev)
xb = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)
wn = torch.randn(1024, device=dev, dtype=torch.bfloat16)
tgt = torch.randint(0, 1024, (64,), device=dev)
cases = {
    "add 1024": lambda: torch.add(x[0], x[0]),
    "softmax 64x1024": lambda: torch.softmax(x, -1),
    "sum 64x1024": lambda: x.sum(-1),
    "sum(dim=0) 64x1024": lambda: x.sum(0),
    "var_mean 64x1024": lambda: torch.var_mean(x, -1),
    "amax 64x1024": lambda: x.amax(-1),
    "layer_norm 64x1024": lambda: F.layer_norm(xb, (1024,), wn, wn),
    "rms_norm 64x1024": lambda: F.rms_norm(xb, (1024,), wn),
    "cross_entropy 64x1024": lambda: F.cross_entropy(x, tgt),
    "embedding 16 of 32000x4096": lambda: F.embedding(idx, w),
    "mm 16x4096x4096": lambda: a16 @ b16,
    "mm 1x4096x4096": lambda: a16[:1] @ b16,
    "gelu 1024": lambda: F.gelu(x[0]),
}
def per_call(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6
lines = []
for name, fn in cases.items():
    ref = fn()
    t_torch = per_call(fn)
    res = {}
    for mode in ("1", "0") if launch else ("0",):
        os.environ["GEMS_FAST_LAUNCH"] = mode
        if launch:
            launch.clear()
        with registry.use_gems():
            got = fn()
            res[mode] = per_call(fn)
    r = ref[0] if isinstance(ref, tuple) else ref
    g = got[0] if isinstance(got, tuple) else got
    err = (r.float() - g.float()).abs().max().item()
    fast = f"gemsops fast {res['1']:6.1f} us  " if "1" in res else ""
    lines.append(f"{name:28s} torch {t_torch:6.1f} us  {fast}run() {res['0']:6.1f} us  "
                 f"maxerr {err:.3g}")
    print(lines[-1], flush=True)
os.environ["GEMS_FAST_LAUNCH"] = "1"
if launch:
    launch.clear()
with open(f"{out}/host-probe.txt", "w") as fh:
    fh.write("\n".join(lines) + "\n")
    for name in ("add 1024", "embedding 16 of 32000x4096", "mm 16x4096x4096", "var_mean 64x1024"):
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
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(22)
        fh.write(f"\n===== cProfile {name}\n" + s.getvalue())
