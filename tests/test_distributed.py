"""Scale-out through the HAL: rank binding, backends, and a two-rank gloo job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gemshal
from gemshal import ConfigError
from gemshal.distributed import bind_local_rank, dist_backend, local_rank
from gemshal.testing import fake_vendor

ROOT = Path(__file__).resolve().parent.parent


def test_local_rank_reads_the_variable_and_rejects_garbage() -> None:
    """LOCAL_RANK is read as an integer; a malformed value is an error naming it."""
    assert local_rank({}) == 0
    assert local_rank({"LOCAL_RANK": "3"}) == 3
    with pytest.raises(ConfigError, match=r"LOCAL_RANK.*'two'"):
        local_rank({"LOCAL_RANK": "two"})
    with pytest.raises(ConfigError, match="-1"):
        local_rank({"LOCAL_RANK": "-1"})


def test_each_vendor_names_its_process_group_backend() -> None:
    """The cpu vendor uses gloo; accelerator vendors use their collective libraries."""
    assert dist_backend() == gemshal.current_vendor().dist_backend
    assert gemshal.vendor("cpu").dist_backend == "gloo"
    assert gemshal.vendor("nvidia").dist_backend == "nccl"
    assert gemshal.vendor("ascend").dist_backend == "hccl"


def test_bind_local_rank_makes_that_device_current() -> None:
    """Rank 1 of a job on a two-device machine gets device 1 made current."""
    with fake_vendor(count=2) as mod:
        setup = bind_local_rank({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"})
        assert setup.device.index == 1 and mod.current == 1
        assert (setup.rank, setup.local_rank, setup.world_size) == (1, 1, 2)
        setup = bind_local_rank({"LOCAL_RANK": "3"})  # more ranks than devices: round-robin
        assert setup.device.index == 1


def test_two_gloo_ranks_run_gemsops_and_all_reduce() -> None:
    """torchrun with two CPU ranks: each runs gemsops kernels, the all-reduce agrees."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "GEMS_VENDOR"},
        "GEMS_VENDOR": "cpu",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", "29517", str(ROOT / "examples" / "torchrun_demo.py"),
        ],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = re.findall(r"rank \d/2 on cpu via gloo: .*?(?:OK|MISMATCH)", done.stdout)
    assert len(lines) == 2, done.stdout
    assert all(line.endswith("OK") for line in lines)
    assert all("served 0 calls" not in line for line in lines)
