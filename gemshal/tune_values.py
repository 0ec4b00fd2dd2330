"""What a value in a tuning file may be: launch keywords, tile sizes, scalars.

:mod:`gemshal.tune_format` builds records and parses files with these checks; a vendor
record (:class:`~gemshal.vendor.VendorInfo`) checks its ``launch_options`` against
:data:`LAUNCH_OPTIONS`. Each check returns a message naming the key, the value and
what it must be, or None; docs/tuning.md ("Values") states the rules.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeAlias

import attrs

__all__ = [
    "LAUNCH_KEYS",
    "LAUNCH_OPTIONS",
    "MAX_TILE",
    "META_NAME",
    "LaunchOption",
    "Scalar",
    "launch_keyword_problem",
    "launch_option_problem",
    "meta_problem",
    "scalar_problem",
    "show_value",
    "type_name",
    "unknown_launch_options",
    "value_problem",
]

Scalar: TypeAlias = int | float | bool | str
"""A value a config may give a meta-parameter."""

LAUNCH_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
"""Launch keywords every config may set (positive integers)."""

MAX_TILE = 1 << 20
"""The largest tile size a file may give, the most elements Triton allows in one tensor
(``triton.language.TRITON_MAX_TENSOR_NUMEL``)."""

META_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
"""The pattern of a meta-parameter's name (``BLOCK_N``, ``GROUP_M``, ``EVEN``)."""

# Meta-parameters whose name says what they hold (docs/tuning.md, "Values"): tile sizes
# (BLOCK_N, TILE_N, XBLOCK, VEC_SIZE), used as tl.arange extents, and group counts (GROUP_M).
_SIZE_NAME = re.compile(r"^(BLOCK|TILE)(?![A-Za-z])|BLOCK$|_SIZE$")
_COUNT_NAME = re.compile(r"^GROUP(?![A-Za-z])")
_POWER_OF_TWO_LAUNCH = ("num_warps",)


def show_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string"}
    names.update({list: "array", dict: "table"})
    return names.get(type(value), "date-time" if hasattr(value, "isoformat") else "value")


def _positive_int(key: str, value: object) -> str | None:
    if type(value) is int and value > 0:
        return None
    note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
    return f"key {key!r} must be a positive integer{note}; got {show_value(value)}"


def _is_power_of_two(value: object, most: int | None = None) -> bool:
    if type(value) is not int or value <= 0 or value & (value - 1):
        return False
    return most is None or value <= most


def _got(value: object) -> str:
    note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
    return f"{note}; got {type_name(value)} {show_value(value)}"


def launch_keyword_problem(key: str, value: object) -> str | None:
    if key in _POWER_OF_TWO_LAUNCH:
        if _is_power_of_two(value):
            return None
        return f"key {key!r} must be a positive power of two (1, 2, 4, 8, ...){_got(value)}"
    return _positive_int(key, value)


def meta_problem(key: str, value: object) -> str | None:
    """What is wrong with ``value`` for meta-parameter ``key``, or None.

    A tile size (``BLOCK*``, ``TILE*``, ``*BLOCK``, ``*_SIZE``) must be a power of two
    from 1 to :data:`MAX_TILE`; a group count (``GROUP*``) a positive integer; any
    other meta-parameter a scalar.
    """
    if _SIZE_NAME.search(key):
        if _is_power_of_two(value, MAX_TILE):
            return None
        return (
            f"key {key!r} is a tile size (a meta-parameter named BLOCK*, TILE*, *BLOCK or "
            f"*_SIZE) and must be a power of two from 1 to {MAX_TILE}{_got(value)}"
        )
    if _COUNT_NAME.search(key):
        if type(value) is int and value > 0:
            return None
        return (
            f"key {key!r} is a group count (a meta-parameter named GROUP*) and must be a "
            f"positive integer{_got(value)}"
        )
    return scalar_problem(key, value)


def value_problem(key: str, value: object) -> str | None:
    """What is wrong with ``value`` as the value of config key ``key``, or None if nothing.

    Launch keywords must be positive integers (``num_warps`` a power of two); tile-size
    meta-parameters (``BLOCK*``, ``TILE*``, ``*BLOCK``, ``*_SIZE``) powers of two up to
    :data:`MAX_TILE`; group counts (``GROUP*``) positive integers; other meta-parameters
    and extra launch keywords integers, finite floats, booleans or strings.
    """
    if key in LAUNCH_KEYS:
        return launch_keyword_problem(key, value)
    if META_NAME.match(key):
        return meta_problem(key, value)
    return scalar_problem(key, value)


