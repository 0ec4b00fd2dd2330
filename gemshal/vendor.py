"""The vendor record, its capability flags, and the architecture value.

A :class:`VendorInfo` describes one accelerator vendor as torch and Triton see
it. Records are frozen and compare by identity: the registry holds exactly one
per vendor, so ``vendor("nvidia") is vendor("nvidia")``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

    from gemshal.probe import Claim, Facts

__all__ = ["FEATURES", "Arch", "ArchFeatures", "Capabilities", "Probe", "VendorInfo"]

Probe = Callable[["Facts"], "Claim | None"]
"""A vendor's in-process probe, which looks at the facts and returns a claim or None."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_DIST_BACKENDS = ("nccl", "rccl", "xccl", "hccl", "cncl", "mccl", "bkcl", "gloo")


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    # A lone string is left as it is, for the validator to refuse by name: tuple("abc")
    # would be ("a", "b", "c"), and a command or directory list of letters.
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return value  # type: ignore[return-value]
    return tuple(value)


def _check_strs(_inst: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    if isinstance(value, str):
        raise TypeError(
            f"{attribute.name} must be a tuple of strings; got the string {value!r} "
            f"(write ({value!r},) for one)"
        )
    if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"{attribute.name} must be a tuple of non-empty strings; got {value!r}")


