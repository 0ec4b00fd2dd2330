"""Host time of cross_entropy forward + backward per call on the CPU, launches stubbed
(gemshal.kernel.stub_launches): ViT's 32x1000 loss and two larger ones, with the ops one
call served.

    python .ci/host_loss.py
"""
import time

import torch
import torch.nn.functional as F

import gemsops
from gemshal.kernel import stub_launches
from gemshal.kernel.compile import waiting

for rows, v in [(32, 1000), (256, 1000), (8192, 2000)]:
    x = torch.randn(rows, v, requires_grad=True)
    t = torch.randint(0, v, (rows,))

    def fn() -> None:
        F.cross_entropy(x, t).backward()

    with stub_launches(), gemsops.use_gems():
        with waiting():
            fn()
        fn()
        with gemsops.record() as rec:
            fn()
        times = []
        for _ in range(20):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    times.sort()
    served = ", ".join(line.strip() for line in rec.summary().splitlines())
    print(f"{rows}x{v}: {times[10] * 1e6:.0f} us a call; {served}")
