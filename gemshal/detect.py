"""Vendor detection: ordered probes, first decisive answer wins, every step traced.

Order: explicit choice > ``GEMS_VENDOR`` > in-process probes > the active Triton
driver's target > command probes (only with ``GEMS_PROBE_COMMANDS=1``) > the ``cpu``
vendor on the Triton interpreter. :func:`detect` is pure apart from what its
:class:`~gemshal.probe.Facts` observe, so every path is testable without hardware.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence

import attrs

from gemshal.errors import AmbiguousDeviceError, ConfigError, PluginLoadError, UnknownVendorError
from gemshal.probe import Claim, Facts
from gemshal.registry import plugin_failures, vendor, vendors
from gemshal.vendor import VendorInfo

__all__ = ["COMMAND_TIMEOUT_S", "PROBE_WARN_S", "Detection", "TraceStep", "detect", "env_flag"]

COMMAND_TIMEOUT_S = 5.0
"""Seconds each command probe may run before it counts as a decline."""

PROBE_WARN_S = 3.0
"""Seconds an in-process probe may run before a line on stderr names it. In-process
probes cannot be stopped from outside (a thread cannot be killed): one that never returns
stops detection, and the line says which it is and how to skip detection."""


def _watch(info: VendorInfo) -> threading.Timer:
    """A started timer that names ``info``'s probe on stderr if it runs past PROBE_WARN_S."""
    probe = info.probe
    where = f"{getattr(probe, '__module__', '?')}.{getattr(probe, '__qualname__', repr(probe))}"

    def warn() -> None:
        sys.stderr.write(
            f"gemshal: vendor {info.name!r}'s probe ({where}) is still running after "
            f"{PROBE_WARN_S:.0f} s; detection waits for it. If it never returns, set "
            f"GEMS_VENDOR to the vendor to use (detection then runs no probe)\n"
        )
        sys.stderr.flush()

    timer = threading.Timer(PROBE_WARN_S, warn)
    timer.daemon = True
    timer.start()
    return timer


@attrs.frozen
class TraceStep:
    """One line of the detection trace: what a stage saw and what it concluded.

    ``verdict`` is one of ``chosen``, ``claimed``, ``declined``, ``skipped``,
    ``error``, ``slow`` (an in-process probe that took over ``PROBE_WARN_S``) or
    ``fallback``.
    """

    stage: str
    verdict: str
    detail: str
    vendor: str | None = None

    def __str__(self) -> str:
        who = f" {self.vendor}" if self.vendor else ""
        return f"[{self.stage}]{who}: {self.verdict} - {self.detail}"


@attrs.frozen
class Detection:
    """The outcome of detection: the vendor, how it was reached, and the trace."""

    vendor: VendorInfo
    stage: str
    trace: tuple[TraceStep, ...]

    @property
    def fell_back(self) -> bool:
        """True when nothing claimed the machine and the CPU interpreter was chosen."""
        return self.stage == "fallback"


def env_flag(
    env: Mapping[str, str], name: str, *, default: bool = False, meaning: str = ""
) -> bool:
    """Read a 0/1 environment flag; any other value is an error, never ignored.

    Args:
        env: The environment to read.
        name: The variable.
        default: The value when the variable is unset or empty.
        meaning: What 0 and 1 mean, for the error message (``" (0: ..., 1: ...)"``).

    Raises:
        ConfigError: the variable is set to something other than ``0``, ``1`` or empty.
    """
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw in ("0", "1"):
        return raw == "1"
    raise ConfigError(f"{name} must be 0 or 1 (or unset){meaning}; got {raw!r}")


def _ambiguous(stage: str, claims: Sequence[tuple[VendorInfo, Claim]]) -> AmbiguousDeviceError:
    detail = "; ".join(f"{v.name}: {c.reason}" for v, c in claims)
    names = " and ".join(v.name for v, _ in claims)
    return AmbiguousDeviceError(
        f"{names} both claim this machine ({stage} stage: {detail}). "
        "Choose one with GEMS_VENDOR=<name> or gemshal.select(<name>)."
    )


def _looked_for(info: VendorInfo) -> str:
    """What a declining probe checks, from its docstring: the trace says why it declined."""
    probe = getattr(info.probe, "func", info.probe)
    doc = (getattr(probe, "__doc__", None) or "").strip().splitlines()
    what = doc[0].rstrip(".") if doc else "looks for this vendor"
    what = what[0].lower() + what[1:]
    detail = ", ".join(f"{k}={v!r}" for k, v in getattr(info.probe, "keywords", {}).items())
    return f"{what}: none" + (f" ({detail})" if detail else "")