def scalar_problem(key: str, value: object) -> str | None:
    if isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"key {key!r} must be finite; got {value}"
    return (
        f"key {key!r} must be an integer, float, boolean or string; "
        f"got {type_name(value)} {show_value(value)}"
    )


@attrs.frozen
class LaunchOption:
    """A vendor-specific launch keyword gemshal passes through to Triton.

    A config's extra keyword reaches ``JITFunction.run`` beside ``num_warps`` (through
    ``triton.Config``'s kwargs, or the fixed keywords of a single config), where Triton's
    backend reads it as a compile option (``backend.parse_options``). Only names listed
    in :data:`LAUNCH_OPTIONS` may be declared by a vendor (``VendorInfo.launch_options``).

    Attributes:
        name: The keyword, as the backend's options dataclass spells it.
        kind: ``"int"`` (a non-negative integer), ``"bool"`` or ``"str"``.
        backends: The Triton backends (``target.backend``) whose options take it.
        choices: The values allowed, when the backend allows only a few.
        doc: One line: what it does.
    """

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(("int", "bool", "str")))
    backends: tuple[str, ...]
    choices: tuple[Scalar, ...] = ()
    doc: str = ""

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value`` for this option, or None."""
        if self.kind == "bool":
            ok = isinstance(value, bool)
            want = "a boolean"
        elif self.kind == "int":
            ok = type(value) is int and value >= 0
            want = "a non-negative integer"
        else:
            ok = isinstance(value, str) and bool(value)
            want = "a non-empty string"
        if ok and self.choices and value not in self.choices:
            ok = False
            want = "one of " + ", ".join(show_value(c) for c in self.choices)
        if ok:
            return None
        return f"launch option {self.name!r} must be {want}{_got(value)}"


LAUNCH_OPTIONS: Mapping[str, LaunchOption] = MappingProxyType(
    {
        o.name: o
        for o in (
            LaunchOption(
                "enable_fp_fusion",
                "bool",
                ("cuda", "hip", "xpu"),
                doc="fuse multiplies and adds into FMA instructions",
            ),
            LaunchOption(
                "grf_mode",
                "str",
                ("xpu",),
                doc="register file size per thread on Intel GPUs (e.g. 'large')",
            ),
            LaunchOption(
                "kpack",
                "int",
                ("hip",),
                choices=(1, 2),
                doc="elements packed per K step of AMD matrix instructions",
            ),
            LaunchOption(
                "matrix_instr_nonkdim",
                "int",
                ("hip",),
                choices=(0, 4, 16, 32),
                doc="M/N size of the AMD matrix instruction (0: the compiler chooses)",
            ),
            LaunchOption(
                "multibuffer",
                "bool",
                ("npu",),
                doc="double-buffer loads on Ascend NPUs",
            ),
            LaunchOption(
                "waves_per_eu",
                "int",
                ("hip",),
                doc="occupancy hint: waves per execution unit on AMD GPUs (0: no hint)",
            ),
        )
    }
)
"""Every vendor-specific launch keyword gemshal can pass to Triton, by name (sorted).

These are what "the kernels know": a ``VendorInfo`` may declare any of them in
``launch_options`` (and none other), and a tuning file may then set them on that
vendor. ``num_warps``, ``num_stages``, ``num_ctas`` and ``maxnreg``
(:data:`LAUNCH_KEYS`) are accepted on every vendor and are not declared."""


def unknown_launch_options(names: Iterable[object]) -> str | None:
    """Why ``names`` cannot be a vendor's launch options, or None when every one is known.

    The message names the first offending key and lists the valid ones.
    """
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            return f"launch option names are strings; got {name!r}"
        if name in LAUNCH_KEYS:
            return (
                f"{name!r} is a standard launch keyword, accepted on every vendor; declare "
                f"only extra ones (known: {', '.join(LAUNCH_OPTIONS)})"
            )
        if name not in LAUNCH_OPTIONS:
            close = difflib.get_close_matches(name, list(LAUNCH_OPTIONS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return (
                f"unknown launch option {name!r}{hint}: gemshal's kernels can pass only "
                f"these to Triton: {', '.join(LAUNCH_OPTIONS)} (and, on every vendor, "
                f"{', '.join(LAUNCH_KEYS)})"
            )
        if name in seen:
            return f"launch option {name!r} is listed twice"
        seen.add(name)
    return None


def launch_option_problem(key: str, value: object) -> str | None:
    """What is wrong with ``value`` for the extra launch keyword ``key``, or None."""
    option = LAUNCH_OPTIONS.get(key)
    if option is None:
        return scalar_problem(key, value)
    return option.problem(value)
