"""A vendor that cannot run here is one `<prog>: error:` line and exit 1, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gemshal
from gemshal import DeviceNotFoundError, GemshalError
from gemshal import device as device_module
from gemshal.detect import Detection, TraceStep
from gemshal.errors import PluginLoadError
from gemshal.testing import FakeDeviceModule

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).parent / "plugins"

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA devices")
no_torch_mlu = pytest.mark.skipif(
    importlib.util.find_spec("torch_mlu") is not None, reason="torch_mlu is installed"
)


def _run(module: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GEMS_")}
    path = os.pathsep.join([str(ROOT), str(PLUGINS)])
    full = {**inherited, "PYTHONPATH": path, **env}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=full
    )


def _one_error_line(done: subprocess.CompletedProcess[str], prog: str) -> str:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), done.stderr
    return lines[0]


@no_cuda
def test_gems_vendor_without_its_devices_is_one_error_line() -> None:
    """`GEMS_VENDOR=nvidia gemshal info` without CUDA devices names the vendor and the
    empty device count in one line, exit 1."""
    line = _one_error_line(_run("gemshal", "info", env={"GEMS_VENDOR": "nvidia"}), "gemshal")
    assert "'nvidia'" in line and "GEMS_VENDOR=nvidia" in line
    assert "torch.cuda.device_count() is 0" in line


@no_torch_mlu
def test_gems_vendor_without_its_extension_is_one_error_line() -> None:
    """`GEMS_VENDOR=cambricon gemshal info` without torch_mlu names the vendor and the
    missing extension in one line, exit 1."""
    line = _one_error_line(_run("gemshal", "info", env={"GEMS_VENDOR": "cambricon"}), "gemshal")
    assert "'cambricon'" in line and "torch_mlu" in line


def test_gems_vendor_naming_a_broken_plugin_is_one_error_line() -> None:
    """`GEMS_VENDOR=broken gemshal info` names the plugin, its entry point and its error."""
    line = _one_error_line(_run("gemshal", "info", env={"GEMS_VENDOR": "broken"}), "gemshal")
    assert "GEMS_VENDOR=broken" in line and "gemshal_broken_vendor:VENDOR" in line
    assert "broken_runtime" in line


@no_torch_mlu
def test_gemsops_commands_give_the_same_one_line_error() -> None:
    """`gemsops ops` under a vendor whose extension is missing is a `gemsops: error:` line."""
    line = _one_error_line(_run("gemsops", "ops", env={"GEMS_VENDOR": "cambricon"}), "gemsops")
    assert "'cambricon'" in line and "torch_mlu" in line


def _env_choice(name: str) -> Detection:
    step = TraceStep("env", "chosen", f"GEMS_VENDOR={name}", name)
    return Detection(gemshal.vendor(name), "env", (step,))


def test_a_vendor_with_no_devices_is_a_device_not_found_error(isolated: None) -> None:
    """Installing a vendor whose runtime counts 0 devices raises DeviceNotFoundError naming
    the vendor and how it was chosen, and leaves nothing half-resolved."""
    with pytest.raises(DeviceNotFoundError, match=r"'nvidia' \(GEMS_VENDOR=nvidia\).*is 0"):
        device_module._install(_env_choice("nvidia"), FakeDeviceModule(count=0))
    assert device_module._STATE is None


def test_a_device_count_that_raises_is_chained_not_swallowed(isolated: None) -> None:
    """A runtime whose device_count() raises gives a GemshalError whose cause is that error."""

    class Broken(FakeDeviceModule):
        def device_count(self) -> int:
            raise AssertionError("Torch not compiled with CUDA enabled")

    with pytest.raises(DeviceNotFoundError, match="not compiled with CUDA") as caught:
        device_module._install(_env_choice("nvidia"), Broken())
    assert isinstance(caught.value.__cause__, AssertionError)


@no_torch_mlu
def test_a_missing_extension_is_chained_to_its_import_error(isolated: None) -> None:
    """A vendor whose torch extension does not import raises DeviceNotFoundError from the
    ImportError, naming the extension."""
    with pytest.raises(DeviceNotFoundError, match="torch_mlu") as caught:
        device_module._install(_env_choice("cambricon"))
    assert isinstance(caught.value.__cause__, ImportError)


@no_torch_mlu
def test_failed_select_keeps_the_previous_choice(isolated: None) -> None:
    """select() of a vendor that cannot run here raises and leaves the current vendor as it was."""
    gemshal.select("cpu")
    with pytest.raises(GemshalError, match="torch_mlu"):
        gemshal.select("cambricon")
    assert gemshal.current_vendor().name == "cpu"


def test_selecting_a_broken_plugin_is_a_gemshal_error(plugins: Path) -> None:
    """Asking for a plugin that failed to load raises PluginLoadError (a GemshalError and an
    ImportError) whose cause is the plugin's own error, every time the same."""
    with pytest.raises(PluginLoadError, match="broken_runtime") as caught:
        gemshal.vendor("broken")
    first = caught.value
    with pytest.raises(PluginLoadError) as caught:
        gemshal.vendor("broken")
    second = caught.value
    assert isinstance(first, GemshalError) and isinstance(first, ImportError)
    assert isinstance(first.__cause__, ImportError) and first.__cause__ is second.__cause__
    assert str(first) == str(second)
    assert not getattr(first.__cause__, "__notes__", None)  # no note piled up per call


@pytest.mark.parametrize("spelling", ["CPU", "Cpu", "cpU"])
def test_a_vendor_name_in_the_wrong_case_gets_the_right_one_suggested(spelling: str) -> None:
    """An unknown vendor name that differs from a known one only in case is answered with
    "did you mean" that name, whatever the case."""
    with pytest.raises(gemshal.UnknownVendorError, match="Did you mean 'cpu'"):
        gemshal.vendor(spelling)


def test_config_dir_that_does_not_exist_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`gemshal config --dir` naming no directory is one error line (not accepted silently)."""
    from gemshal.cli import main

    assert main(["config", "--list", "--dir", "/nonexistent/tune"]) == 1
    assert "--dir '/nonexistent/tune': no such directory" in capsys.readouterr().err
