"""What detection may look at, behind an interface tests can replace.

Vendor probes are pure functions of a :class:`Facts` object. The real one,
:class:`LiveFacts`, asks torch and Triton in-process and caches each answer;
tests pass a :class:`StaticFacts` describing any machine.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Protocol

import attrs

__all__ = ["Claim", "Facts", "LiveFacts", "StaticFacts"]


@attrs.frozen
class Claim:
    """A probe's answer: the vendor recognised this machine, and why."""

    reason: str


class Facts(Protocol):
    """The observations vendor probes are allowed to make. No subprocess except ``run``."""

    def hip_version(self) -> str | None:
        """``torch.version.hip``, or None when torch was not built for ROCm."""

    def accelerator(self) -> str | None:
        """The device type of ``torch.accelerator.current_accelerator()``, or None."""

    def has_module(self, name: str) -> bool:
        """Whether a module (``torch_npu``...) is installed, without importing it."""

    def has_torch_backend(self, name: str) -> bool:
        """Whether ``torch.<name>`` exists and reports at least one device."""

    def device_name(self, device_type: str) -> str | None:
        """The name of device 0 of ``device_type``, or None when unavailable."""

    def triton_backend(self) -> str | None:
        """The backend of the active Triton driver's target; raises when there is no driver."""

    def run(self, argv: tuple[str, ...], timeout: float) -> str | None:
        """Run a command and return its output, or None when it is absent or fails."""


@attrs.define
class StaticFacts:
    """Facts given as plain values: describes any machine, for tests and dry runs."""

    hip: str | None = None
    accel: str | None = None
    modules: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    backends: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)
    names: dict[str, str] = attrs.field(factory=dict)
    triton: str | None = None
    commands: dict[str, str] = attrs.field(factory=dict)
    ran: list[tuple[str, ...]] = attrs.field(factory=list)

    def hip_version(self) -> str | None:
        return self.hip

    def accelerator(self) -> str | None:
        return self.accel

    def has_module(self, name: str) -> bool:
        return name in self.modules

    def has_torch_backend(self, name: str) -> bool:
        return name in self.backends

    def device_name(self, device_type: str) -> str | None:
        return self.names.get(device_type)

    def triton_backend(self) -> str | None:
        return self.triton

    def run(self, argv: tuple[str, ...], timeout: float) -> str | None:
        self.ran.append(argv)
        return self.commands.get(argv[0])


class LiveFacts:
    """Facts read from this process's torch and Triton, each asked at most once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], object] = {}

    def _memo(self, key: tuple[str, str], compute: Callable[[], object]) -> object:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def hip_version(self) -> str | None:
        def compute() -> str | None:
            import torch

            hip = getattr(torch.version, "hip", None)
            return str(hip) if hip else None

        value = self._memo(("hip", ""), compute)
        return value if isinstance(value, str) else None

    def accelerator(self) -> str | None:
        def compute() -> str | None:
            import torch

            acc = getattr(torch, "accelerator", None)
            if acc is None:
                return None
            current = acc.current_accelerator()
            return None if current is None else str(current.type)

        value = self._memo(("accelerator", ""), compute)
        return value if isinstance(value, str) else None

    def has_module(self, name: str) -> bool:
        def compute() -> bool:
            try:
                return importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                return False

        return bool(self._memo(("module", name), compute))

    def has_torch_backend(self, name: str) -> bool:
        def compute() -> bool:
            import torch

            mod = getattr(torch, name, None)
            is_available = getattr(mod, "is_available", None)
            return bool(callable(is_available) and is_available())

        return bool(self._memo(("backend", name), compute))

    def device_name(self, device_type: str) -> str | None:
        def compute() -> str | None:
            import torch

            mod = getattr(torch, device_type, None)
            get_name = getattr(mod, "get_device_name", None)
            if not callable(get_name) or not self.has_torch_backend(device_type):
                return None
            return str(get_name(0))

        value = self._memo(("name", device_type), compute)
        return value if isinstance(value, str) else None

    def triton_backend(self) -> str | None:
        def compute() -> str | None:
            # Raises when Triton has no active driver; detection records why.
            from triton.runtime import driver

            return str(driver.active.get_current_target().backend)

        value = self._memo(("triton", ""), compute)
        return value if isinstance(value, str) else None

    def run(self, argv: tuple[str, ...], timeout: float) -> str | None:
        import shutil
        import subprocess

        if shutil.which(argv[0]) is None:
            return None
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None
