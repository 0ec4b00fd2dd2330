"""``gemsops bench --host``: the host time of each served op, beside torch's own.

Each case is one torch call on prepared inputs, timed three ways in one process:
torch's own kernel, and the call under :func:`gemsops.use_gems`. On a machine without
an accelerator the gemsops side runs its whole host path (dispatch, checks, output
allocation, the plan key, the grid, the launcher) with the kernel launch replaced by
a no-op (:func:`gemshal.kernel.stub_launches`): the results are not computed, only the
host cost is measured, so the path can be profiled and trimmed on a laptop; torch's
side there is its CPU kernel, which does the work. On a GPU the same command times the
real launch: ``calls`` calls issued after warm-up and a synchronize, then one more
synchronize, so a kernel slower than its host path shows as well.

``--profile`` adds a cProfile of each case's gemsops side: the functions where the
microseconds go, by own time.

The full bench's host columns live here too: ``host_overhead`` (tiny calls per side),
``host_profile`` (a cProfile of tiny adds), ``kernel_profile`` (the profiler's table of
one case's busiest kernels) and ``import_cost`` (the fresh-process price of
``import gemsops; enable()``).
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn import functional as F

import gemshal
from gemsops import registry
from gemsops.bench_cases import Thunk
from gemsops.bench_sides import flag_gems, sides_of

__all__ = [
    "host_cases",
    "host_overhead",
    "host_profile",
    "import_cost",
    "kernel_profile",
    "measure_host",
    "report",
]


def host_cases(dev: torch.device) -> dict[str, Thunk]:
    """The cases of the eager-speed issue: tiny ops, and ops at a model's size."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=dev, dtype=dtype)

    x = rand(64, 1024)
    v = rand(1024)
    xb = rand(64, 1024, dtype=torch.bfloat16)
    wb = rand(1024, dtype=torch.bfloat16)
    big = rand(8192, 2048, dtype=torch.bfloat16)
    wbig = rand(2048, dtype=torch.bfloat16)
    a64 = rand(64, 64)
    lin_x = rand(16, 1024, dtype=torch.bfloat16)
    lin_w = rand(1024, 1024, dtype=torch.bfloat16)
    q = rand(1, 4, 64, 64, dtype=torch.bfloat16)
    tgt = torch.randint(0, 1024, (64,), generator=g).to(dev)
    table = rand(32000, 256)
    ids = torch.randint(0, 32000, (64,), generator=g).to(dev)
    xg = rand(64, 1024, dtype=torch.bfloat16).requires_grad_()
    wg = rand(1024, dtype=torch.bfloat16).requires_grad_()
    dy = rand(64, 1024, dtype=torch.bfloat16)

    def rms_fwd_bwd() -> Any:
        y = F.rms_norm(xg, (1024,), wg)
        return torch.autograd.grad(y, (xg, wg), dy)

    return {
        "add 1024": lambda: torch.add(v, v),
        "x * 2.0, 1024": lambda: v * 2.0,
        "silu 1024": lambda: F.silu(v),
        "softmax 64x1024": lambda: torch.softmax(x, -1),
        "sum(-1) 64x1024": lambda: x.sum(-1),
        "mm 64^3": lambda: a64 @ a64,
        "layer_norm 64x1024": lambda: F.layer_norm(xb, (1024,), wb, wb),
        "rms_norm 64x1024": lambda: F.rms_norm(xb, (1024,), wb),
        "rms_norm fwd+bwd 64x1024": rms_fwd_bwd,
        "rms_norm bf16 8192x2048": lambda: F.rms_norm(big, (2048,), wbig),
        "zeros_like 64x1024": lambda: torch.zeros_like(x),
        "cross_entropy 64x1024": lambda: F.cross_entropy(x, tgt),
        "embedding 64 of 32000x256": lambda: F.embedding(ids, table),
        "sdpa 1x4x64x64": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "linear 16x1024 by 1024x1024": lambda: F.linear(lin_x, lin_w),
    }


def _per_call(fn: Thunk, sync: Callable[[], None], calls: int, repeats: int) -> float:
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


@contextlib.contextmanager
def _gems_side(stub: bool) -> Iterator[registry.CallRecord]:
    from gemshal.kernel.compile import waiting

    with contextlib.ExitStack() as stack:
        if stub:
            from gemshal.kernel import stub_launches

            stack.enter_context(stub_launches())
        # Compiles finish on the calling thread: a call handed back to torch while its
        # kernel compiles in the background would be timed as gemsops'.
        stack.enter_context(waiting())
        stack.enter_context(registry.use_gems())
        yield stack.enter_context(registry.record())


def measure_host(
    *, calls: int = 500, repeats: int = 5, profile: bool = False, match: str | None = None
) -> dict[str, Any]:
    """Time every case on both sides; with ``profile``, also cProfile the gemsops side.

    Returns:
        ``{"stubbed": bool, "device": str, "rows": [{case, torch_us, gemsops_us,
        ratio, served, handed_back}], "profiles": {case: text}}``.
    """
    import re

    dev = gemshal.current_device()
    stub = dev.interpreter
    torch_dev = dev.torch_device
    sync = gemshal.device_module().synchronize if not dev.interpreter else (lambda: None)
    cases = host_cases(torch_dev)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    for label, fn in cases.items():
        if match and not re.search(match, label):
            continue
        torch_us = _per_call(fn, sync, calls, repeats)
        with _gems_side(stub) as rec:
            gems_us = _per_call(fn, sync, calls, repeats)
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(calls):
                    fn()
                sync()
                prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
                profiles[label] = text.getvalue()
        rows.append(
            {
                "case": label,
                "torch_us": round(torch_us, 2),
                "gemsops_us": round(gems_us, 2),
                "ratio": round(gems_us / torch_us, 2) if torch_us else None,
                "served": sorted(rec.served),
                "handed_back": sorted({f"{op} ({why})" for op, why in rec.fallbacks}),
            }
        )
    result: dict[str, Any] = {
        "stubbed": stub,
        "device": str(torch_dev),
        "rows": rows,
        "profiles": profiles,
    }
    try:
        from gemshal.kernel import stats

        result["launch_stats"] = stats()
    except ImportError:  # a tree from before gemshal.kernel (.ci/host_compare.py)
        pass
    return result


