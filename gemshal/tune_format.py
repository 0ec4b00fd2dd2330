"""The tuning-file format: typed records and the parser of one TOML document.

:mod:`gemshal.tune` finds and caches the files; this module only turns one
parsed TOML document into records, or raises :class:`~gemshal.errors.ConfigError`
naming the file, the op and the key at fault. docs/tuning.md describes the format.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

import attrs

from gemshal.errors import ConfigError
from gemshal.tune_rules import Call, HeuristicRule, parse_rules
from gemshal.tune_values import (
    LAUNCH_KEYS,
    LAUNCH_OPTIONS,
    META_NAME,
    Scalar,
    launch_keyword_problem,
    launch_option_problem,
    meta_problem,
    scalar_problem,
    show_value,
    type_name,
    unknown_launch_options,
    value_problem,
)

if TYPE_CHECKING:
    import triton

__all__ = [
    "FORMAT_VERSION",
    "LEVELS",
    "MAX_GRID",
    "HeuristicRule",
    "OpTuning",
    "TableRow",
    "TuneConfig",
    "TuneFile",
    "TuneSource",
    "loads",
    "parse",
]

FORMAT_VERSION = 1
"""The only value the optional top-level ``version`` key may take."""

LEVELS = ("user", "vendor-arch", "vendor", "default")
"""Source levels, highest precedence first."""

MAX_GRID = 4096
"""The most configs one grid may expand to; more is almost surely a typo."""

_TOP_KEYS = ("version", "unused", "ops")
_OP_KEYS = ("configs", "grid", "interpreter", "heuristics", "table")
_LOWER = re.compile(r"^[a-z][a-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _identity(value: object) -> object:
    # 1, 1.0 and true compare equal in Python but are different configs.
    return (type(value).__name__, value)


def _pairs(
    value: Mapping[str, Scalar] | Iterable[tuple[str, Scalar]],
) -> tuple[tuple[str, Scalar], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted(((str(k), v) for k, v in items), key=operator.itemgetter(0)))


def _check_pairs(pattern: re.Pattern[str], what: str) -> Any:
    def check(_inst: object, _a: object, value: tuple[tuple[str, Scalar], ...]) -> None:
        for key, item in value:
            problem = meta_problem(key, item) if pattern is META_NAME else scalar_problem(key, item)
            if not pattern.match(key) or key in LAUNCH_KEYS:
                problem = f"{what} {key!r} does not match {pattern.pattern}"
            if problem:
                raise ConfigError(problem)

    return check


def _check_opt_positive(
    _inst: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None:
        problem = launch_keyword_problem(attribute.name, value)
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
        default=(), converter=_pairs, validator=_check_pairs(META_NAME, "meta-parameter")
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
    if META_NAME.match(key):
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
        _fail(where, f"a config must be a table; got {type_name(table)} {show_value(table)}")
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
                _fail(here, f"key {key!r} lists {show_value(item)} twice (duplicate config)")
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
        _fail(here, f"must be an array of tables; got {type_name(value)} {show_value(value)}")
    rows: list[TableRow] = []
    seen: dict[tuple[object, ...], int] = {}
    for i, item in enumerate(value):
        at = f"{here} row {i}"
        if not isinstance(item, dict):
            _fail(at, f"must be a table; got {type_name(item)} {show_value(item)}")
        if "config" not in item:
            _fail(at, "needs 'config' (the config launched at this bucket)")
        config = _config(f"{at} config", item["config"], extra)
        dtype = item.get("dtype")
        if dtype is not None and (not isinstance(dtype, str) or not dtype):
            _fail(at, f"'dtype' must be a dtype name such as 'bfloat16'; got {show_value(dtype)}")
        when: dict[str, Scalar] = {}
        for key, v in item.items():
            if key in ("config", "dtype"):
                continue
            if type(v) not in _TABLE_VALUE:
                _fail(at, f"key {key!r} must be an integer, boolean or string; got {show_value(v)}")
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
        _fail(where, f"must be a table; got {type_name(table)} {show_value(table)}")
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
        if META_NAME.match(rule.name) or rule.name in LAUNCH_KEYS:
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
        _fail(where, f"key 'version' must be {FORMAT_VERSION}; got {show_value(version)}")
    unused = data.get("unused", [])
    if not isinstance(unused, list) or not all(isinstance(u, str) and u for u in unused):
        _fail(where, f"key 'unused' must be an array of op names (strings); got {unused!r}")
    ops = data.get("ops", {})
    if not isinstance(ops, dict):
        _fail(where, f"key 'ops' must be a table; got {type_name(ops)}")
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
