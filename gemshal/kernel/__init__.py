"""The kernel wing: one decorator for a Triton kernel, its plan, and its launcher.

* :mod:`gemshal.kernel.decorator`: ``@kernel(op, key=[...])`` over ``@triton.jit``; one
  key per call maps straight to the compiled kernel, its grid and its constants.
* :mod:`gemshal.kernel.plan`: where a bucket's config comes from (tables first, then
  the nearest table row, then the entry's first config that fits; benchmarking only
  with ``GEMS_AUTOTUNE=1`` or ``all``).
* :mod:`gemshal.kernel.launcher`: the direct launch of a compiled kernel after one
  checked call per specialization, and the stubbed launch of the host-time bench.

Every private Triton name the wing uses lives in :mod:`gemshal._triton`.
"""

from __future__ import annotations

from gemshal.kernel.decorator import PROGRESS_ENV as PROGRESS_ENV
from gemshal.kernel.decorator import Kernel as Kernel
from gemshal.kernel.decorator import Prepared as Prepared
from gemshal.kernel.decorator import Recording as Recording
from gemshal.kernel.decorator import Rule as Rule
from gemshal.kernel.decorator import choices as choices
from gemshal.kernel.decorator import kernel as kernel
from gemshal.kernel.decorator import recording as recording
from gemshal.kernel.decorator import tuned as tuned
from gemshal.kernel.launcher import LAUNCH_ENV as LAUNCH_ENV
from gemshal.kernel.launcher import LaunchPath as LaunchPath
from gemshal.kernel.launcher import launch_path as launch_path
from gemshal.kernel.launcher import stats as stats
from gemshal.kernel.launcher import stub_launches as stub_launches
from gemshal.kernel.plan import AUTOTUNE_ENV as AUTOTUNE_ENV
from gemshal.kernel.plan import POLICIES as POLICIES
from gemshal.kernel.plan import policy as policy

__all__ = [
    "AUTOTUNE_ENV",
    "LAUNCH_ENV",
    "POLICIES",
    "PROGRESS_ENV",
    "Kernel",
    "LaunchPath",
    "Prepared",
    "Recording",
    "Rule",
    "choices",
    "kernel",
    "launch_path",
    "policy",
    "recording",
    "stats",
    "stub_launches",
    "tuned",
]
