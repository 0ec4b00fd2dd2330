"""The gemshal command line: reports, JSON, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemshal
from gemshal.cli import main
from gemshal.kernel.launcher import launch_path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "GEMS_VENDOR"}
    full = {**inherited, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gemshal", *args], capture_output=True, text=True, env=full
    )


def test_info_reports_device_vendor_and_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """`gemshal info` prints the device, the vendor record and each trace step."""
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "gemshal device report" in out
    for key in ("device", "architecture", "dispatch key", "distributed backend"):
        assert key in out
    path = launch_path()
    if gemshal.current_device().interpreter:
        assert "launch path          JITFunction.run (kernels run on the Triton interpreter)" in out
    else:
        assert f"({path.reason})" in out
    assert "[fallback] cpu: chosen" in out or "[env]" in out


def test_info_json_is_machine_readable(capsys: pytest.CaptureFixture[str]) -> None:
    """`gemshal info --json` gives the device, vendor and trace as JSON."""
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"]["vendor"] == report["vendor"]["name"]
    assert report["trace"] and {"stage", "verdict", "detail"} <= set(report["trace"][0])
    if gemshal.current_device().interpreter:
        expected = {"direct": False, "reason": "kernels run on the Triton interpreter"}
        assert report["launch"] == expected
    else:
        assert report["launch"]["direct"] == launch_path().direct


def test_vendors_lists_every_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    """`gemshal vendors` lists each built-in vendor with its device type and backend."""
    assert main(["vendors"]) == 0
    out = capsys.readouterr().out
    for name in ("nvidia", "ascend", "cambricon", "mthreads", "hygon", "cpu"):
        assert any(line.startswith(name) for line in out.splitlines())


def test_vendors_shows_broken_plugins(plugins: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plugin that failed to load is listed as FAILED with its error."""
    assert main(["vendors"]) == 0
    out = capsys.readouterr().out
    assert "demo" in out
    assert "FAILED" in out and "broken_runtime" in out
    assert main(["vendors", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["failed_plugins"][0]["name"] == "broken"


def test_misspelt_vendor_exits_nonzero_naming_valid_ones() -> None:
    """`GEMS_VENDOR=nvidai gemshal info` exits 1 and lists the known vendors, no traceback."""
    done = _run("info", env={"GEMS_VENDOR": "nvidai"})
    assert done.returncode == 1
    assert "nvidai" in done.stderr and "nvidia" in done.stderr and "cambricon" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_arguments_give_usage_and_exit_2() -> None:
    """An unknown subcommand or flag prints usage and exits 2."""
    done = _run("infoo")
    assert done.returncode == 2
    assert "usage: gemshal" in done.stderr and "Traceback" not in done.stderr
    done = _run("info", "--jsn")
    assert done.returncode == 2


def test_module_entry_defaults_to_info() -> None:
    """`python -m gemshal` with no arguments prints the device report."""
    done = _run(env={"GEMS_VENDOR": "cpu"})
    assert done.returncode == 0, done.stderr
    assert "gemshal device report" in done.stdout and "[env] cpu: chosen" in done.stdout
