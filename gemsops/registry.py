"""The table of aten overloads gemsops serves, and their registration with torch.

Registration goes through one ``torch.library.Library("aten", "IMPL")`` at the
current vendor's dispatch key. Before overriding an overload, torch's own kernel at
that key is captured with ``torch.library.get_kernel``: an input a gemsops kernel
does not handle (it raises :class:`~gemsops.errors.Unsupported`) is passed to that
kernel and counted. Dropping the Library object restores torch's kernels exactly.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import torch

import gemshal
from gemsops.errors import GemsopsError, UnknownOpError, Unsupported

__all__ = [
    "OP_MODULES",
    "CallRecord",
    "base_name",
    "disable",
    "enable",
    "implementations",
    "in_gemsops",
    "known_ops",
    "record",
    "registered_ops",
    "resolve_names",
    "running",
    "skipped_ops",
    "use_gems",
]

OP_MODULES = (
    "gemsops.ops.pointwise",
    "gemsops.ops.fill",
    "gemsops.ops.reduce",
    "gemsops.ops.softmax",
    "gemsops.ops.norm",
    "gemsops.ops.matmul",
    "gemsops.ops.embedding",
    "gemsops.ops.loss",
    "gemsops.ops.copy",
    "gemsops.ops.cross_entropy",
)
"""Op modules, imported on first use (after gemshal has resolved the device)."""

_LOCK = threading.RLock()
_IMPLS: dict[str, Callable[..., Any]] | None = None
_AUTOGRAD: frozenset[str] = frozenset()
"""Overloads served at the vendor's autograd key (a module's ``AUTOGRAD_IMPLS``)."""


def implementations() -> dict[str, Callable[..., Any]]:
    """Every aten overload gemsops implements, mapped to its implementation.

    The first call resolves the device (which switches on the Triton interpreter on a
    CPU-only machine) and then imports the kernel modules.
    """
    global _IMPLS, _AUTOGRAD
    if _IMPLS is not None:
        return _IMPLS
    with _LOCK:
        if _IMPLS is None:
            gemshal.current_device()
            table: dict[str, Callable[..., Any]] = {}
            autograd: set[str] = set()
            for name in OP_MODULES:
                module = importlib.import_module(name)
                tables = (module.IMPLS, getattr(module, "AUTOGRAD_IMPLS", {}))
                for at_autograd, impls in enumerate(tables):
                    for overload, fn in impls.items():
                        if overload in table:
                            raise RuntimeError(f"{overload} is implemented twice ({name})")
                        table[overload] = fn
                        if at_autograd:
                            autograd.add(overload)
            _AUTOGRAD = frozenset(autograd)
            _IMPLS = table
    return _IMPLS


def base_name(overload: str) -> str:
    """The op an overload belongs to: ``add_.Tensor`` and ``add.out`` both give ``add``."""
    name = overload.split(".", 1)[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def known_ops() -> tuple[str, ...]:
    """Every name enable() accepts: op names and exact overloads, sorted."""
    overloads = implementations()
    return tuple(sorted({base_name(o) for o in overloads} | set(overloads)))


def resolve_names(names: Iterable[str]) -> frozenset[str]:
    """Turn op names (``"add"``) and overloads (``"add.Tensor"``) into overloads.

    Raises:
        UnknownOpError: a name gemsops does not implement (the message lists close matches).
    """
    overloads = implementations()
    out: set[str] = set()
    for name in names:
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


@attrs.define
class CallRecord:
    """Per aten overload: calls served by gemsops, and calls handed to torch with the reason."""

    served: Counter[str] = attrs.field(factory=Counter)
    fallbacks: Counter[tuple[str, str]] = attrs.field(factory=Counter)

    def fallback_ops(self) -> dict[str, list[str]]:
        """Overload -> the distinct reasons it was handed back to torch."""
        out: dict[str, list[str]] = {}
        for op, reason in self.fallbacks:
            out.setdefault(op, []).append(reason)
        return out


_RECORDS: list[CallRecord] = []


@contextlib.contextmanager
def record() -> Iterator[CallRecord]:
    """Count, inside the block, which aten calls gemsops served and which it handed back."""
    rec = CallRecord()
    _RECORDS.append(rec)
    try:
        yield rec
    finally:
        # By identity: records compare by value, and nested blocks may hold equal ones.
        for i, open_rec in enumerate(_RECORDS):
            if open_rec is rec:
                del _RECORDS[i]
                break


class _Inside(threading.local):
    """Whether this thread is inside a gemsops implementation right now."""

    depth = 0


_INSIDE = _Inside()


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Mark the block as gemsops' own work, as while a served aten call runs.

    Aten calls made inside go straight to torch's kernels, uncounted. The backward of a
    gemsops autograd function (run by autograd, outside any served call) uses it.
    """
    before = _INSIDE.depth
    _INSIDE.depth = before + 1
    try:
        yield
    finally:
        _INSIDE.depth = before


