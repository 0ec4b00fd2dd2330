"""The built-in vendors, one module each, in detection order."""

from __future__ import annotations

from gemshal.vendor import VendorInfo
from gemshal.vendors.nvidia import VENDOR as _nvidia
from gemshal.vendors.amd import VENDOR as _amd
from gemshal.vendors.intel import VENDOR as _intel
from gemshal.vendors.ascend import VENDOR as _ascend
from gemshal.vendors.cambricon import VENDOR as _cambricon
from gemshal.vendors.mthreads import VENDOR as _mthreads
from gemshal.vendors.metax import VENDOR as _metax
from gemshal.vendors.iluvatar import VENDOR as _iluvatar
from gemshal.vendors.kunlunxin import VENDOR as _kunlunxin
from gemshal.vendors.hygon import VENDOR as _hygon
from gemshal.vendors.cpu import VENDOR as _cpu

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
"""Every built-in vendor. Look-alikes are listed so no CUDA device is taken for NVIDIA by order alone."""
