"""Settings are checked when given, not only when the code that reads them happens to run."""

from __future__ import annotations

import pytest
import torch

import gemshal
from gemshal import ConfigError, DeviceGuardError
from gemshal.detect import detect
from gemshal.testing import fake_vendor


def test_probe_commands_flag_is_checked_even_when_gems_vendor_decides() -> None:
    """GEMS_PROBE_COMMANDS=yes is a ConfigError naming the variable, the value and the valid
    values even when GEMS_VENDOR settles the vendor and no command would run."""
    env = {"GEMS_VENDOR": "cpu", "GEMS_PROBE_COMMANDS": "yes"}
    with pytest.raises(ConfigError, match=r"GEMS_PROBE_COMMANDS must be 0 or 1.*'yes'"):
        detect(facts=gemshal.StaticFacts(), env=env)


def test_probe_commands_flag_is_checked_even_with_an_explicit_choice() -> None:
    """GEMS_PROBE_COMMANDS=yes is an error under gemshal.select()'s explicit choice too."""
    with pytest.raises(ConfigError, match="GEMS_PROBE_COMMANDS"):
        detect(facts=gemshal.StaticFacts(), env={"GEMS_PROBE_COMMANDS": "yes"}, explicit="cpu")


def test_probe_commands_flag_accepts_its_valid_values() -> None:
    """GEMS_PROBE_COMMANDS 0, 1 and empty are accepted under GEMS_VENDOR."""
    for value in ("0", "1", ""):
        env = {"GEMS_VENDOR": "cpu", "GEMS_PROBE_COMMANDS": value}
        assert detect(facts=gemshal.StaticFacts(), env=env).vendor.name == "cpu"


@pytest.mark.skipif(not gemshal.current_vendor().is_cpu, reason="describes the CPU vendor")
def test_guard_index_out_of_range_on_the_cpu_is_an_error() -> None:
    """device_guard(5) on the one-device CPU vendor is a DeviceGuardError naming the valid
    range, as on an accelerator; index 0 and the CPU itself stay no-op guards."""
    with pytest.raises(DeviceGuardError, match=r"device index 5 .*valid indices are 0\.\.0"):
        gemshal.device_guard(5)
    with pytest.raises(DeviceGuardError, match=r"valid indices are 0\.\.0"):
        gemshal.device_of(1)
    with gemshal.device_guard(0), gemshal.device_guard("cpu"), gemshal.device_guard(torch.zeros(1)):
        pass


def test_guard_index_out_of_range_on_a_single_device_is_an_error() -> None:
    """With one fake accelerator, an int index past it is an error, every time it is asked."""
    with fake_vendor(count=1):
        for _ in range(2):  # a failed check is never cached as an answer
            with pytest.raises(DeviceGuardError, match=r"valid indices are 0\.\.0"):
                gemshal.device_guard(3)
