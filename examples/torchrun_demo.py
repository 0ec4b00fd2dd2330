"""Each rank runs a gemsops forward on its own device and all-reduces the result.

Run with ``torchrun --nproc-per-node 2 examples/torchrun_demo.py``. The job names no
vendor: gemshal picks the device for LOCAL_RANK and the process-group backend
(nccl on NVIDIA, gloo on the CPU...).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import gemshal
import gemsops
from gemshal.distributed import bind_local_rank


def main() -> None:
    """Bind the rank, compute a softmax-weighted sum with gemsops, all-reduce, check."""
    setup = bind_local_rank()
    dist.init_process_group(backend=setup.backend)
    device = setup.device.torch_device
    gen = torch.Generator().manual_seed(1234 + setup.rank)
    x = torch.randn(8, 64, generator=gen).to(device)
    with gemshal.device_guard(device), gemsops.use_gems(), gemsops.record() as rec:
        local = (torch.softmax(x, dim=-1) * x).sum()
    expected_local = (torch.softmax(x.double().cpu(), dim=-1) * x.double().cpu()).sum()
    total = local.detach().clone()
    dist.all_reduce(total)
    expected = expected_local.to(device)
    dist.all_reduce(expected)
    ok = abs(total.item() - expected.item()) < 1e-3 * max(1.0, abs(expected.item()))
    line = (
        f"rank {setup.rank}/{setup.world_size} on {device} via {setup.backend}: "
        f"local {local.item():.6f}, all-reduced {total.item():.6f}, "
        f"expected {expected.item():.6f}, gemsops served {sum(rec.served.values())} calls, "
        f"{'OK' if ok else 'MISMATCH'}\n"
    )
    sys.stdout.write(line)  # one write per rank, so ranks' lines do not interleave
    sys.stdout.flush()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
