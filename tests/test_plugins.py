"""Misbehaving vendor plugins are recorded as failures; none can end the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemshal
from gemshal.cli import main
from gemshal.errors import PluginLoadError

ROOT = Path(__file__).resolve().parent.parent
# Kept apart from tests/plugins so the other plugin tests see only their two plugins.
MISBEHAVING = Path(__file__).parent / "plugins" / "misbehaving"


@pytest.fixture
def misbehaving(monkeypatch: pytest.MonkeyPatch, isolated: None) -> Path:
    """Install the plugins that exit at import and that give None instead of a VendorInfo."""
    monkeypatch.syspath_prepend(str(MISBEHAVING))
    return MISBEHAVING


def test_plugin_calling_sys_exit_is_recorded_not_fatal(misbehaving: Path) -> None:
    """A plugin that calls sys.exit() at import is a recorded failure; the registry loads."""
    failures = {f.name: f for f in gemshal.plugin_failures()}
    assert isinstance(failures["exiting"].error, SystemExit)
    described = failures["exiting"].describe()
    assert "gemshal_exiting_vendor:VENDOR" in described and "sys.exit()" in described
    assert "nvidia" in gemshal.vendor_names() and "cpu" in gemshal.vendor_names()
    with pytest.raises(PluginLoadError, match=r"sys\.exit") as caught:
        gemshal.vendor("exiting")
    assert isinstance(caught.value.__cause__, SystemExit)


def test_plugin_calling_sys_exit_shows_in_the_trace(misbehaving: Path) -> None:
    """Detection reports the exiting plugin as an error line of its trace, and goes on."""
    found = gemshal.detect.detect(facts=gemshal.StaticFacts(), env={})
    errors = {s.vendor: s.detail for s in found.trace if s.verdict == "error"}
    assert "SystemExit" in errors["exiting"]
    assert found.vendor.name == "cpu"


def test_vendors_command_survives_a_plugin_that_exits(
    misbehaving: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemshal vendors` lists the built-ins and marks each misbehaving plugin FAILED."""
    assert main(["vendors"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("nvidia") for line in out.splitlines())
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert {"'exiting'", "'nothing'", "'forgetful'"} <= {line.split()[2] for line in failed}
    assert main(["vendors", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {f["name"] for f in payload["failed_plugins"]} >= {"exiting", "nothing", "forgetful"}


def test_vendors_command_in_a_fresh_process_survives_a_plugin_that_exits() -> None:
    """`python -m gemshal vendors` exits 0 with the table even when a plugin calls sys.exit()."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(MISBEHAVING)])
    done = subprocess.run(
        [sys.executable, "-m", "gemshal", "vendors"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "FAILED  plugin 'exiting'" in done.stdout and "cpu" in done.stdout


def test_entry_point_naming_none_says_what_it_should_name(misbehaving: Path) -> None:
    """An entry point whose object is None fails naming the entry point and the VendorInfo
    (or callable) it must name."""
    failure = {f.name: f for f in gemshal.plugin_failures()}["nothing"]
    described = failure.describe()
    assert "gemshal_none_vendor:VENDOR" in described and "is None" in described
    assert "must name a gemshal.VendorInfo or a callable returning one" in described


def test_entry_point_returning_none_says_what_it_should_return(misbehaving: Path) -> None:
    """A factory entry point that returns None fails naming the callable and that it must
    return a VendorInfo; selecting it is a one-line GemshalError, not a raw TypeError."""
    failure = {f.name: f for f in gemshal.plugin_failures()}["forgetful"]
    described = failure.describe()
    assert "gemshal_none_vendor:make_vendor" in described and "returned None" in described
    assert "must return a gemshal.VendorInfo" in described
    with pytest.raises(PluginLoadError, match=r"must return a gemshal\.VendorInfo"):
        gemshal.detect.detect(facts=gemshal.StaticFacts(), env={"GEMS_VENDOR": "forgetful"})


def test_keyboard_interrupt_while_loading_a_plugin_is_not_swallowed(
    isolated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a plugin loads still interrupts: only it escapes the plugin loader."""
    import importlib.metadata

    from gemshal import registry

    ep = importlib.metadata.EntryPoint(
        "ctrl_c", "gemshal_ctrl_c:VENDOR", registry.ENTRY_POINT_GROUP
    )

    def interrupted(self: importlib.metadata.EntryPoint) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.metadata.EntryPoint, "load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry._load_plugin(ep)


def test_tune_dirs_entry_point_that_exits_is_an_error_at_every_lookup(misbehaving: Path) -> None:
    """An installed package whose `gemshal.tune_dirs` entry point calls sys.exit() is a
    ConfigError naming it at every tuning lookup, never skipped after the first."""
    from strategies_tune import fresh_tune

    from gemshal import ConfigError, tune

    ctx = tune.TuneContext(vendor="cpu", arch="x86_64", interpreter=True)
    with fresh_tune():
        tune._ENTRY_POINTS_LOADED = False
        for _ in range(2):
            with pytest.raises(ConfigError, match=r"'exiting'.*failed to load"):
                tune.search_path(ctx)


def test_a_record_with_a_wrong_field_type_is_a_failure_naming_the_field(
    misbehaving: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin VendorInfo with a string for tune_dirs, or a dict for capabilities, does not
    load: `gemshal vendors` lists it FAILED with the field named, and selecting it raises."""
    failures = {f.name: f.describe() for f in gemshal.plugin_failures()}
    assert "tune_dirs must be a tuple of strings" in failures["qastr"]
    assert "capabilities must be a gemshal.Capabilities record" in failures["qacaps"]
    assert main(["vendors"]) == 0
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAILED")]
    assert any("'qastr'" in line for line in failed) and any("'qacaps'" in line for line in failed)
    with pytest.raises(PluginLoadError, match="tune_dirs"):
        gemshal.vendor("qastr")


def test_example_plugin_asks_for_the_setuptools_its_license_field_needs() -> None:
    """The example plugin's SPDX license string (PEP 639) needs setuptools 77: its build
    requirement says at least that, so an older setuptools refuses it up front."""
    import re
    import tomllib

    data = tomllib.loads((ROOT / "examples" / "vendor-plugin" / "pyproject.toml").read_text())
    assert isinstance(data["project"]["license"], str)  # the SPDX form
    (req,) = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", req)
    assert match is not None and int(match.group(1)) >= 77, req
