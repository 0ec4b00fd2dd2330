"""Anvil: a simulated accelerator, packaged as a gemshal vendor plugin.

Anvil has no hardware: its kernels run on the CPU through the Triton interpreter, like
gemshal's built-in ``cpu`` vendor, so the whole plugin path (record, probe, tuning file,
kernel override) can be tested on any machine. A real vendor writes the same three
entry points (see pyproject.toml) with its own device type and dispatch key.

This module is what the ``gemshal.vendors`` and ``gemshal.tune_dirs`` entry points
load: keep it light (no torch, no triton, no gemsops), since gemshal imports it
whenever its registry is first used, on every machine the plugin is installed on.
"""

from __future__ import annotations

from pathlib import Path

from gemshal import Capabilities, Claim, Facts, VendorInfo

__all__ = ["TUNE_DIR", "VENDOR"]

TUNE_DIR = Path(__file__).resolve().parent / "tune"
"""Anvil's tuning files (``anvil.toml``), found through the ``gemshal.tune_dirs`` entry point."""


def probe(facts: Facts) -> Claim | None:
    """Looks for the anvil_runtime driver module.

    A simulated device has no driver, so on any real machine this declines and Anvil
    is never detected over another vendor (or over ``cpu``): it runs only when chosen,
    with ``GEMS_VENDOR=anvil`` or ``gemshal.select("anvil")``.
    """
    if facts.has_module("anvil_runtime"):
        return Claim("the anvil_runtime driver module is installed")
    return None


VENDOR = VendorInfo(
    name="anvil",  # the entry point's name must be the same
    display_name="Anvil (simulated, Triton interpreter)",
    device_type="cpu",  # tensors live on the CPU: kernels run on the Triton interpreter
    dispatch_key="CPU",  # where gemsops registers its aten kernels
    triton_backends=("anvil",),  # what target.backend would be for a real Anvil driver
    torch_module=None,
    device_module_name="cpu",
    visible_devices_env="ANVIL_VISIBLE_DEVICES",
    dist_backend="gloo",
    capabilities=Capabilities(fp64=True, bf16=True, int64=True, fp8=False),
    command_probe=("anvil-smi", "--list"),  # only run with GEMS_PROBE_COMMANDS=1
    probe=probe,
    warp_size=1,
    # Launch keywords Anvil's Triton takes beyond num_warps/num_stages/num_ctas/maxnreg:
    # its tuning file may set them, and no other vendor's may.
    launch_options=("enable_fp_fusion",),
)
"""Anvil's record, named by the ``gemshal.vendors`` entry point."""
