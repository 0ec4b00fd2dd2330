"""Helpers for the tuning tests: strategies, a tiny TOML writer (tomllib only reads), isolation."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from hypothesis import strategies as st

from gemshal import tune
from gemshal.tune_values import LAUNCH_KEYS

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _key(key: str) -> str:
    return key if _BARE.match(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value)
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def toml_dumps(document: Mapping[str, Any]) -> str:
    """A TOML document with one ``key = value`` line per top-level key (inline tables)."""
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in document.items())


def identity(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """A config dict's identity by key, type and value (``1``, ``1.0`` and ``true`` differ)."""
    return tuple(sorted((k, type(v).__name__, v) for k, v in config.items()))


_TYPED_NAME = re.compile(r"^(BLOCK|TILE|GROUP)(?![A-Za-z])|BLOCK$|_SIZE$")
# Meta-parameters the loader types by name are drawn apart, with values of their kind.
meta_keys = st.from_regex(r"[A-Z][A-Z0-9_]{0,5}", fullmatch=True).filter(
    lambda k: not _TYPED_NAME.search(k)
)
size_keys = st.sampled_from(["BLOCK", "BLOCK_M", "BLOCK_N", "TILE_N", "XBLOCK", "VEC_SIZE"])
size_values = st.integers(0, 20).map(lambda e: 1 << e)
group_keys = st.sampled_from(["GROUP", "GROUP_M"])
group_values = st.integers(1, 2**40)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,5}", fullmatch=True)
op_names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)
scalars = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=6),
)
launch_values = st.integers(1, 64)
warps_values = st.integers(0, 6).map(lambda e: 1 << e)


def values_for(key: str) -> st.SearchStrategy[Any]:
    """Valid values of config key ``key``."""
    if key == "num_warps":
        return warps_values
    if key in LAUNCH_KEYS:
        return launch_values
    if _TYPED_NAME.search(key):
        return group_values if key.startswith("GROUP") else size_values
    return scalars


any_meta_keys = st.one_of(meta_keys, size_keys, group_keys)


@st.composite
def config_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config table: some meta-parameters and some launch keywords, at least one."""
    keys = draw(st.lists(any_meta_keys, max_size=3, unique=True))
    meta = {k: draw(values_for(k)) for k in keys}
    launch_keys = draw(st.lists(st.sampled_from(LAUNCH_KEYS), max_size=2, unique=True))
    launch = {k: draw(values_for(k)) for k in launch_keys}
    if not meta and not launch:
        meta = {"BLOCK": draw(size_values)}
    return {**meta, **launch}


@st.composite
def grids(draw: st.DrawFn) -> dict[str, list[Any]]:
    """A valid grid table: one to three keys, each with a list of distinct values."""
    keys = draw(
        st.lists(
            st.one_of(any_meta_keys, st.sampled_from(LAUNCH_KEYS)),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    out: dict[str, list[Any]] = {}
    for key in keys:
        values = values_for(key)
        uniq = st.lists(values, min_size=1, max_size=4, unique_by=lambda v: (type(v), v))
        out[key] = draw(uniq)
    return out


def _calls(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def call(fn: str, lo: int, hi: int) -> st.SearchStrategy[Any]:
        return st.lists(inner, min_size=lo, max_size=hi).map(lambda args: {fn: args})

    return st.one_of(
        inner.map(lambda a: {"next_power_of_2": a}),
        st.sampled_from(["cdiv", "divisible", "lt", "le", "gt", "ge"]).flatmap(
            lambda fn: call(fn, 2, 2)
        ),
        st.sampled_from(["min", "max"]).flatmap(lambda fn: call(fn, 1, 3)),
        call("if", 3, 3),
    )


expressions = st.recursive(
    st.one_of(st.integers(-100, 100), st.booleans(), names), _calls, max_leaves=6
)


@st.composite
def op_tables(draw: st.DrawFn) -> dict[str, Any]:
    """A valid ``[ops.NAME]`` table (explicit configs, maybe interpreter and heuristics)."""
    table: dict[str, Any] = {
        "configs": draw(st.lists(config_dicts(), min_size=1, max_size=4, unique_by=identity))
    }
    if draw(st.booleans()):
        table["interpreter"] = draw(config_dicts())
    if draw(st.booleans()):
        table["heuristics"] = draw(st.dictionaries(names, expressions, min_size=1, max_size=3))
    return table


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid tuning file as a Python dict."""
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["unused"] = draw(st.lists(op_names, max_size=3))
    doc["ops"] = draw(st.dictionaries(op_names, op_tables(), max_size=3))
    return doc


@contextlib.contextmanager
def fresh_tune() -> Iterator[None]:
    """No registered directories (entry-point ones included), no unused checks and an
    empty cache; the session's state put back after."""
    saved = (list(tune._DIRS), list(tune._EP_DIRS), dict(tune._UNUSED_CHECKS))
    loaded = tune._ENTRY_POINTS_LOADED
    tune._DIRS.clear()
    tune._EP_DIRS.clear()
    tune._UNUSED_CHECKS.clear()
    tune._ENTRY_POINTS_LOADED = True
    tune.clear_cache()
    try:
        yield
    finally:
        tune._DIRS[:], tune._EP_DIRS[:] = saved[0], saved[1]
        tune._UNUSED_CHECKS.clear()
        tune._UNUSED_CHECKS.update(saved[2])
        tune._ENTRY_POINTS_LOADED = loaded
        tune.clear_cache()
