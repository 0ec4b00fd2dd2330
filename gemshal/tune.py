"""Tuning configs: where the files are, which one wins for an op, and the cache.

Op libraries register directories of TOML files with :func:`add_tune_dir`; each
vendor may ship more in ``VendorInfo.tune_dirs``. For one op the first source
that defines it wins, in this order (see docs/tuning.md):

1. the user's file named by ``GEMS_TUNE_CONFIG``;
2. ``<vendor>-<arch>.toml`` in each directory;
3. ``<vendor>.toml`` in each directory;
4. ``default.toml`` in each directory.

Within one level the vendor's own directories come first, then the directories
installed packages declare in the ``gemshal.tune_dirs`` entry-point group, sorted
by entry-point name, then directories registered with :func:`add_tune_dir` in
registration order: a directory registered later never outranks an earlier one,
and the order never depends on which package was imported first. Nothing is read
at import or registration; each file is read at most once per process, on the
first lookup that needs it.

Names are checked against what exists: an entry of the user's file that no other
tuning file defines is an error (a typo would otherwise be ignored), and so is a
name in an ``unused`` list that no op library registered with
:func:`add_unused_check` accepts.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from gemshal.errors import ConfigError
from gemshal.tune_format import LEVELS, OpTuning, TuneConfig, TuneFile, TuneSource, loads
from gemshal.tune_values import LAUNCH_KEYS, unknown_launch_options

__all__ = [
    "ENV_USER_FILE",
    "LAUNCH_KEYS",
    "LEVELS",
    "OpTuning",
    "TuneConfig",
    "TuneContext",
    "TuneSource",
    "UnusedCheck",
    "add_tune_dir",
    "add_unused_check",
    "clear_cache",
    "context_for",
    "current_context",
    "list_ops",
    "lookup",
    "search_path",
    "unused_ops",
]

ENV_USER_FILE = "GEMS_TUNE_CONFIG"
"""Environment variable naming the user's tuning file, which outranks all others."""

