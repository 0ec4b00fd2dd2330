"""Shared fixtures: device resolution before kernel modules load, and isolation helpers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import gemshal
from gemshal import device as _device
from gemshal import registry as _registry

PLUGINS = Path(__file__).parent / "plugins"

# CI profile: small and quick on 2 CPU cores through the interpreter. The gpu profile
# (GEMSOPS_HYPOTHESIS_PROFILE=gpu, with GEMSOPS_TEST_MAX_NUMEL raised) draws more.
settings.register_profile(
    "ci",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
# On the H200, 60 examples per property took the pointwise file 310 s of compiling (a
# new kernel specialisation per drawn layout): 40 keeps each file within one device call.
settings.register_profile(
    "gpu",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("GEMSOPS_HYPOTHESIS_PROFILE", "ci"))

# Every test checks gemsops' own kernels from their first call: on a GPU, no call may be
# served by torch while its kernel compiles (tests/test_compile.py turns that on itself).
os.environ["GEMS_COMPILE"] = "wait"


def pytest_configure(config: pytest.Config) -> None:
    # Resolve the device before any test module imports kernel modules: on a CPU-only
    # machine this switches Triton to its interpreter, as gemsops itself does.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        gemshal.current_device()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `@pytest.mark.gpu` tests need a real accelerator: on the interpreter they are skipped.
    if not gemshal.current_device().interpreter:
        return
    skip = pytest.mark.skip(reason="needs a real accelerator, not the Triton interpreter")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def isolated() -> Iterator[None]:
    """Run a test with fresh gemshal state; put the session's state back afterwards."""
    saved = (_device._STATE, _device._EXPLICIT, _registry._STATE)
    _device._reset()
    _registry._reset()
    try:
        yield
    finally:
        _device._STATE, _device._EXPLICIT, _registry._STATE = saved


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch, isolated: None) -> Path:
    """Make the test plugin distributions (a working one and a broken one) installed."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    return PLUGINS