def _check_str(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a string; got {type(value).__name__} {value!r}")


def _check_label(_inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    _check_str(_inst, attribute, value)
    if not value:
        raise ValueError(f"{attribute.name} must be a non-empty string; got ''")


def _check_capabilities(
    _inst: object, attribute: attrs.Attribute[Capabilities], value: object
) -> None:
    if not isinstance(value, Capabilities):
        raise TypeError(
            f"{attribute.name} must be a gemshal.Capabilities record, e.g. "
            f"Capabilities(fp64=False); got {type(value).__name__} {value!r}"
        )


def _check_optional_str(
    _inst: object, attribute: attrs.Attribute[str | None], value: object
) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(
            f"{attribute.name} must be a non-empty string or None; got "
            f"{type(value).__name__} {value!r}"
        )


def _check_bool(_inst: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if type(value) is not bool:
        raise TypeError(
            f"{attribute.name} must be True or False; got {type(value).__name__} {value!r}"
        )


def _check_int(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int:
        raise TypeError(
            f"{attribute.name} must be an integer; got {type(value).__name__} {value!r}"
        )


def _check_capability(
    _inst: object, attribute: attrs.Attribute[tuple[int, int] | None], value: object
) -> None:
    if value is None:
        return
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(type(v) is int and v >= 0 for v in value)
    ):
        raise TypeError(
            f"{attribute.name} must be a (major, minor) tuple of two non-negative integers "
            f"such as (9, 0), or None; got {value!r}"
        )


def _check_name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    _check_str(_inst, attribute, value)
    if not _NAME.match(value):
        raise ValueError(
            f"{attribute.name} must be lower-case letters, digits or '_', "
            f"starting with a letter; got {value!r}"
        )


def _check_launch_options(
    inst: object, _attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    from gemshal.errors import ConfigError
    from gemshal.tune_values import unknown_launch_options

    problem = unknown_launch_options(value)
    if problem:
        name = getattr(inst, "name", "?")
        raise ConfigError(f"vendor {name!r}: launch_options: {problem}")


def _check_nonempty_strs(
    _inst: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    _check_strs(_inst, attribute, value)
    if not value:
        raise ValueError(f"{attribute.name} must be a non-empty tuple of names; got {value!r}")


@attrs.frozen
class Capabilities:
    """Which data types the vendor's Triton backend handles natively."""

    fp64: bool = attrs.field(default=True, validator=_check_bool)
    bf16: bool = attrs.field(default=True, validator=_check_bool)
    int64: bool = attrs.field(default=True, validator=_check_bool)
    fp8: bool = attrs.field(default=False, validator=_check_bool)

    def supports(self, dtype: torch.dtype) -> bool:
        """Whether kernels may compute in ``dtype`` on this backend.

        float64, bfloat16, int64 and the float8 types need their flag; every other
        dtype torch has (float16, float32, the narrower integers, bool) is taken as
        native to every Triton backend.
        """
        return self.refusal(dtype) is None

    def refusal(self, dtype: torch.dtype) -> str | None:
        """Why ``dtype`` is not native here (``"float64 on a device without fp64"``), or None."""
        name = str(dtype).removeprefix("torch.")  # no torch import: gemshal.vendor stays light
        if name == "float64" and not self.fp64:
            return "float64 on a device without fp64"
        if name == "bfloat16" and not self.bf16:
            return "bfloat16 on a device without bf16"
        if name in ("int64", "uint64") and not self.int64:
            return f"{name} on a device without int64"
        if name.startswith("float8") and not self.fp8:
            return f"{name} on a device without fp8"
        return None


FEATURES: dict[str, str] = {
    "tensor_descriptors": (
        "tl.make_tensor_descriptor tiles moved by a hardware copy engine (NVIDIA's TMA), "
        "for the persistent matmul"
    ),
}
"""Hardware features a kernel may ask a device for (:meth:`gemshal.Device.has`), by name,
with what each one enables."""


def unknown_features(names: Iterable[str]) -> str | None:
    """Why ``names`` are not all features gemshal knows (naming them and the valid ones), or
    None."""
    import difflib

    bad = [n for n in names if n not in FEATURES]
    if not bad:
        return None
    hints = []
    for name in bad:
        close = difflib.get_close_matches(str(name), list(FEATURES), n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown feature {', '.join(hints)}; the features are {', '.join(sorted(FEATURES))}"


def _check_features(
    _inst: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    problem = unknown_features(value)
    if problem:
        raise ValueError(f"{attribute.name}: {problem}")


@attrs.frozen
class ArchFeatures:
    """Hardware features that a range of one vendor's architectures has.

    A rule applies to an architecture whose compute capability is at least
    ``min_capability`` (NVIDIA-style devices), or whose tag is one of ``archs``
    (``"gfx950"``); a rule with neither applies to every architecture of the vendor.

    Attributes:
        features: Names from :data:`FEATURES`.
        min_capability: The first compute capability that has them, e.g. ``(9, 0)``.
        archs: Architecture tags that have them.
    """

    features: tuple[str, ...] = attrs.field(
        converter=_str_tuple, validator=[_check_strs, _check_features]
    )
    min_capability: tuple[int, int] | None = attrs.field(default=None, validator=_check_capability)
    archs: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple, validator=_check_strs)

    def applies(self, arch: Arch) -> bool:
        """Whether ``arch`` is in this rule's range."""
        if self.min_capability is None and not self.archs:
            return True
        if arch.tag in self.archs:
            return True
        cap = arch.capability
        return self.min_capability is not None and cap is not None and cap >= self.min_capability


def _rules_tuple(value: Iterable[ArchFeatures]) -> tuple[ArchFeatures, ...]:
    if isinstance(value, ArchFeatures):
        raise TypeError(
            f"arch_features takes a tuple of ArchFeatures rules; got one rule "
            f"{value!r} (write (rule,))"
        )
    if not isinstance(value, Iterable) or isinstance(value, str | bytes):  # type: ignore[unreachable]
        raise TypeError(f"arch_features takes a tuple of ArchFeatures rules; got {value!r}")
    rules = tuple(value)
    for rule in rules:
        if not isinstance(rule, ArchFeatures):
            raise TypeError(f"arch_features takes ArchFeatures rules; got {rule!r}")
    return rules


NATIVE_LAUNCHES = ("cuda-driver",)
"""The native launch paths a vendor may name (``VendorInfo.native_launch``)."""


@attrs.frozen(eq=False)
class VendorInfo:
    """One accelerator vendor: how torch, Triton and torch.distributed name it.

    Attributes:
        name: Registry key, e.g. ``"nvidia"``.
        display_name: Human-readable name, e.g. ``"NVIDIA"``.
        device_type: The torch device type, e.g. ``"cuda"``, ``"npu"``, ``"cpu"``.
        dispatch_key: The dispatch key aten kernels register under, e.g. ``"CUDA"``.
        triton_backends: Names of the Triton backends (``target.backend``) that
            mean this vendor, e.g. ``("cuda",)``.
        torch_module: Extension module that adds the device to torch
            (``"torch_npu"``), or None when torch has it built in.
        device_module_name: Attribute of ``torch`` holding the device runtime
            (``"cuda"`` for ``torch.cuda``, ``"npu"`` for ``torch.npu``).
        visible_devices_env: Environment variable that limits visible devices.
        dist_backend: The torch.distributed backend name for this vendor.
        capabilities: Data types the backend handles natively.
        command_probe: A command that lists this vendor's devices, run only when
            ``GEMS_PROBE_COMMANDS=1``.
        probe: The in-process probe, or None for vendors only chosen explicitly.
        tune_dirs: Extra directories of tuning files this vendor ships (plugins).
        warp_size: Threads per warp/wavefront when the runtime does not say.
        launch_options: Launch keywords its Triton accepts beyond ``num_warps``,
            ``num_stages``, ``num_ctas`` and ``maxnreg`` (AMD: ``waves_per_eu``,
            ``matrix_instr_nonkdim``, ``kpack``), each one of
            :data:`gemshal.tune_values.LAUNCH_OPTIONS`; tuning files may set them on
            this vendor only, and they reach Triton as compile options.
        arch_features: Which of its architectures have which hardware features
            (:class:`ArchFeatures` rules); a device's ``features`` are the union of the
            rules that apply to its architecture.
        native_launch: How a native (C++) caller launches this vendor's compiled
            Triton kernels: ``"cuda-driver"`` (``cuLaunchKernel`` on torch's current
            CUDA stream) or None (only through Triton's Python launcher). gemsops'
            native replay serves vendors that name one.

    Raises:
        ConfigError: ``launch_options`` names a keyword gemshal cannot pass to Triton
            (the message names it and lists the valid ones).
    """

    name: str = attrs.field(validator=_check_name)
    display_name: str = attrs.field(validator=_check_label)
    device_type: str = attrs.field(validator=_check_name)
    dispatch_key: str = attrs.field(validator=_check_label)
    triton_backends: tuple[str, ...] = attrs.field(
        converter=_str_tuple, validator=_check_nonempty_strs
    )
    torch_module: str | None = attrs.field(default=None, validator=_check_optional_str)
    device_module_name: str = attrs.field(default="", validator=_check_str)
    visible_devices_env: str | None = attrs.field(default=None, validator=_check_optional_str)
    dist_backend: str = attrs.field(default="gloo", validator=attrs.validators.in_(_DIST_BACKENDS))
    capabilities: Capabilities = attrs.field(factory=Capabilities, validator=_check_capabilities)
    command_probe: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=_check_strs
    )
    probe: Probe | None = attrs.field(
        default=None,
        repr=False,
        validator=attrs.validators.optional(attrs.validators.is_callable()),
    )
    tune_dirs: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=_check_strs
    )
    warp_size: int = attrs.field(default=32, validator=[_check_int, attrs.validators.gt(0)])
    launch_options: tuple[str, ...] = attrs.field(
        default=(), converter=_str_tuple, validator=[_check_strs, _check_launch_options]
    )
    arch_features: tuple[ArchFeatures, ...] = attrs.field(default=(), converter=_rules_tuple)
    native_launch: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(NATIVE_LAUNCHES))
    )

    def features_of(self, arch: Arch) -> frozenset[str]:
        """The hardware features this vendor declares for ``arch``."""
        out: set[str] = set()
        for rule in self.arch_features:
            if rule.applies(arch):
                out.update(rule.features)
        return frozenset(out)

    @property
    def is_cpu(self) -> bool:
        """True for the vendor that runs kernels on the CPU through the Triton interpreter."""
        return self.device_type == "cpu"

    def as_dict(self) -> dict[str, object]:
        """The record as plain JSON-ready values (the probe is given by name)."""
        out: dict[str, object] = {}
        for field in attrs.fields(VendorInfo):
            value = getattr(self, field.name)
            if field.name == "probe":
                value = None if value is None else getattr(value, "__qualname__", repr(value))
            elif isinstance(value, Capabilities):
                value = attrs.asdict(value)
            elif field.name == "arch_features":
                value = [attrs.asdict(rule) for rule in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out


@attrs.frozen
class Arch:
    """A device architecture.

    NVIDIA-style devices carry a compute ``capability`` such as ``(9, 0)``;
    others carry a ``name`` such as ``"gfx942"`` or ``"ascend910b"``.
    ``tag`` is the short form used in tuning-file names (``"sm90"``, ``"gfx942"``).
    """

    name: str = attrs.field(validator=_check_str)
    capability: tuple[int, int] | None = attrs.field(default=None, validator=_check_capability)

    @classmethod
    def from_capability(cls, major: int, minor: int) -> Arch:
        """The architecture of an NVIDIA-style device with compute capability ``major.minor``."""
        return cls(name=f"sm{major}{minor}", capability=(major, minor))

    @property
    def tag(self) -> str:
        """The file-name form (``sm90`` for capability (9, 0), else the lower-cased name)."""
        name = self.name.split(":", 1)[0].strip().lower()
        return re.sub(r"[^a-z0-9_]+", "-", name).strip("-") or "unknown"

    def __str__(self) -> str:
        if self.capability is not None:
            return f"{self.tag} (capability {self.capability[0]}.{self.capability[1]})"
        return self.name
