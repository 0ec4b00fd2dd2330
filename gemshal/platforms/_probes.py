"""Probe building blocks shared by the built-in vendors.

Several vendors ship a torch that reports device type ``cuda`` (ROCm and Hygon
through HIP; MetaX, Iluvatar and Kunlunxin through their own CUDA-compatible
stacks). They are told apart by ``torch.version.hip`` and the device name, so
NVIDIA is concluded only when no look-alike matches.
"""

from __future__ import annotations

from gemshal.probe import Claim, Facts

# Substrings of device names (lower-cased) that identify CUDA look-alikes.
HYGON_MARKERS = ("hygon", "dcu", "k100", "z100")
METAX_MARKERS = ("metax", "mxc", "c500")
ILUVATAR_MARKERS = ("iluvatar", "bi-v", "mr-v", "corex")
KUNLUNXIN_MARKERS = ("kunlun", "p800", "r200", "r300")
CUDA_LOOKALIKES = (*METAX_MARKERS, *ILUVATAR_MARKERS, *KUNLUNXIN_MARKERS)


def _cuda_name(facts: Facts) -> str | None:
    if facts.accelerator() != "cuda" and not facts.has_torch_backend("cuda"):
        return None
    return facts.device_name("cuda") or ""


def _matches(name: str, markers: tuple[str, ...]) -> str | None:
    lowered = name.lower()
    return next((m for m in markers if m in lowered), None)


def nvidia(facts: Facts) -> Claim | None:
    """Looks for a CUDA device that is neither HIP nor a known look-alike."""
    if facts.hip_version() is not None:
        return None
    name = _cuda_name(facts)
    if name is None or _matches(name, CUDA_LOOKALIKES):
        return None
    return Claim(f"torch reports a CUDA device {name!r} and no HIP runtime")


def rocm(facts: Facts, *, hygon: bool) -> Claim | None:
    """Looks for a HIP runtime whose device name is Hygon's (``hygon=True``) or not (AMD)."""
    hip = facts.hip_version()
    if hip is None:
        return None
    name = facts.device_name("cuda") or ""
    if (_matches(name, HYGON_MARKERS) is not None) != hygon:
        return None
    return Claim(f"torch.version.hip is {hip} and device 0 is {name!r}")


def cuda_lookalike(facts: Facts, markers: tuple[str, ...]) -> Claim | None:
    """Looks for a torch ``cuda`` device whose name carries one of ``markers``."""
    name = _cuda_name(facts)
    if not name:
        return None
    marker = _matches(name, markers)
    if marker is None:
        return None
    return Claim(f"torch reports a cuda device named {name!r} (matches {marker!r})")


def torch_backend(facts: Facts, backend: str) -> Claim | None:
    """Looks for a device type built into torch (``backend``) that reports devices."""
    if facts.accelerator() == backend or facts.has_torch_backend(backend):
        return Claim(f"torch.{backend} reports available devices")
    return None


def extension_module(facts: Facts, module: str) -> Claim | None:
    """Looks for the vendor's torch extension ``module``, installed."""
    if facts.has_module(module):
        return Claim(f"the torch extension {module!r} is installed")
    return None
