"""The tuning-file format: typed records and the parser of one TOML document.

:mod:`gemshal.tune` finds and caches the files; this module only turns one
parsed TOML document into records, or raises :class:`~gemshal.errors.ConfigError`
naming the file, the op and the key at fault. docs/tuning.md describes the format.
"""

from __future__ import annotations

import difflib
import itertools
import math
import operator
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import attrs

from gemshal.errors import ConfigError
from gemshal.tune_rules import Call, HeuristicRule, parse_rules

if TYPE_CHECKING:
    import triton

__all__ = [
    "FORMAT_VERSION",
    "LAUNCH_KEYS",
    "LAUNCH_OPTIONS",
    "LEVELS",
    "MAX_GRID",
    "MAX_TILE",
    "HeuristicRule",
    "LaunchOption",
    "OpTuning",
    "Scalar",
    "TableRow",
    "TuneConfig",
    "TuneFile",
    "TuneSource",
    "launch_option_problem",
    "loads",
    "parse",
    "unknown_launch_options",
    "value_problem",
]

Scalar: TypeAlias = int | float | bool | str
"""A value a config may give a meta-parameter."""

FORMAT_VERSION = 1
"""The only value the optional top-level ``version`` key may take."""

LAUNCH_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
"""Launch keywords every config may set (positive integers)."""


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
            want = "one of " + ", ".join(_show(c) for c in self.choices)
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
        return _scalar_problem(key, value)
    return option.problem(value)


LEVELS = ("user", "vendor-arch", "vendor", "default")
"""Source levels, highest precedence first."""

MAX_GRID = 4096
"""The most configs one grid may expand to; more is almost surely a typo."""

MAX_TILE = 1 << 20
"""The largest tile size a file may give, the most elements Triton allows in one tensor
(``triton.language.TRITON_MAX_TENSOR_NUMEL``)."""

