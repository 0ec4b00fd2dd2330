"""The table of aten overloads gemsops serves, and their registration with torch.

Registration goes through one ``torch.library.Library("aten", "IMPL")`` at the
current vendor's dispatch key. Before overriding an overload, torch's own kernel at
that key is captured with ``torch.library.get_kernel``: an input a gemsops kernel
does not handle (it raises :class:`~gemsops.errors.Unsupported`) is passed to that
kernel and counted. Dropping the Library object restores torch's kernels exactly.

The registration is process-wide; use_gems() blocks are counted across threads under
``_LOCK`` (see use_gems). The fallback takes any argument: Python numbers where torch's
schema takes a tensor are made 0-dim tensors that promote as the numbers did.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import torch

import gemshal
from gemshal.errors import GemshalError
from gemshal.kernel.compile import SCOPE as _COMPILE_SCOPE
from gemshal.kernel.compile import KernelCompiling
from gemsops import declare
from gemsops.call_record import (
    COMPILING,
    INSIDE,
    OPEN_RECORDS,
    CallRecord,
    in_gemsops,
    note_handed_back,
    record,
    running,
)
from gemsops.errors import GemsopsError, UnknownOpError, Unsupported
from gemsops.wrapped_numbers import TensorParams, numbers_as_tensors, tensor_params

if TYPE_CHECKING:
    from gemsops.native import Plan

__all__ = [
    "COMPILING",
    "CallRecord",
    "aten_overload",
    "base_name",
    "disable",
    "enable",
    "implementations",
    "in_gemsops",
    "known_ops",
    "note_handed_back",
    "override",
    "overrides",
    "record",
    "registered_ops",
    "resolve_names",
    "running",
    "served_kernel",
    "skipped_ops",
    "source",
    "use_gems",
]

_LOCK = threading.RLock()
_IMPLS: dict[str, Callable[..., Any]] | None = None
_SOURCES: dict[str, declare.Declaration] = {}
_AUTOGRAD: frozenset[str] = frozenset()
"""Overloads served at the vendor's autograd key (declared with ``autograd=True``)."""


def implementations() -> dict[str, Callable[..., Any]]:
    """Every aten overload gemsops implements, mapped to its implementation.

    The first call resolves the device (which switches on the Triton interpreter on a
    CPU-only machine), then imports the op modules and binds their declarations
    (:mod:`gemsops.declare`): a vendor's override wins on that vendor.
    """
    global _IMPLS, _AUTOGRAD
    if _IMPLS is not None:
        return _IMPLS
    with _LOCK:
        if _IMPLS is None:
            device = gemshal.current_device()
            bound = declare.table(declare.load(), device.vendor.name, device.arch.tag)
            table = {overload: fn for overload, (_, fn) in bound.items()}
            autograd = {overload for overload, (decl, _) in bound.items() if decl.autograd}
            _SOURCES.update({overload: decl for overload, (decl, _) in bound.items()})
            _AUTOGRAD = frozenset(autograd)
            _IMPLS = table
    return _IMPLS


def source(overload: str) -> str:
    """Where ``overload``'s implementation comes from: ``module.function``, with
    ``[vendor]`` or ``[vendor/arch]`` for a vendor's override."""
    fn = implementations()[overload]
    decl = _SOURCES.get(overload)
    if decl is None:
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}"
    where = f"{decl.module}.{decl.fn.__name__}"
    if decl.vendor is not None:
        where += f" [{decl.vendor}{'/' + decl.arch if decl.arch else ''}]"
    return where


def override(overload: str) -> str | None:
    """The vendor override serving ``overload`` here (as :func:`source` names it), or None
    when the portable implementation serves it."""
    implementations()
    decl = _SOURCES.get(overload)
    return None if decl is None or decl.vendor is None else source(overload)


def overrides() -> dict[str, str]:
    """Every overload a vendor override serves on this vendor, with its source, sorted."""
    return {o: where for o in sorted(implementations()) if (where := override(o)) is not None}