class _Run:
    def __init__(self, facts: Facts, env: Mapping[str, str], pool: Sequence[VendorInfo]) -> None:
        self.facts = facts
        self.env = env
        self.pool = pool
        self.trace: list[TraceStep] = []

    def note(self, stage: str, verdict: str, detail: str, who: str | None = None) -> None:
        self.trace.append(TraceStep(stage, verdict, detail, who))

    def done(self, info: VendorInfo, stage: str, detail: str) -> Detection:
        self.note(stage, "chosen", detail, info.name)
        return Detection(info, stage, tuple(self.trace))

    def decide(self, stage: str, claims: list[tuple[VendorInfo, Claim]]) -> Detection | None:
        if len(claims) > 1:
            raise _ambiguous(stage, claims)
        if claims:
            info, claim = claims[0]
            return self.done(info, stage, claim.reason)
        return None

    def in_process(self) -> Detection | None:
        claims: list[tuple[VendorInfo, Claim]] = []
        for info in self.pool:
            if info.probe is None:
                continue
            timer = _watch(info)
            start = time.perf_counter()
            try:
                claim = info.probe(self.facts)
            except Exception as exc:
                self.note("probe", "error", f"probe raised {type(exc).__name__}: {exc}", info.name)
                continue
            finally:
                timer.cancel()
            took = time.perf_counter() - start
            if took > PROBE_WARN_S:
                self.note("probe", "slow", f"the probe took {took:.1f} s", info.name)
            if claim is None:
                self.note("probe", "declined", _looked_for(info), info.name)
            else:
                self.note("probe", "claimed", claim.reason, info.name)
                claims.append((info, claim))
        return self.decide("probe", claims)

    def triton(self) -> Detection | None:
        try:
            backend = self.facts.triton_backend()
        except Exception as exc:
            self.note("triton", "declined", f"no active Triton driver ({exc})")
            return None
        if backend is None:
            self.note("triton", "declined", "no active Triton driver")
            return None
        claims = [
            (v, Claim(f"the active Triton driver targets backend {backend!r}"))
            for v in self.pool
            if backend in v.triton_backends and not v.is_cpu
        ]
        if not claims:
            self.note("triton", "declined", f"backend {backend!r} belongs to no registered vendor")
        return self.decide("triton", claims)

    def commands(self) -> Detection | None:
        if not env_flag(self.env, "GEMS_PROBE_COMMANDS"):
            self.note("command", "skipped", "set GEMS_PROBE_COMMANDS=1 to run vendor tools")
            return None
        claims: list[tuple[VendorInfo, Claim]] = []
        for info in self.pool:
            if not info.command_probe:
                continue
            out = self.facts.run(info.command_probe, COMMAND_TIMEOUT_S)
            shown = " ".join(info.command_probe)
            if out and out.strip():
                first = out.strip().splitlines()[0][:80]
                claims.append((info, Claim(f"`{shown}` printed {first!r}")))
                self.note("command", "claimed", f"`{shown}` printed {first!r}", info.name)
            else:
                self.note("command", "declined", f"`{shown}` absent, failed or silent", info.name)
        return self.decide("command", claims)


def detect(
    *,
    facts: Facts,
    env: Mapping[str, str],
    explicit: str | None = None,
    candidates: Sequence[VendorInfo] | None = None,
) -> Detection:
    """Decide which vendor this process runs on.

    Args:
        facts: What probes may observe (``LiveFacts()`` for this process).
        env: Environment variables (``os.environ``), read for ``GEMS_VENDOR`` and
            ``GEMS_PROBE_COMMANDS``.
        explicit: A vendor chosen with :func:`gemshal.select`; wins over everything.
        candidates: Vendors to probe; defaults to the whole registry.

    Returns:
        The vendor, the deciding stage and the full trace.

    Raises:
        UnknownVendorError: ``explicit`` or ``GEMS_VENDOR`` names no registered vendor.
        PluginLoadError: ``explicit`` or ``GEMS_VENDOR`` names a plugin that failed to load.
        AmbiguousDeviceError: two vendors claimed the machine at the same stage.
        ConfigError: ``GEMS_PROBE_COMMANDS`` is neither 0 nor 1 (checked on every call,
            even when an explicit choice or ``GEMS_VENDOR`` means no command runs).
    """
    env_flag(env, "GEMS_PROBE_COMMANDS")  # a bad value is an error even when unused
    pool = tuple(vendors() if candidates is None else candidates)
    run = _Run(facts, env, pool)
    for failure in plugin_failures():
        run.note("registry", "error", failure.describe(), failure.name)
    if explicit is not None:
        return run.done(vendor(explicit), "explicit", "chosen with gemshal.select()")
    requested = env.get("GEMS_VENDOR", "").strip()
    if requested:
        try:
            info = vendor(requested)
        except UnknownVendorError as exc:
            raise UnknownVendorError(f"GEMS_VENDOR: {exc}") from None
        except PluginLoadError as exc:
            raise PluginLoadError(f"GEMS_VENDOR={requested}: {exc}") from exc.__cause__
        return run.done(info, "env", f"GEMS_VENDOR={requested}")
    run.note("env", "skipped", "GEMS_VENDOR is not set")
    for stage in (run.in_process, run.triton, run.commands):
        found = stage()
        if found is not None:
            return found
    cpu = vendor("cpu")
    run.note(
        "fallback", "chosen", "no accelerator found; kernels run on the Triton interpreter", "cpu"
    )
    return Detection(cpu, "fallback", tuple(run.trace))
