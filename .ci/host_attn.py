"""Host time of the cuDNN attention overload's forward + backward on the CPU, launches
stubbed (gemshal.kernel.stub_launches): B=2, H=4, L=64, D=16 bf16, with and without
dropout and a boolean padding mask; median us a call and the served ops' medians.

    python .ci/host_attn.py
"""
import collections
import statistics
import time

import torch

import gemsops
from gemshal.kernel import stub_launches
from gemshal.kernel.compile import waiting
from gemsops import registry

B, H, L, D = 2, 4, 64, 16
q, k, v, go = (torch.randn(B, H, L, D, dtype=torch.bfloat16) for _ in range(4))
m = torch.ones(B, L, dtype=torch.bool)
m[:, -16:] = False
mask = m[:, None, None, :].expand(B, 1, L, L)
times: dict[str, list[int]] = collections.defaultdict(list)
orig = registry._wrap


def timed(overload, fn, original):  # type: ignore[no-untyped-def]
    inner = orig(overload, fn, original)

    def kernel(keyset, *a, **kw):  # type: ignore[no-untyped-def]
        t = time.perf_counter_ns()
        try:
            return inner(keyset, *a, **kw)
        finally:
            times[overload].append(time.perf_counter_ns() - t)
    return kernel


registry._wrap = timed
for p in (0.0, 0.1):
    for bias in (None, mask):
        def once(p: float = p, bias: torch.Tensor | None = bias) -> None:
            o, lse, _, _, mq, mk, seed, off, _ = \
                torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, p)
            torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                go, q, k, v, o, lse, seed, off, bias, None, None, mq, mk, p, False)

        with stub_launches(), gemsops.use_gems(), gemsops.record() as rec:
            with waiting():
                once()
            for _ in range(20):
                once()
            times.clear()
            ts = []
            for _ in range(200):
                t = time.perf_counter()
                once()
                ts.append(time.perf_counter() - t)
        ops = {name: round(statistics.median(ns) / 1e3, 1) for name, ns in times.items()}
        print(f"p={p} mask={bias is not None}: forward + backward "
              f"{statistics.median(ts) * 1e6:.1f} us; {ops}; handed back {dict(rec.fallbacks)}")