def base_name(overload: str) -> str:
    """The op an overload belongs to: ``add_.Tensor`` and ``add.out`` both give ``add``."""
    name = overload.split(".", 1)[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def known_ops() -> tuple[str, ...]:
    """Every name enable() accepts: op names and exact overloads, sorted."""
    overloads = implementations()
    return tuple(sorted({base_name(o) for o in overloads} | set(overloads)))


def resolve_names(names: Iterable[str] | str) -> frozenset[str]:
    """Turn op names (``"add"``) and overloads (``"add.Tensor"``) into overloads.

    A lone string is one name.

    Raises:
        UnknownOpError: a name gemsops does not implement (the message lists close matches).
    """
    overloads = implementations()
    out: set[str] = set()
    for name in (names,) if isinstance(names, str) else names:
        if name in overloads:
            out.add(name)
            continue
        matched = {o for o in overloads if base_name(o) == name}
        if not matched:
            close = difflib.get_close_matches(name, known_ops(), n=5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise UnknownOpError(f"gemsops implements no op named {name!r}{hint}")
        out |= matched
    return frozenset(out)


_DELIBERATE = (GemsopsError, GemshalError)
"""Errors an implementation raises on purpose (a bad setting): they reach the caller."""


def _reason(error: Exception) -> str:
    """The fallback reason for an error an implementation raised: its type and first line."""
    lines = str(error).strip().splitlines()
    return f"gemsops raised {type(error).__name__}" + (f": {lines[0][:160]}" if lines else "")


def _writes_an_argument(overload: str) -> bool:
    """Whether the overload's schema writes one of its arguments (in-place or ``out=``)."""
    try:
        return bool(aten_overload(overload)._schema.is_mutable)
    except (AttributeError, RuntimeError):
        return True  # unknown: never defer


def _wrap(overload: str, fn: Callable[..., Any], original: Any) -> Callable[..., Any]:
    inside = INSIDE
    by_override = override(overload)
    # An overload that writes no argument may have its first launch compile in the
    # background and serve the call with torch's kernel meanwhile: torch recomputes the
    # whole call, and nothing gemsops launched for it is visible.
    # (Not where torch has no kernel to serve the call meanwhile.)
    defer = not isinstance(original, _NoTorchKernel) and not _writes_an_argument(overload)
    scope = _COMPILE_SCOPE
    call_torch = original.call_boxed
    params: list[TensorParams] = []

    def to_torch(keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # torch's kernel, given tensors where its schema takes them (see gemsops.wrapped_numbers).
        # Torch ops made while converting go straight to torch, as inside a kernel.
        before = inside.depth
        inside.depth = 1
        try:
            if not params:  # looked up on first use: enable() stays quick
                params.append(tensor_params(aten_overload(overload)._schema))
            converted = numbers_as_tensors(params[0], args, kwargs)
        finally:
            inside.depth = before
        if converted is not None:
            args, kwargs = converted
        return call_torch(keyset, *args, **kwargs)

    def fallback(keyset: Any, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inside.served = False
        for rec in OPEN_RECORDS:
            rec.fallbacks[(overload, reason)] += 1
        return to_torch(keyset, args, kwargs)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if inside.depth:
            # An aten call made while a gemsops kernel runs comes from the machinery under
            # it (the Triton interpreter copies tensors with torch ops): torch serves it.
            return to_torch(keyset, args, kwargs)
        inside.depth = 1
        scope.defer = defer
        try:
            out = fn(*args, **kwargs)
        except Unsupported as why:
            inside.depth = 0
            return fallback(keyset, why.reason, args, kwargs)
        except KernelCompiling:
            inside.depth = 0
            return fallback(keyset, COMPILING, args, kwargs)
        except _DELIBERATE:
            raise
        except Exception as error:
            # A check that could not take the input (say, a dtype test torch.iinfo
            # refuses): torch's kernel answers, or raises torch's own error.
            inside.depth = 0
            return fallback(keyset, _reason(error), args, kwargs)
        finally:
            inside.depth = 0
            scope.defer = False
        inside.served = True
        for rec in OPEN_RECORDS:
            rec.served[overload] += 1
            if by_override is not None:
                rec.overrides[overload] = by_override
        return out

    kernel.__name__ = f"gemsops_{overload.replace('.', '_')}"
    return kernel


_Key = tuple[frozenset[str], frozenset[str] | None]
"""enable()'s arguments as sets: (unused, include)."""


@attrs.frozen
class _Active:
    overloads: frozenset[str]
    library: Any = attrs.field(eq=False)
    key: _Key
    skipped: dict[str, str] = attrs.field(factory=dict, eq=False)
    slots: tuple[tuple[str, str], ...] = attrs.field(default=(), eq=False)
    """(aten name, dispatch key) of every kernel registered."""
    native: tuple[int, ...] = attrs.field(default=(), eq=False)
    """Handles of the native kernels registered (:mod:`gemsops.native`)."""


_ACTIVE: _Active | None = None


def _vendor_unused() -> frozenset[str]:
    from gemshal import tune

    return frozenset(tune.unused_ops())


def _select(unused: Iterable[str], include: Iterable[str] | None) -> frozenset[str]:
    overloads = implementations()
    chosen = frozenset(overloads) if include is None else resolve_names(include)
    dropped = resolve_names(set(unused) | _vendor_unused())
    return chosen - dropped


@attrs.frozen
class _NoTorchKernel:
    """Stands where torch has no kernel: an unsupported input is an error naming the op."""

    name: str
    key: str

    def call_boxed(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        raise GemsopsError(
            f"aten::{self.name}: gemsops cannot take these inputs and torch has no "
            f"{self.key} kernel to hand them to"
        )


def _torch_kernel(name: str, key: str) -> Any | None:
    """torch's own kernel for ``aten::name`` at ``key``, or None when it has none there."""
    if not torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"aten::{name}", key):
        return None
    return torch.library.get_kernel(f"aten::{name}", key)


def _autograd_key(key: str) -> str | None:
    """The autograd dispatch key paired with a backend key (CUDA -> AutogradCUDA), if any."""
    name = f"Autograd{key}"
    return name if name in torch._C.DispatchKey.__members__ else None


def served_kernel(
    overload: str, fn: Callable[..., Any], key: str
) -> tuple[Callable[..., Any], bool]:
    """The kernel that serves ``overload`` with ``fn`` at dispatch key ``key`` (handing
    what ``fn`` cannot take to torch's kernel there), and whether torch has none there.

    Where torch has no kernel (e.g. _fused_rms_norm_backward on the CPU), torch may still
    route to it once gemsops serves its forward: gemsops serves it too, and says so
    plainly for inputs it cannot take. The registration and the compile backend's
    ``gemsops::`` ops both take their kernels from here.
    """
    name = overload.removesuffix(".default")
    original = _torch_kernel(name, key)
    alone = original is None
    return _wrap(overload, fn, _NoTorchKernel(name, key) if original is None else original), alone


def aten_overload(overload: str) -> Any:
    """The ``torch.ops.aten`` overload gemsops spells ``overload`` (``"mm.default"``)."""
    name, _, over = overload.partition(".")
    return getattr(getattr(torch.ops.aten, name), over or "default")


def _register(overloads: frozenset[str]) -> _Active:
    impls = implementations()
    if not gemshal.current_device().interpreter:
        from gemshal.kernel.compile import prewarm

        prewarm()  # Triton's own cache key, before the first compile needs it
    backend = gemshal.current_vendor().dispatch_key
    autograd = _autograd_key(backend)
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    served: set[str] = set()
    skipped: dict[str, str] = {}
    slots: list[tuple[str, str]] = []
    handles: list[int] = []
    native_on = _native_on()
    with warnings.catch_warnings():
        # torch warns once that a kernel is overridden: that is the point of enable().
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for overload in sorted(overloads):
            key = backend
            if overload in _AUTOGRAD:
                if autograd is None:  # no autograd key pairs with this backend key
                    continue
                key = autograd
            # torch spells the default overload without a suffix: "aten::abs", not "abs.default".
            name = overload.removesuffix(".default")
            kernel, alone = served_kernel(overload, impls[overload], key)
            if alone:
                skipped[overload] = f"torch has no {key} kernel; gemsops is the only one"
            # At the autograd key the native kernel keys only the calls autograd does not
            # record (nothing requires grad, or grad mode is off); the rest run in Python.
            how = _native_plan(overload) if native_on else None
            if how is not None:
                _serve_native(library, overload, name, key, kernel, how, handles)
            else:
                library.impl(name, kernel, key, with_keyset=True)  # type: ignore[no-untyped-call]
            served.add(overload)
            slots.append((name, key))
    return _Active(
        frozenset(served), library, (frozenset(), None), skipped, tuple(slots), tuple(handles)
    )


def _native_on() -> bool:
    """Whether this registration serves eligible overloads natively (GEMS_NATIVE, see
    :func:`gemsops.native.wanted`, and the library loads)."""
    from gemsops import native

    if not native.wanted(gemshal.current_vendor()):
        return False
    # Unless forced on (GEMS_NATIVE=1), a library not built yet is built in the
    # background: this registration is Python's, and the native kernels swap in when
    # the build is done (_swap_native).
    return native.load(background=native.setting() != "1", on_ready=_swap_native)


def _swap_native() -> None:
    """Register the native kernels in place of the Python ones, once a background build
    loaded the library (on the build's thread). torch takes one Python kernel per op and
    key, so the old registration goes first: a call made in between runs torch's kernel
    (the same answer)."""
    global _ACTIVE
    with _LOCK:
        old = _ACTIVE
        if old is None or old.native:
            return
        key = old.key
        _apply(None)
        _ACTIVE = attrs.evolve(_register(_select(*key)), key=key)
        _forget_dispatch_caches()


def _native_plan(overload: str) -> Plan | None:
    from gemsops import native

    return native.plan(overload, source(overload))


def _serve_native(
    library: Any, overload: str, name: str, key: str, kernel: Any, how: Plan, handles: list[int]
) -> None:
    """The native kernel at ``key``; the Python kernel one level down, at PrivateUse3
    (keyed misses, recorded) and PrivateUse2 (calls the native kernel cannot key)."""
    from gemsops import native

    record = native.recorder(overload, kernel, aten_overload(overload)._schema, how)
    library.impl(name, kernel, "PrivateUse2", with_keyset=True)
    library.impl(name, record, "PrivateUse3", with_keyset=True)
    handles.append(native.serve(name, key, overload))


def _names(names: Iterable[str] | None) -> frozenset[str] | None:
    """A set of names; a lone string is one name (``include="mm"``), not its letters."""
    if names is None:
        return None
    return frozenset((names,) if isinstance(names, str) else names)


def _apply(key: _Key | None) -> frozenset[str]:
    """Make the registration the one for ``key`` (None: nothing). Call under _LOCK."""
    global _ACTIVE
    if key is None:
        if _ACTIVE is not None:
            _retire(_ACTIVE)
            if _ACTIVE.native:
                from gemsops import native

                for handle in _ACTIVE.native:  # before the Python kernels they call
                    native.release(handle)
            _ACTIVE.library._destroy()
            _ACTIVE = None
            _forget_dispatch_caches()
        return frozenset()
    if _ACTIVE is not None and _ACTIVE.key == key:
        return _ACTIVE.overloads
    overloads = _select(*key)
    _apply(None)
    _ACTIVE = attrs.evolve(_register(overloads), key=key)
    _forget_dispatch_caches()
    return _ACTIVE.overloads


def _forget_dispatch_caches() -> None:
    """Drop the handlers torch's Python dispatcher cached per op (``OpOverload``'s
    ``_dispatch_cache``), after the registration changed.

    ``torch.compile`` traces through the Python dispatcher, which caches, per op and
    dispatch key, a handler that can hold the kernel gemsops registered. Once the Library
    is destroyed that kernel is freed, and the next compile's first ``torch.clone`` (dynamo
    saves the RNG state) ran the stale handler: a segfault. The caches refill on demand.
    """
    ops = getattr(torch._ops, "get_cached_ops", None)
    reset = getattr(torch._ops, "reset_cached_ops", None)
    if ops is None or reset is None:
        return
    for overload in list(ops()):
        cache = getattr(overload, "_dispatch_cache", None)
        if cache is not None:
            cache.clear()
    reset()


_RETIRED: collections.deque[tuple[float, list[Any]]] = collections.deque()
_RETIRE_S = 5.0


def _retire(active: _Active) -> None:
    """Keep the kernels of a registration about to be dropped alive for a while.

    torch's dispatcher reads its tables without a lock: another thread may have looked
    our kernel up just before the Library is destroyed and still be waiting for the GIL
    to run it. Destroying frees the kernel under it (a crash), so while other threads
    exist, a reference to each kernel (``torch.library.get_kernel``) is held for
    ``_RETIRE_S`` seconds. A single-threaded process holds nothing.
    """
    now = time.monotonic()
    while _RETIRED and now - _RETIRED[0][0] > _RETIRE_S:
        _RETIRED.popleft()
    if threading.active_count() > 1:
        _RETIRED.append((now, [torch.library.get_kernel(f"aten::{n}", k) for n, k in active.slots]))


@attrs.define(eq=False)
class _Block:
    """One open use_gems() block, in any thread; compared by identity."""

    key: _Key


_BLOCKS: list[_Block] = []
"""Every open use_gems() block of the process, oldest first. The newest one's arguments
are the registration; when the last one closes, ``_OUTSIDE`` is put back."""
_OUTSIDE: _Key | None = None
"""The registration found when the first of the open blocks was entered."""


def enable(
    *, unused: Iterable[str] | str = (), include: Iterable[str] | str | None = None
) -> frozenset[str]:
    """Serve aten ops with gemsops kernels at the current vendor's dispatch key.

    Args:
        unused: Op names or overloads to leave to torch, added to the vendor's own list.
            A string is one name.
        include: If given, only these op names or overloads are served. A string is one
            name.

    Returns:
        The aten overloads now served.

    Enabling again with the same arguments changes nothing; with other arguments the
    registration is replaced. The registration is process-wide: it serves every thread.
    Called while use_gems() blocks are open, it applies at once, until the next block
    is entered or left.
    """
    key = (_names(unused) or frozenset(), _names(include))
    with _LOCK:
        return _apply(key)


def disable() -> None:
    """Give every aten op back to torch's own kernels (in every thread)."""
    with _LOCK:
        _apply(None)


def skipped_ops() -> dict[str, str]:
    """Overloads served without a torch kernel behind them (no fallback), with the reason."""
    active = _ACTIVE
    return {} if active is None else dict(active.skipped)


def registered_ops() -> tuple[str, ...]:
    """The aten overloads gemsops serves right now, sorted."""
    active = _ACTIVE
    return () if active is None else tuple(sorted(active.overloads))


@contextlib.contextmanager
def use_gems(
    *, unused: Iterable[str] | str = (), include: Iterable[str] | str | None = None
) -> Iterator[frozenset[str]]:
    """Serve aten ops with gemsops inside the block; leave torch as it was found on exit.

    The registration is process-wide and counted: it stays while any thread is inside a
    use_gems() block, and when the last block (of any thread) is left, what was there
    before the first one is put back. Open blocks with different arguments share one
    registration, the most recently entered block's; leaving it restores the newest
    block still open (so nested blocks in one thread restore the outer block's set).
    """
    global _OUTSIDE
    block = _Block((_names(unused) or frozenset(), _names(include)))
    with _LOCK:
        outside = _ACTIVE.key if _ACTIVE is not None else None
        served = _apply(block.key)  # an unknown name raises here, before the block opens
        if not _BLOCKS:
            _OUTSIDE = outside
        _BLOCKS.append(block)
    try:
        yield served
    finally:
        with _LOCK:
            for i, open_block in enumerate(_BLOCKS):
                if open_block is block:
                    del _BLOCKS[i]
                    break
            _apply(_BLOCKS[-1].key if _BLOCKS else _OUTSIDE)
