"""The vendor registry: the built-in vendors plus out-of-tree plugins.

A plugin is an installed package with an entry point in the group
``gemshal.vendors``. The entry point names either a :class:`VendorInfo` or a
callable returning one. Plugins are discovered on first use of the registry,
never at import, and loaded in entry-point name order. A plugin that fails to
load is remembered with its error: it appears in :func:`plugin_failures`, in the
detection trace and in ``gemshal vendors``, and asking for it by name raises
:class:`PluginLoadError` from that error. Whatever a plugin raises while it loads
(``SystemExit`` included; only ``KeyboardInterrupt`` passes through) is recorded
this way, never ends the process.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import threading
from collections.abc import Iterator

import attrs

from gemshal.errors import GemshalError, PluginLoadError, UnknownVendorError
from gemshal.vendor import VendorInfo

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginFailure",
    "plugin_failures",
    "register_vendor",
    "registered",
    "vendor",
    "vendor_names",
    "vendors",
]

ENTRY_POINT_GROUP = "gemshal.vendors"


@attrs.frozen
class PluginFailure:
    """An out-of-tree vendor whose entry point could not be loaded."""

    name: str
    entry_point: str
    error: BaseException

    def describe(self) -> str:
        """One line: the plugin, where it points, and what went wrong."""
        what = f"{type(self.error).__name__}: {self.error}"
        if isinstance(self.error, SystemExit):
            what += " (the plugin called sys.exit() while loading)"
        return f"plugin {self.name!r} ({self.entry_point}) failed to load: {what}"


@attrs.define
class _Registry:
    vendors: dict[str, VendorInfo] = attrs.field(factory=dict)
    sources: dict[str, str] = attrs.field(factory=dict)
    failures: dict[str, PluginFailure] = attrs.field(factory=dict)
    loaded: bool = False


_LOCK = threading.RLock()
_STATE = _Registry()


def _add(info: VendorInfo, source: str) -> None:
    if not isinstance(info, VendorInfo):
        raise TypeError(f"{source} gave {type(info).__name__}, expected a gemshal.VendorInfo")
    existing = _STATE.vendors.get(info.name)
    if existing is not None:
        raise GemshalError(
            f"vendor name {info.name!r} from {source} is already registered "
            f"by {_STATE.sources[info.name]}"
        )
    _STATE.vendors[info.name] = info
    _STATE.sources[info.name] = source


def _kind(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _plugin_info(ep: importlib.metadata.EntryPoint) -> VendorInfo:
    target = ep.load()
    if callable(target) and not isinstance(target, VendorInfo):
        info = target()
        if not isinstance(info, VendorInfo):
            raise TypeError(
                f"the entry point's callable {ep.value} returned {_kind(info)}; "
                "it must return a gemshal.VendorInfo"
            )
        return info
    if not isinstance(target, VendorInfo):
        raise TypeError(
            f"the entry point {ep.value} is {_kind(target)}; it must name a "
            "gemshal.VendorInfo or a callable returning one"
        )
    return target


def _load_plugin(ep: importlib.metadata.EntryPoint) -> None:
    source = f"plugin {ep.value}"
    try:
        info = _plugin_info(ep)
        if info.name != ep.name:
            raise GemshalError(
                f"entry point {ep.name!r} returned a vendor named {info.name!r}; "
                "the entry point's name must equal the vendor's name"
            )
        _add(info, source)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a plugin never ends the process
        _STATE.failures[ep.name] = PluginFailure(ep.name, ep.value, exc)


def _loaded() -> bool:
    return _STATE.loaded


def _ensure_loaded() -> None:
    if _loaded():
        return
    with _LOCK:
        if _loaded():  # another thread finished loading while this one waited
            return
        from gemshal.platforms import BUILTIN

        for info in BUILTIN:
            if info.name not in _STATE.vendors:
                _add(info, "gemshal (built-in)")
        # By entry-point name: the order never depends on where each package is installed.
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        for ep in sorted(eps, key=lambda e: (e.name, e.value)):
            _load_plugin(ep)
        _STATE.loaded = True


def register_vendor(info: VendorInfo, *, source: str = "register_vendor()") -> VendorInfo:
    """Add a vendor at run time (plugins normally use the entry point instead).

    Raises:
        GemshalError: a vendor of that name is already registered.
    """
    _ensure_loaded()
    with _LOCK:
        _add(info, source)
    return info


@contextlib.contextmanager
def registered(info: VendorInfo, *, source: str) -> Iterator[VendorInfo]:
    """Register ``info`` for the ``with`` block unless a vendor of its name exists; on exit
    remove it again if it was added here (for test harnesses).

    Yields:
        The vendor registered under ``info.name`` (the earlier one if there was one).
    """
    _ensure_loaded()
    with _LOCK:
        added = info.name not in _STATE.vendors
        if added:
            _add(info, source)
    try:
        yield _STATE.vendors[info.name]
    finally:
        if added:
            with _LOCK:
                _STATE.vendors.pop(info.name, None)
                _STATE.sources.pop(info.name, None)


def vendor(name: str) -> VendorInfo:
    """The registered vendor called ``name``.

    Raises:
        UnknownVendorError: no such vendor; the message lists the known names.
        PluginLoadError: the plugin registered under ``name`` failed to load; its
            original error is the ``__cause__``.
    """
    _ensure_loaded()
    found = _STATE.vendors.get(name)
    if found is not None:
        return found
    failure = _STATE.failures.get(name)
    if failure is not None:
        raise PluginLoadError(f"vendor {name!r} is unavailable: {failure.describe()}") from (
            failure.error
        )
    import difflib  # only on the error path: keeps import gemshal light

    known = sorted(_STATE.vendors)
    # Vendor names are lower-case: a name that differs only in case ("CPU") is matched
    # case-blind first.
    folded = [k for k in known if k == str(name).lower()]
    close = folded or difflib.get_close_matches(str(name).lower(), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownVendorError(f"unknown vendor {name!r}; known vendors: {', '.join(known)}.{hint}")


def vendors() -> tuple[VendorInfo, ...]:
    """Every registered vendor: built-ins in detection order, then plugins by name, then
    vendors added with :func:`register_vendor`."""
    _ensure_loaded()
    return tuple(_STATE.vendors.values())


def vendor_names() -> tuple[str, ...]:
    """The names of every registered vendor, in registry order."""
    return tuple(v.name for v in vendors())


def vendor_source(name: str) -> str:
    """Where a registered vendor came from (built-in, or the plugin's entry point)."""
    vendor(name)
    return _STATE.sources[name]


def plugin_failures() -> tuple[PluginFailure, ...]:
    """Plugins that failed to load, with their errors."""
    _ensure_loaded()
    return tuple(_STATE.failures.values())


def _reset() -> None:
    """Forget everything (tests only): the next use reloads built-ins and plugins."""
    with _LOCK:
        global _STATE
        _STATE = _Registry()