if TYPE_CHECKING:
    from gemshal.vendor import VendorInfo

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _strs(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise TypeError(f"expected a sequence of strings, got {value!r}")
    return tuple(os.fspath(v) for v in value)


def _check_extra(_inst: object, _a: object, value: tuple[str, ...]) -> None:
    bad = [k for k in value if not _NAME.match(k) or k in LAUNCH_KEYS]
    if bad:
        raise ValueError(
            f"extra launch keys must be lower-case names other than {', '.join(LAUNCH_KEYS)}; "
            f"got {bad!r}"
        )
    problem = unknown_launch_options(value)
    if problem:
        raise ValueError(f"extra launch keys: {problem}")


@attrs.frozen
class TuneContext:
    """What a lookup depends on: the device and the user's file.

    :func:`current_context` builds it from the current device; tests and tools
    (``gemshal config --vendor``) build their own.

    Attributes:
        vendor: The vendor name, e.g. ``"nvidia"``.
        arch: The architecture tag, e.g. ``"sm90"`` (``Arch.tag``).
        interpreter: True when kernels run on the Triton interpreter.
        vendor_dirs: The vendor's own tuning directories (``VendorInfo.tune_dirs``).
        user_file: The user's file (``GEMS_TUNE_CONFIG``), or None.
        extra_launch_keys: Lower-case launch keywords the vendor's Triton accepts
            beyond ``num_warps``, ``num_stages``, ``num_ctas`` and ``maxnreg``
            (``VendorInfo.launch_options``; each one of
            :data:`gemshal.tune_values.LAUNCH_OPTIONS`).
    """

    vendor: str = attrs.field(validator=attrs.validators.matches_re(_NAME))
    arch: str = attrs.field(validator=attrs.validators.min_len(1))
    interpreter: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    vendor_dirs: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    user_file: str | None = None
    extra_launch_keys: tuple[str, ...] = attrs.field(
        default=(), converter=_strs, validator=_check_extra
    )


@attrs.frozen
class _Dir:
    path: Path
    origin: str


UnusedCheck = Callable[[str], "str | None"]
"""An op library's vetting of an ``unused`` name: None if the library knows it, else why not."""

_LOCK = threading.RLock()
_DIRS: list[_Dir] = []
# Directories declared through the gemshal.tune_dirs entry-point group, sorted by name.
_EP_DIRS: list[_Dir] = []
_FILES: dict[tuple[TuneSource, tuple[str, ...], str], TuneFile | None] = {}
# Every entry name the files in a set of directories define (any vendor), by directories
# and the user's file (left out of the count).
_KNOWN: dict[tuple[tuple[Path, ...], Path | None], frozenset[str]] = {}
_UNUSED_CHECKS: dict[str, UnusedCheck] = {}
# Bumped by clear_cache() and add_tune_dir(): kernels that resolved their configs
# under an older generation resolve them again at their next launch.
_GENERATION = 0
ON_CHANGE: list[Callable[[], None]] = []
"""Called after each bump of the generation (an op library's own caches of launches,
such as gemsops' native recipes, drop them)."""


def _changed() -> None:
    for callback in list(ON_CHANGE):
        callback()


def add_tune_dir(path: str | os.PathLike[str], *, origin: str) -> None:
    """Put a directory of tuning files on the search path (reads nothing).

    Registering a directory already on the path does nothing. Directories
    registered later rank below earlier ones within each level, and all of them
    below the directories of the ``gemshal.tune_dirs`` entry-point group.

    Args:
        path: The directory; a relative path is made absolute now.
        origin: Who ships it, shown by ``gemshal config`` (e.g. ``"gemsops"``).

    Raises:
        ValueError: ``origin`` is empty.
    """
    global _GENERATION
    if not isinstance(origin, str) or not origin:
        raise ValueError(f"origin must be a non-empty string naming the package; got {origin!r}")
    entry = _Dir(Path(os.path.abspath(os.fspath(path))), origin)
    with _LOCK:
        if all(d.path != entry.path for d in _DIRS):
            _DIRS.append(entry)
            _GENERATION += 1
    _changed()


def clear_cache() -> None:
    """Forget every file read; the next lookup reads them again (tests, tools)."""
    global _GENERATION
    with _LOCK:
        _FILES.clear()
        _KNOWN.clear()
        _GENERATION += 1
    _changed()


def add_unused_check(check: UnusedCheck, *, origin: str) -> None:
    """Let an op library vet the names in the files' ``unused`` lists.

    ``unused_ops()`` then raises :class:`ConfigError` naming the file when every
    registered check refuses a name (with no check registered, names are not
    vetted: gemshal knows no op names). Registering again under one origin
    replaces that origin's check.

    Args:
        check: Called with one name; returns None when the library knows it, else a
            sentence saying why not (close matches, say).
        origin: Who registers it (e.g. ``"gemsops"``).
    """
    if not isinstance(origin, str) or not origin:
        raise ValueError(f"origin must be a non-empty string naming the package; got {origin!r}")
    if not callable(check):
        raise TypeError(f"check must be callable; got {check!r}")
    with _LOCK:
        _UNUSED_CHECKS[origin] = check


def context_for(info: VendorInfo, arch: str, *, interpreter: bool | None = None) -> TuneContext:
    """The context of vendor ``info`` on arch tag ``arch``, with ``GEMS_TUNE_CONFIG`` read now.

    The vendor's tuning directories and launch options come from its record;
    ``interpreter`` defaults to whether the vendor runs kernels on the interpreter.
    """
    return TuneContext(
        vendor=info.name,
        arch=arch,
        interpreter=info.is_cpu if interpreter is None else interpreter,
        vendor_dirs=info.tune_dirs,
        user_file=os.environ.get(ENV_USER_FILE) or None,
        extra_launch_keys=info.launch_options,
    )


def current_context() -> TuneContext:
    """The context of the current device, with ``GEMS_TUNE_CONFIG`` read now.

    This resolves the device (:func:`gemshal.device.current_device`) if nothing
    has yet.
    """
    from gemshal import device as _device

    dev = _device.current_device()
    return context_for(dev.vendor, dev.arch.tag, interpreter=dev.interpreter)


TUNE_DIRS_GROUP = "gemshal.tune_dirs"
"""Entry-point group through which installed packages declare their tuning directories."""
_ENTRY_POINTS_LOADED = False


def _entry_point_dir(ep: object) -> _Dir:
    name, value = getattr(ep, "name", "?"), getattr(ep, "value", "?")
    what = f"tuning directory entry point {name!r} ({value}) in group {TUNE_DIRS_GROUP!r}"
    try:
        target = ep.load()  # type: ignore[attr-defined]
        path = target() if callable(target) else target
    except (Exception, SystemExit) as exc:
        raise ConfigError(f"{what} failed to load: {exc!r}") from exc
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ConfigError(f"{what} gave {path!r}; it must name a directory (a str or a Path)")
    return _Dir(Path(os.path.abspath(os.fspath(path))), name)


def _load_entry_point_dirs() -> None:
    """Add the directories installed packages declare, sorted by entry-point name.

    A broken entry point is an error at every lookup until it is fixed.
    """
    global _ENTRY_POINTS_LOADED, _GENERATION
    with _LOCK:
        if _ENTRY_POINTS_LOADED:
            return
        import importlib.metadata

        eps = importlib.metadata.entry_points(group=TUNE_DIRS_GROUP)
        found = [_entry_point_dir(ep) for ep in sorted(eps, key=lambda e: (e.name, e.value))]
        _EP_DIRS[:] = found
        _ENTRY_POINTS_LOADED = True
        _GENERATION += 1


def _dirs(ctx: TuneContext) -> list[_Dir]:
    """The tuning directories for ``ctx``, highest precedence first, each once."""
    _load_entry_point_dirs()
    dirs: list[_Dir] = [_Dir(Path(d).absolute(), f"vendor {ctx.vendor}") for d in ctx.vendor_dirs]
    with _LOCK:
        dirs += _EP_DIRS
        dirs += _DIRS
    unique: list[_Dir] = []
    for d in dirs:
        if all(u.path != d.path for u in unique):
            unique.append(d)
    return unique


def search_path(context: TuneContext | None = None) -> tuple[TuneSource, ...]:
    """Every candidate file, highest precedence first, whether it exists or not.

    Directories come from the vendor's ``tune_dirs``, :func:`add_tune_dir` and the
    ``gemshal.tune_dirs`` entry-point group of installed packages.
    """
    ctx = context or current_context()
    unique = _dirs(ctx)
    out: list[TuneSource] = []
    if ctx.user_file:
        out.append(TuneSource(Path(ctx.user_file).expanduser(), "user", ENV_USER_FILE))
    names = {
        "vendor-arch": f"{ctx.vendor}-{ctx.arch}.toml",
        "vendor": f"{ctx.vendor}.toml",
        "default": "default.toml",
    }
    for level, name in names.items():
        out.extend(TuneSource(d.path / name, level, d.origin) for d in unique)
    return tuple(out)


def _read(path: Path) -> str | None:
    # The one place files are read; tests count calls to prove nothing is read early.
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read tuning file: {exc}") from exc


def _load(source: TuneSource, ctx: TuneContext) -> TuneFile | None:
    key = (source, ctx.extra_launch_keys, ctx.vendor)
    with _LOCK:
        if key in _FILES:
            return _FILES[key]
        text = _read(source.path)
        if text is None and source.level == "user":
            raise ConfigError(
                f"{source.path}: the tuning file named by {ENV_USER_FILE} does not exist "
                "or is not a file"
            )
        parsed = None
        if text is not None:
            parsed = loads(text, source, extra_launch_keys=ctx.extra_launch_keys, vendor=ctx.vendor)
            if source.level == "user":
                _check_user_entries(parsed, ctx)
        _FILES[key] = parsed
        return parsed


def _known_ops(ctx: TuneContext) -> frozenset[str]:
    """Every entry name some file in ``ctx``'s directories defines, for any vendor.

    Each ``*.toml`` is only decoded here; one that does not decode adds nothing
    (its own vendor's lookups report it).
    """
    dirs = tuple(d.path for d in _dirs(ctx))
    user = Path(ctx.user_file).expanduser().absolute() if ctx.user_file else None
    with _LOCK:
        if (dirs, user) in _KNOWN:
            return _KNOWN[dirs, user]
        names: set[str] = set()
        for directory in dirs:
            for path in sorted(directory.glob("*.toml")) if directory.is_dir() else ():
                if path == user:
                    continue  # the user's file does not vouch for itself
                try:
                    text = _read(path)
                    ops = tomllib.loads(text or "").get("ops")
                except (ConfigError, tomllib.TOMLDecodeError):
                    continue
                if isinstance(ops, dict):
                    names.update(ops)
        _KNOWN[dirs, user] = known = frozenset(names)
        return known


def _check_user_entries(parsed: TuneFile, ctx: TuneContext) -> None:
    """An entry of the user's file that no tuning file defines names no kernel: an error."""
    if not parsed.ops:
        return
    known = _known_ops(ctx)
    if not known:
        return  # no op library has put its files on the path: nothing to check against
    for op, entry in parsed.ops.items():
        if op in known:
            continue
        close = difflib.get_close_matches(op, known, n=5, cutoff=0.6)
        hint = (
            f"close matches: {', '.join(close)}"
            if close
            else f"known entries: {', '.join(sorted(known))}"
        )
        raise ConfigError(
            f"{entry.location}: unknown entry {op!r}: no tuning file of the op libraries "
            f"defines it, so no kernel would read it; {hint}"
        )


def _check_unused(source: TuneSource, names: frozenset[str]) -> None:
    with _LOCK:
        checks = list(_UNUSED_CHECKS.values())
    if not checks:
        return
    for name in sorted(names):
        problems = []
        for check in checks:
            problem = check(name)
            if problem is None:
                break
            problems.append(problem)
        else:
            raise ConfigError(f"{source.path}: key 'unused': {'; '.join(problems)}")


def _files(ctx: TuneContext) -> list[tuple[TuneSource, TuneFile | None]]:
    return [(source, _load(source, ctx)) for source in search_path(ctx)]


def lookup(op: str, *, context: TuneContext | None = None) -> OpTuning:
    """The tuning entry for ``op`` from the highest-ranked file that defines it.

    Entries are never merged: the winning file's entry is used whole.

    Args:
        op: The op's name as the op library spells it.
        context: The device to look up for; the current device when None.

    Raises:
        ConfigError: no file defines ``op`` (the message lists every file
            searched, marking missing ones), the user's file is missing or has an
            entry no other tuning file defines, a file on the way is malformed,
            or a ``gemshal.tune_dirs`` entry point is broken.
    """
    ctx = context or current_context()
    searched = []
    for source, parsed in _files(ctx):
        if parsed is None:
            searched.append(f"{source.path} ({source.level}, {source.origin}; does not exist)")
            continue
        entry = parsed.ops.get(op)
        if entry is not None:
            return entry
        searched.append(f"{source.path} ({source.level}, {source.origin})")
    where = "\n  ".join(searched) or (
        "(no tuning directories are registered: installed packages declare theirs in the "
        f"{TUNE_DIRS_GROUP!r} entry-point group, importing gemsops registers its own, "
        "and gemshal.tune.add_tune_dir() adds one)"
    )
    raise ConfigError(
        f"no tuning config for op {op!r} on {ctx.vendor} {ctx.arch}; searched, in order:\n  {where}"
    )


def unused_ops(context: TuneContext | None = None) -> frozenset[str]:
    """The ops any file on the search path asks to leave to torch (the union of all).

    Raises:
        ConfigError: the user's file is missing, a file is malformed, or a file
            lists a name no check registered with :func:`add_unused_check` accepts
            (the message names that file).
    """
    ctx = context or current_context()
    out: set[str] = set()
    for source, parsed in _files(ctx):
        if parsed is not None:
            _check_unused(source, parsed.unused)
            out |= parsed.unused
    return frozenset(out)


def list_ops(context: TuneContext | None = None) -> dict[str, TuneSource]:
    """Every op some file defines, mapped to the file whose entry wins, sorted by op.

    Raises:
        ConfigError: the user's file is missing or a file is malformed.
    """
    ctx = context or current_context()
    out: dict[str, TuneSource] = {}
    for source, parsed in _files(ctx):
        if parsed is not None:
            for op in parsed.ops:
                out.setdefault(op, source)
    return dict(sorted(out.items()))