def report(result: dict[str, Any], json_path: str | None = None) -> None:
    """Print the table (and profiles); write JSON when a path is given."""
    side = "gemsops (launch stubbed)" if result["stubbed"] else "gemsops"
    print(f"host time per call, us ({result['device']}; torch: its own kernel; {side})")
    print(f"{'case':<30} {'torch':>9} {'gemsops':>9} {'ratio':>7}  served / handed back")
    for row in result["rows"]:
        served = ", ".join(row["served"]) or "-"
        back = "; handed back: " + ", ".join(row["handed_back"]) if row["handed_back"] else ""
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
        print(
            f"{row['case']:<30} {row['torch_us']:>9.1f} {row['gemsops_us']:>9.1f} "
            f"{ratio:>7}  {served}{back}"
        )
    for record in result.get("launch_stats", []):
        if record["jit"] > record["compiled"] * 2 or record["disabled"]:
            print(
                f"launcher {record['kernel']}: {record['direct']} direct, {record['jit']} "
                f"through JITFunction.run, {record['compiled']} entries; "
                f"off: {record['disabled']}"
            )
    for label, text in result.get("profiles", {}).items():
        print(f"\n===== cProfile: {label}\n{text}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)


def kernel_profile(fn: Thunk, *, calls: int = 5, rows: int = 8) -> str:
    """``torch.profiler``'s table of ``calls`` calls of ``fn``: the busiest ops and kernels
    (device time where the profiler sees the device, else CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    supported = torch.profiler.supported_activities()  # type: ignore[no-untyped-call]
    activities = [a for a in supported if a != ProfilerActivity.CPU]
    on_device = bool(activities) and not gemshal.current_vendor().is_cpu
    with profile(activities=[ProfilerActivity.CPU, *(activities if on_device else [])]) as prof:
        for _ in range(calls):
            fn()
        if on_device:
            gemshal.device_module().synchronize()
    sort = "self_device_time_total" if on_device else "self_cpu_time_total"
    return str(prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60))


def host_overhead(
    dev: torch.device, *, calls: int = 2000, issued: int = 200, repeats: int = 5
) -> list[dict[str, Any]]:
    """Microseconds per call on tiny tensors, per side, medians of ``repeats``.

    ``{side}_host_us``: the wall time of issuing ``issued`` calls after a synchronize,
    fewer than a device's launch queue holds, so no call waits for the device: the host
    time a user pays per op. ``{side}_us``: ``calls`` calls and one synchronize, which
    also shows the device's time when a kernel is slower than the host.
    """
    module = gemshal.device_module()
    peer = flag_gems()
    tiny: dict[str, tuple[Callable[[torch.Tensor], Any], tuple[int, ...]]] = {
        "add 1024": (lambda a: torch.add(a, a), (1024,)),
        "softmax 64x1024": (lambda a: torch.softmax(a, -1), (64, 1024)),
        "sum 64x1024": (lambda a: a.sum(-1), (64, 1024)),
        "mm 64x64x64": (lambda a: torch.mm(a, a), (64, 64)),
    }
    rows = []
    for label, (fn, shape) in tiny.items():
        x = torch.randn(shape, device=dev)
        row: dict[str, Any] = {"case": label}
        for side, context in sides_of(peer).items():
            with context():
                for _ in range(50):
                    fn(x)
                host, total = [], []
                for _ in range(repeats):
                    module.synchronize()
                    start = time.perf_counter()
                    for _ in range(issued):
                        fn(x)
                    host.append((time.perf_counter() - start) / issued * 1e6)
                    module.synchronize()
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn(x)
                    module.synchronize()
                    total.append((time.perf_counter() - start) / calls * 1e6)
                row[f"{side}_host_us"] = statistics.median(host)
                row[f"{side}_us"] = statistics.median(total)
        for side in sides_of(peer):
            if side != "torch":
                row[f"{side}_host_over_torch"] = row[f"{side}_host_us"] / row["torch_host_us"]
        rows.append(row)
    return rows


def host_profile(dev: torch.device, path: str, *, calls: int = 2000) -> None:
    """Write a cProfile of ``calls`` tiny adds through ``use_gems`` (time per function)."""
    import cProfile
    import io
    import pstats

    x = torch.randn(1024, device=dev)
    with registry.use_gems():
        for _ in range(50):
            torch.add(x, x)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            torch.add(x, x)
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    with open(path, "w") as fh:
        fh.write(f"cProfile of {calls} x torch.add(x, x), x = 1024 floats, under use_gems\n")
        fh.write(text.getvalue())


def import_cost(runs: int = 3) -> dict[str, float]:
    """Fresh-process seconds: ``import torch, triton`` against ``import gemsops; enable()``."""
    scripts = {
        "torch_triton_s": "import torch, triton",
        "gemsops_enable_s": "import torch, triton, gemsops; gemsops.enable()",
    }
    out = {}
    for key, code in scripts.items():
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            samples.append(time.perf_counter() - start)
        out[key] = statistics.median(samples)
    out["overhead_s"] = out["gemsops_enable_s"] - out["torch_triton_s"]
    return out
