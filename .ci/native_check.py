"""The native replay on a GPU: each case five times with fresh inputs of one structure
under ``use_gems()`` (GEMS_NATIVE=1 in the environment), every answer compared with
torch's; then the native kernels' counters (hits must be > 0 for the cases it takes).

    GEMS_NATIVE=1 python3 .ci/native_check.py
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import gemsops
from gemshal.kernel.compile import waiting

assert os.environ.get("GEMS_NATIVE") == "1", "run with GEMS_NATIVE=1"
dev = "cuda"
bf = torch.bfloat16


def gen(seed: int):
    return torch.Generator(device="cpu").manual_seed(seed)


def r(*shape, dtype=torch.float32, seed=0, grad=False):
    t = torch.randn(*shape, generator=gen(seed)).to(dev, dtype)
    return t.requires_grad_(grad)


def attention(seed):
    q, k, v = (r(2, 4, 128, 64, dtype=bf, seed=seed + i, grad=True) for i in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().square().sum().backward()
    return out, q.grad, k.grad, v.grad


def norm_bwd(seed):
    x = r(64, 1024, dtype=bf, seed=seed, grad=True)
    w = r(1024, dtype=bf, seed=seed + 1, grad=True)
    y = F.rms_norm(x, (1024,), w, 1e-6)
    dy = r(64, 1024, dtype=bf, seed=seed + 2)  # contiguous: the backward is replayed
    return y, *torch.autograd.grad(y, (x, w), dy)


def ln_bwd(seed):
    x = r(64, 768, dtype=bf, seed=seed, grad=True)
    w = r(768, dtype=bf, seed=seed + 1, grad=True)
    b = r(768, dtype=bf, seed=seed + 2, grad=True)
    y = F.layer_norm(x, (768,), w, b)
    return y, *torch.autograd.grad(y, (x, w, b), r(64, 768, dtype=bf, seed=seed + 3))


def ce_labels(seed):
    t = torch.randint(0, 1000, (64,), generator=gen(seed)).to(dev)
    t[::7] = -100  # ignored rows
    return t


def ce_bwd(seed):
    x = r(64, 1000, dtype=bf, seed=seed, grad=True)
    loss = F.cross_entropy(x, ce_labels(seed))
    loss.backward()
    return loss, x.grad


def inplace(seed):
    x = r(256, 512, seed=seed)
    x.add_(r(256, 512, seed=seed + 1), alpha=2)
    x.mul_(0.5)
    return x


CASES = {
    "add": lambda s: r(1024, seed=s) + r(1024, seed=s + 1),
    "mul scalar": lambda s: r(64, 1024, dtype=bf, seed=s) * 2.0,
    "broadcast add": lambda s: r(8, 64, 1024, dtype=bf, seed=s) + r(1024, dtype=bf, seed=s + 1),
    "strided silu": lambda s: F.silu(r(1024, 512, dtype=bf, seed=s).t()),
    "inplace": inplace,
    "softmax": lambda s: torch.softmax(r(64, 1024, seed=s), -1),
    "log_softmax bf16": lambda s: torch.log_softmax(r(64, 1000, dtype=bf, seed=s), -1),
    "sum(-1)": lambda s: r(64, 1024, seed=s).sum(-1),
    "mean": lambda s: r(16, 4096, dtype=bf, seed=s).mean(-1, keepdim=True),
    "mm bf16": lambda s: r(512, 1024, dtype=bf, seed=s) @ r(1024, 768, dtype=bf, seed=s + 1),
    "linear bf16": lambda s: F.linear(r(4, 128, 1024, dtype=bf, seed=s),
                                      r(512, 1024, dtype=bf, seed=s + 1),
                                      r(512, dtype=bf, seed=s + 2)),
    "bmm bf16": lambda s: torch.bmm(r(8, 128, 64, dtype=bf, seed=s), r(8, 64, 128, dtype=bf, seed=s + 1)),
    "cat": lambda s: torch.cat([r(4, 64, dtype=bf, seed=s), r(4, 32, dtype=bf, seed=s + 1)], 1),
    "to bf16": lambda s: r(256, 256, seed=s).to(bf),
    "clone transposed": lambda s: r(128, 64, dtype=bf, seed=s).t().clone(),
    "cross_entropy": lambda s: F.cross_entropy(r(64, 1000, dtype=bf, seed=s), ce_labels(s)),
    "cross_entropy sum, smoothed": lambda s: F.cross_entropy(
        r(32, 512, seed=s), ce_labels(s)[:32] % 512, reduction="sum", label_smoothing=0.1),
    "cross_entropy none": lambda s: F.cross_entropy(r(48, 1000, dtype=bf, seed=s),
                                                    ce_labels(s)[:48], reduction="none"),
    "cross_entropy fwd+bwd": ce_bwd,
    "rms_norm fwd+bwd": norm_bwd,
    "layer_norm fwd+bwd": ln_bwd,
    "sdpa fwd+bwd": attention,
}


def close(a, b) -> bool:
    if isinstance(a, tuple):
        return all(close(x, y) for x, y in zip(a, b, strict=True))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    tol = 2e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-4
    return bool(torch.allclose(a.float(), b.float(), rtol=tol, atol=tol))


def main() -> int:
    from gemsops import native

    failures = 0
    for name, case in CASES.items():
        want = [case(10 * i) for i in range(5)]
        got = []
        t = time.perf_counter()
        with waiting(), gemsops.use_gems():
            for i in range(5):
                got.append(case(10 * i))
            torch.cuda.synchronize()
            served = {k: v for k, v in native.stats().items() if any(v.values())}
        ok = all(close(g, w) for g, w in zip(got, want, strict=True))
        failures += not ok
        hits = sum(v["hits"] for v in served.values())
        print(json.dumps({"case": name, "ok": ok, "native_hits": hits,
                          "s": round(time.perf_counter() - t, 2),
                          "native": {k: [v["hits"], v["misses"], v["unkeyed"], v["refused"]]
                                     for k, v in served.items()}}), flush=True)
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