_TOP_KEYS = ("version", "unused", "ops")
_OP_KEYS = ("configs", "grid", "interpreter", "heuristics", "table")
_META = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
_LOWER = re.compile(r"^[a-z][a-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Meta-parameters whose name says what they hold (docs/tuning.md, "Values"): tile sizes
# (BLOCK_N, TILE_N, XBLOCK, VEC_SIZE), used as tl.arange extents, and group counts (GROUP_M).
_SIZE_NAME = re.compile(r"^(BLOCK|TILE)(?![A-Za-z])|BLOCK$|_SIZE$")
_COUNT_NAME = re.compile(r"^GROUP(?![A-Za-z])")
_POWER_OF_TWO_LAUNCH = ("num_warps",)


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string"}
    names.update({list: "array", dict: "table"})
    return names.get(type(value), "date-time" if hasattr(value, "isoformat") else "value")


def _identity(value: object) -> object:
    # 1, 1.0 and true compare equal in Python but are different configs.
    return (type(value).__name__, value)


def _positive_int(key: str, value: object) -> str | None:
    if type(value) is int and value > 0:
        return None
    note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
    return f"key {key!r} must be a positive integer{note}; got {_show(value)}"


def _is_power_of_two(value: object, most: int | None = None) -> bool:
    if type(value) is not int or value <= 0 or value & (value - 1):
        return False
    return most is None or value <= most


def _got(value: object) -> str:
    note = " (a boolean is not an integer)" if isinstance(value, bool) else ""
    return f"{note}; got {_type_name(value)} {_show(value)}"


def _launch_problem(key: str, value: object) -> str | None:
    if key in _POWER_OF_TWO_LAUNCH:
        if _is_power_of_two(value):
            return None
        return f"key {key!r} must be a positive power of two (1, 2, 4, 8, ...){_got(value)}"
    return _positive_int(key, value)


def _meta_problem(key: str, value: object) -> str | None:
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
    return _scalar_problem(key, value)


def value_problem(key: str, value: object) -> str | None:
    """What is wrong with ``value`` as the value of config key ``key``, or None if nothing.

    Launch keywords must be positive integers (``num_warps`` a power of two); tile-size
    meta-parameters (``BLOCK*``, ``TILE*``, ``*BLOCK``, ``*_SIZE``) powers of two up to
    :data:`MAX_TILE`; group counts (``GROUP*``) positive integers; other meta-parameters
    and extra launch keywords integers, finite floats, booleans or strings.
    """
    if key in LAUNCH_KEYS:
        return _launch_problem(key, value)
    if _META.match(key):
        return _meta_problem(key, value)
    return _scalar_problem(key, value)


def _scalar_problem(key: str, value: object) -> str | None:
    if isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"key {key!r} must be finite; got {value}"
    return (
        f"key {key!r} must be an integer, float, boolean or string; "
        f"got {_type_name(value)} {_show(value)}"
    )


def _pairs(
    value: Mapping[str, Scalar] | Iterable[tuple[str, Scalar]],
) -> tuple[tuple[str, Scalar], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted(((str(k), v) for k, v in items), key=operator.itemgetter(0)))


def _check_pairs(pattern: re.Pattern[str], what: str) -> Any:
    def check(_inst: object, _a: object, value: tuple[tuple[str, Scalar], ...]) -> None:
        for key, item in value:
            problem = _meta_problem(key, item) if pattern is _META else _scalar_problem(key, item)
            if not pattern.match(key) or key in LAUNCH_KEYS:
                problem = f"{what} {key!r} does not match {pattern.pattern}"
            if problem:
                raise ConfigError(problem)

    return check


def _check_opt_positive(
    _inst: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None:
        problem = _launch_problem(attribute.name, value)
        if problem:
            raise ConfigError(problem)


def _opt_positive() -> Any:
    return attrs.field(default=None, validator=_check_opt_positive)


@attrs.frozen
class TuneConfig:
    """One kernel configuration, as a file lists it.

    Attributes:
        meta: Meta-parameters (``BLOCK_N`` ...) as ``(name, value)`` pairs sorted by name.
        num_warps: Warps per program, or None for Triton's default.
        num_stages: Software-pipelining stages, or None for Triton's default.
        num_ctas: CTAs per cluster, or None for Triton's default.
        maxnreg: Register cap per thread, or None for none.
        launch: Vendor-specific launch keywords as sorted ``(name, value)`` pairs.
    """

    meta: tuple[tuple[str, Scalar], ...] = attrs.field(
        default=(), converter=_pairs, validator=_check_pairs(_META, "meta-parameter")
    )
    num_warps: int | None = _opt_positive()
    num_stages: int | None = _opt_positive()
    num_ctas: int | None = _opt_positive()
    maxnreg: int | None = _opt_positive()
    launch: tuple[tuple[str, Scalar], ...] = attrs.field(
        default=(), converter=_pairs, validator=_check_pairs(_LOWER, "extra launch keyword")
    )

    def launch_keywords(self) -> dict[str, int]:
        """The standard launch keywords this config sets (unset ones are left out)."""
        values = (self.num_warps, self.num_stages, self.num_ctas, self.maxnreg)
        return {k: v for k, v in zip(LAUNCH_KEYS, values, strict=True) if v is not None}

    def as_dict(self) -> dict[str, Scalar]:
        """The config as its TOML table: meta-parameters, launch keywords, extra keywords."""
        return {**dict(self.meta), **self.launch_keywords(), **dict(self.launch)}

    def to_triton(self) -> triton.Config:
        """A ``triton.Config``; launch keywords left unset take ``triton.Config``'s defaults."""
        import triton

        kwargs = {**dict(self.meta), **dict(self.launch)}
        return triton.Config(kwargs, **self.launch_keywords())

    def identity(self) -> tuple[object, ...]:
        """A key telling configs apart by value *and* type (``1``, ``1.0`` and ``true`` differ)."""
        return tuple(
            (k, _identity(v))
            for k, v in (*self.meta, *self.launch_keywords().items(), *self.launch)
        )


@attrs.frozen
class TuneSource:
    """One candidate tuning file.

    Attributes:
        path: The file's path (it may not exist).
        level: One of :data:`LEVELS`.
        origin: Who put it on the search path (``"gemsops"``, ``"vendor nvidia"``, ...).
    """

    path: Path = attrs.field(converter=Path)
    level: str = attrs.field(validator=attrs.validators.in_(LEVELS))
    origin: str = attrs.field(validator=attrs.validators.min_len(1))

    def __str__(self) -> str:
        return str(self.path)

    def as_dict(self) -> dict[str, str]:
        """The source as JSON-ready values."""
        return {"path": str(self.path), "level": self.level, "origin": self.origin}


_TABLE_VALUE = (bool, int, str)


@attrs.frozen
class TableRow:
    """One row of an op's ``table``: the config to launch at one size bucket.

    Attributes:
        when: The kernel's key values at this bucket, as sorted ``(name, value)``
            pairs: integers are bucket sizes (the key value rounded up to a half
            octave, a power of two or three quarters of one: :func:`gemshal.kernel.plan.bucket`),
            other values (flags) as the kernel is called with them.
        dtype: The first tensor argument's dtype (``"bfloat16"``), or None for any.
        config: The config launched there.
    """

    when: tuple[tuple[str, Scalar], ...] = attrs.field(converter=_pairs)
    dtype: str | None
    config: TuneConfig

    def as_dict(self) -> dict[str, object]:
        """The row as its TOML inline table."""
        out: dict[str, object] = dict(self.when)
        if self.dtype is not None:
            out["dtype"] = self.dtype
        out["config"] = self.config.as_dict()
        return out


@attrs.frozen
class OpTuning:
    """Everything the winning file says about one op.

    Attributes:
        op: The op's name.
        source: The file the entry came from.
        configs: The configs to choose from; empty for a heuristics-only entry.
        interpreter: The config pinned under the Triton interpreter, if given.
        heuristics: Rules computing meta-parameters at launch, in file order.
        table: The config chosen at each size bucket a tuning run measured
            (``gemsops tune`` writes them); launched without benchmarking.
    """

    op: str = attrs.field(validator=attrs.validators.min_len(1))
    source: TuneSource
    configs: tuple[TuneConfig, ...] = ()
    interpreter: TuneConfig | None = None
    heuristics: tuple[HeuristicRule, ...] = ()
    table: tuple[TableRow, ...] = ()

    @property
    def location(self) -> str:
        """``"<file>: [ops.<op>]"``, as error messages name the entry."""
        return _location(self.source, self.op)

    @property
    def pinned(self) -> TuneConfig | None:
        """The config used under the interpreter (``interpreter``, else the first config)."""
        return self.interpreter or (self.configs[0] if self.configs else None)

    def as_dict(self) -> dict[str, object]:
        """The entry as its TOML table (a grid appears expanded into ``configs``)."""
        out: dict[str, object] = {}
        if self.configs:
            out["configs"] = [c.as_dict() for c in self.configs]
        if self.interpreter is not None:
            out["interpreter"] = self.interpreter.as_dict()
        if self.heuristics:
            out["heuristics"] = {r.name: r.as_data() for r in self.heuristics}
        if self.table:
            out["table"] = [row.as_dict() for row in self.table]
        return out


@attrs.frozen(eq=False)
class TuneFile:
    """One parsed tuning file.

    Attributes:
        source: Where it was read from.
        unused: Ops the file asks to leave to torch.
        ops: The op entries by name, in file order (read-only).
    """

    source: TuneSource
    unused: frozenset[str] = frozenset()
    ops: Mapping[str, OpTuning] = attrs.field(factory=lambda: MappingProxyType({}))


def _fail(where: str, problem: str) -> NoReturn:
    raise ConfigError(f"{where}: {problem}")


@attrs.frozen
class _Keys:
    """The extra launch keywords a file may use here, and whose they are."""

    extra: tuple[str, ...] = ()
    vendor: str | None = None

    def __contains__(self, key: object) -> bool:
        return key in self.extra

    def accepted(self) -> str:
        """The launch keywords accepted here, as a sentence fragment."""
        return ", ".join((*LAUNCH_KEYS, *self.extra))

    def refusal(self, key: str) -> str:
        """Why ``key``, a known vendor launch option, is refused here."""
        option = LAUNCH_OPTIONS[key]
        on = f"vendor {self.vendor!r}" if self.vendor else "this vendor"
        declared = ", ".join(self.extra) or "none"
        return (
            f"launch option {key!r} is not accepted on {on}: its VendorInfo.launch_options "
            f"declares {declared}, so the launch keywords here are {self.accepted()} "
            f"({key!r} is an option of Triton's {'/'.join(option.backends)} backend)"
        )


def _key_kind(where: str, key: str, extra: _Keys) -> str:
    if key in LAUNCH_KEYS:
        return "launch"
    if key in extra:
        return "extra"
    if _META.match(key):
        return "meta"
    if key in LAUNCH_OPTIONS:
        _fail(where, extra.refusal(key))
    _fail(
        where,
        f"unknown key {key!r}: meta-parameters start with an upper-case letter "
        f"(BLOCK_N), launch keywords are {extra.accepted()}",
    )


def _check_item(where: str, key: str, value: object, extra: _Keys) -> str:
    kind = _key_kind(where, key, extra)
    problem = launch_option_problem(key, value) if kind == "extra" else value_problem(key, value)
    if problem:
        _fail(where, problem)
    return kind


def _config(where: str, table: object, extra: _Keys) -> TuneConfig:
    if not isinstance(table, dict):
        _fail(where, f"a config must be a table; got {_type_name(table)} {_show(table)}")
    if not table:
        _fail(where, "a config must set at least one key; got an empty table")
    meta: dict[str, Scalar] = {}
    launch: dict[str, Any] = {}
    more: dict[str, Scalar] = {}
    for key, value in table.items():
        kind = _check_item(where, key, value, extra)
        (meta if kind == "meta" else launch if kind == "launch" else more)[key] = value
    return TuneConfig(meta=meta, launch=more, **launch)


def _configs(where: str, value: object, extra: _Keys) -> tuple[TuneConfig, ...]:
    if not isinstance(value, list) or not value:
        _fail(f"{where} key 'configs'", "must be a non-empty array of tables")
    out: list[TuneConfig] = []
    seen: dict[tuple[object, ...], int] = {}
    for i, table in enumerate(value):
        config = _config(f"{where} configs[{i}]", table, extra)
        first = seen.setdefault(config.identity(), i)
        if first != i:
            _fail(f"{where} key 'configs'", f"configs[{i}] duplicates configs[{first}]")
        out.append(config)
    return tuple(out)


def _grid(where: str, value: object, extra: _Keys) -> tuple[TuneConfig, ...]:
    here = f"{where} grid"
    if not isinstance(value, dict) or not value:
        _fail(here, "'grid' must be a non-empty table of arrays")
    axes: list[list[object]] = []
    for key, values in value.items():
        if not isinstance(values, list) or not values:
            _fail(here, f"key {key!r} must be a non-empty array; write [x] for a single value")
        seen: set[object] = set()
        for item in values:
            _check_item(here, key, item, extra)
            if _identity(item) in seen:
                _fail(here, f"key {key!r} lists {_show(item)} twice (duplicate config)")
            seen.add(_identity(item))
        axes.append(values)
    size = math.prod(len(a) for a in axes)
    if size > MAX_GRID:
        _fail(here, f"expands to {size} configs; at most {MAX_GRID} are allowed")
    keys = list(value)
    return tuple(
        _config(here, dict(zip(keys, combo, strict=True)), extra)
        for combo in itertools.product(*axes)
    )


def _table(where: str, value: object, extra: _Keys) -> tuple[TableRow, ...]:
    here = f"{where} key 'table'"
    if not isinstance(value, list):
        _fail(here, f"must be an array of tables; got {_type_name(value)} {_show(value)}")
    rows: list[TableRow] = []
    seen: dict[tuple[object, ...], int] = {}
    for i, item in enumerate(value):
        at = f"{here} row {i}"
        if not isinstance(item, dict):
            _fail(at, f"must be a table; got {_type_name(item)} {_show(item)}")
        if "config" not in item:
            _fail(at, "needs 'config' (the config launched at this bucket)")
        config = _config(f"{at} config", item["config"], extra)
        dtype = item.get("dtype")
        if dtype is not None and (not isinstance(dtype, str) or not dtype):
            _fail(at, f"'dtype' must be a dtype name such as 'bfloat16'; got {_show(dtype)}")
        when: dict[str, Scalar] = {}
        for key, v in item.items():
            if key in ("config", "dtype"):
                continue
            if type(v) not in _TABLE_VALUE:
                _fail(at, f"key {key!r} must be an integer, boolean or string; got {_show(v)}")
            when[key] = v
        if not when:
            _fail(at, "names no key value (for example M = 8192, N = 2048)")
        row = TableRow(when, dtype, config)
        identity = (row.when, row.dtype)
        first = seen.setdefault(identity, i)
        if first != i:
            _fail(here, f"row {i} repeats the bucket of row {first}")
        rows.append(row)
    return tuple(rows)


def _location(source: TuneSource, op: str) -> str:
    return f"{source.path}: [ops.{op}]" if _NAME.match(op) else f'{source.path}: [ops."{op}"]'


def _op(source: TuneSource, op: str, table: object, extra: _Keys) -> OpTuning:
    where = _location(source, op)
    if not isinstance(table, dict):
        _fail(where, f"must be a table; got {_type_name(table)} {_show(table)}")
    unknown = sorted(set(table) - set(_OP_KEYS))
    if unknown:
        _fail(where, f"unknown key {unknown[0]!r}; valid keys: {', '.join(_OP_KEYS)}")
    if "configs" in table and "grid" in table:
        _fail(where, "keys 'configs' and 'grid' exclude each other; use one")
    if "interpreter" in table and not {"configs", "grid"} & set(table):
        _fail(where, "key 'interpreter' needs 'configs' or 'grid' beside it")
    if not {"configs", "grid", "heuristics"} & set(table):
        _fail(where, "needs 'configs', 'grid' or 'heuristics'")
    configs: tuple[TuneConfig, ...] = ()
    if "configs" in table:
        configs = _configs(where, table["configs"], extra)
    elif "grid" in table:
        configs = _grid(where, table["grid"], extra)
    pinned = None
    if "interpreter" in table:
        pinned = _config(f"{where} key 'interpreter'", table["interpreter"], extra)
    rules = parse_rules(where, table["heuristics"]) if "heuristics" in table else ()
    if "table" in table and not configs:
        _fail(where, "key 'table' needs 'configs' or 'grid' beside it")
    rows = _table(where, table["table"], extra) if "table" in table else ()
    for rule in rules:
        # A constant rule is a value like a config's; computed ones are checked by the kernel.
        if isinstance(rule.expr, str | Call):
            continue
        if _META.match(rule.name) or rule.name in LAUNCH_KEYS:
            problem = value_problem(rule.name, rule.expr)
        elif rule.name in extra:
            problem = launch_option_problem(rule.name, rule.expr)
        elif rule.name in LAUNCH_OPTIONS:
            problem = extra.refusal(rule.name)
        else:
            problem = None
        if problem:
            _fail(f"{where} heuristics", problem)
    return OpTuning(op, source, configs, pinned, rules, rows)


def parse(
    data: Mapping[str, Any],
    source: TuneSource,
    *,
    extra_launch_keys: Collection[str] = (),
    vendor: str | None = None,
) -> TuneFile:
    """Turn one decoded TOML document into a :class:`TuneFile`.

    Args:
        data: The document, as ``tomllib`` returns it.
        source: Where it came from (named in every error).
        extra_launch_keys: The vendor's launch options (``VendorInfo.launch_options``):
            launch keywords it accepts beyond :data:`LAUNCH_KEYS`, each one of
            :data:`LAUNCH_OPTIONS`.
        vendor: The vendor's name, for error messages.

    Raises:
        ConfigError: the document breaks the format (a launch option the vendor does
            not declare among them); the message names the file, the op and the key.
    """
    problem = unknown_launch_options(extra_launch_keys)
    if problem:
        raise ConfigError(f"{source.path}: vendor {vendor or '?'}: {problem}")
    keys = _Keys(tuple(extra_launch_keys), vendor)
    where = str(source.path)
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        _fail(where, f"unknown top-level key {unknown[0]!r}; valid keys: {', '.join(_TOP_KEYS)}")
    version = data.get("version", FORMAT_VERSION)
    if type(version) is not int or version != FORMAT_VERSION:
        _fail(where, f"key 'version' must be {FORMAT_VERSION}; got {_show(version)}")
    unused = data.get("unused", [])
    if not isinstance(unused, list) or not all(isinstance(u, str) and u for u in unused):
        _fail(where, f"key 'unused' must be an array of op names (strings); got {unused!r}")
    ops = data.get("ops", {})
    if not isinstance(ops, dict):
        _fail(where, f"key 'ops' must be a table; got {_type_name(ops)}")
    entries = {op: _op(source, op, table, keys) for op, table in ops.items()}
    return TuneFile(source, frozenset(unused), MappingProxyType(entries))


def loads(
    text: str,
    source: TuneSource,
    *,
    extra_launch_keys: Collection[str] = (),
    vendor: str | None = None,
) -> TuneFile:
    """Parse TOML text as a tuning file (see :func:`parse`).

    Raises:
        ConfigError: the text is not valid TOML (the message names the file and
            line) or breaks the format.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source.path}: invalid TOML: {exc}") from exc
    return parse(data, source, extra_launch_keys=extra_launch_keys, vendor=vendor)