def in_gemsops() -> bool:
    """Whether this thread is running gemsops' own work (a served call, or ``running()``)."""
    return _INSIDE.depth > 0


def _wrap(overload: str, fn: Callable[..., Any], original: Any) -> Callable[..., Any]:
    inside = _INSIDE

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if inside.depth:
            # An aten call made while a gemsops kernel runs comes from the machinery under
            # it (the Triton interpreter copies tensors with torch ops): torch serves it.
            return original.call_boxed(keyset, *args, **kwargs)
        inside.depth = 1
        try:
            out = fn(*args, **kwargs)
        except Unsupported as why:
            inside.depth = 0
            for rec in _RECORDS:
                rec.fallbacks[(overload, why.reason)] += 1
            return original.call_boxed(keyset, *args, **kwargs)
        finally:
            inside.depth = 0
        for rec in _RECORDS:
            rec.served[overload] += 1
        return out

    kernel.__name__ = f"gemsops_{overload.replace('.', '_')}"
    return kernel


@attrs.frozen
class _Active:
    overloads: frozenset[str]
    library: Any = attrs.field(eq=False)
    key: tuple[frozenset[str], frozenset[str] | None]
    skipped: dict[str, str] = attrs.field(factory=dict, eq=False)


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


def _register(overloads: frozenset[str]) -> tuple[Any, frozenset[str], dict[str, str]]:
    impls = implementations()
    backend = gemshal.current_vendor().dispatch_key
    autograd = _autograd_key(backend)
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    served: set[str] = set()
    skipped: dict[str, str] = {}
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
            original = _torch_kernel(name, key)
            if original is None:
                # torch has no kernel here (e.g. _fused_rms_norm_backward on the CPU), yet
                # torch may route to it once gemsops serves its forward: serve it too, and
                # say so plainly for inputs gemsops cannot take.
                original = _NoTorchKernel(name, key)
                skipped[overload] = f"torch has no {key} kernel; gemsops is the only one"
            kernel = _wrap(overload, impls[overload], original)
            library.impl(name, kernel, key, with_keyset=True)  # type: ignore[no-untyped-call]
            served.add(overload)
    return library, frozenset(served), skipped


def enable(*, unused: Iterable[str] = (), include: Iterable[str] | None = None) -> frozenset[str]:
    """Serve aten ops with gemsops kernels at the current vendor's dispatch key.

    Args:
        unused: Op names or overloads to leave to torch, added to the vendor's own list.
        include: If given, only these op names or overloads are served.

    Returns:
        The aten overloads now served.

    Enabling again with the same arguments changes nothing; with other arguments the
    registration is replaced.
    """
    global _ACTIVE
    with _LOCK:
        unused_set = frozenset(unused)
        include_set = None if include is None else frozenset(include)
        key = (unused_set, include_set)
        if _ACTIVE is not None and _ACTIVE.key == key:
            return _ACTIVE.overloads
        overloads = _select(unused_set, include_set)
        disable()
        library, served, skipped = _register(overloads)
        _ACTIVE = _Active(served, library, key, skipped)
        return served


def disable() -> None:
    """Give every aten op back to torch's own kernels."""
    global _ACTIVE
    with _LOCK:
        if _ACTIVE is not None:
            _ACTIVE.library._destroy()
            _ACTIVE = None


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
    *, unused: Iterable[str] = (), include: Iterable[str] | None = None
) -> Iterator[frozenset[str]]:
    """Serve aten ops with gemsops inside the block; leave torch as it was found on exit.

    Nests: leaving an inner block restores the outer block's registration.
    """
    with _LOCK:
        previous = _ACTIVE
        served = enable(unused=unused, include=include)
    try:
        yield served
    finally:
        with _LOCK:
            if previous is None:
                disable()
            elif _ACTIVE is None or _ACTIVE.key != previous.key:
                enable(unused=previous.key[0], include=previous.key[1])
