"""The built-in vendor platforms, one module each, in detection order."""

from __future__ import annotations

from gemshal.platforms.amd import VENDOR as _amd
from gemshal.platforms.ascend import VENDOR as _ascend
from gemshal.platforms.cambricon import VENDOR as _cambricon
from gemshal.platforms.cpu import VENDOR as _cpu
from gemshal.platforms.hygon import VENDOR as _hygon
from gemshal.platforms.iluvatar import VENDOR as _iluvatar
from gemshal.platforms.intel import VENDOR as _intel
from gemshal.platforms.kunlunxin import VENDOR as _kunlunxin
from gemshal.platforms.metax import VENDOR as _metax
from gemshal.platforms.mthreads import VENDOR as _mthreads
from gemshal.platforms.nvidia import VENDOR as _nvidia
from gemshal.vendor import VendorInfo

BUILTIN: tuple[VendorInfo, ...] = (
    _nvidia,
    _amd,
    _intel,
    _ascend,
    _cambricon,
    _mthreads,
    _metax,
    _iluvatar,
    _kunlunxin,
    _hygon,
    _cpu,
)
"""Every built-in vendor; each CUDA look-alike's probe excludes the others, not the order."""
