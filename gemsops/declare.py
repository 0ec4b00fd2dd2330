"""One way to declare an op: :func:`op` binds an implementation to the aten overloads it serves.

An op is declared once, next to its implementation::

    @op("addmm.default", out="addmm.out")
    def addmm(self, mat1, mat2, *, beta=1, alpha=1, out=None) -> Tensor:
        ...

That one line is all gemsops needs: the registry (:func:`gemsops.enable`) serves the
named overloads with it, and ``gemsops.addmm`` is this function. Declarations are found
by importing every module under ``gemsops.ops`` (and the modules plugins name in the
``gemsops.ops`` entry-point group), on first use, after gemshal has picked the device.

**How an overload reaches the implementation.** aten's schema of each overload is read
once, and a small function with exactly the schema's signature (names, defaults,
keyword-only arguments) is generated that calls the implementation by parameter name.
``args`` renames a schema argument (``{"input": "self"}``) or drops it (``None``). Where
the implementation's signature already is the schema's, it is registered as is.

**Derived variants, one writer for each** (``gemsops.ops.outputs``):

* an ``out=`` overload calls the implementation with ``out`` when it takes an ``out``
  parameter (it writes there itself); otherwise the result is computed and copied into
  the ``out`` tensor(s) by ``gemsops.ops.outputs.write_out``, which hands the call to
  torch wherever torch would cast, resize with a warning or raise;
* an in-place overload (``add_.Tensor``) calls the implementation with ``out=self,
  inplace=True`` when it takes an ``inplace`` parameter; otherwise the result is copied
  into ``self`` by ``gemsops.ops.outputs.write_inplace``.

**Per-vendor overrides.** ``vendor="amd"`` (and optionally ``arch="gfx942"``, matched
against the device's arch tag) makes a declaration apply on that vendor only, where it
wins over the portable one for the overloads it names. A plugin declares overrides in a
module it lists under the ``gemsops.ops`` entry-point group; gemsops is not edited.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import keyword
import pkgutil
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from gemsops.errors import GemsopsError

__all__ = ["ENTRY_POINT_GROUP", "Declaration", "DeclarationError", "bind", "declarations",
           "load", "op", "table"]

ENTRY_POINT_GROUP = "gemsops.ops"
"""Entry-point group of plugin modules that declare ops (vendor overrides among them)."""

F = TypeVar("F", bound=Callable[..., Any])


class DeclarationError(GemsopsError, ValueError):
    """An op declaration that cannot be served: a bad overload name, an argument the
    implementation does not take, or two declarations of one overload."""


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str) or name.count(".") != 1 or not all(name.split(".")):
            raise DeclarationError(
                f"{name!r} is not an aten overload name; write 'op.overload', e.g. 'add.Tensor' "
                "or 'mm.default'")
    return names


@attrs.frozen
class Declaration:
    """One declared op: an implementation and the aten overloads it serves.

    Attributes:
        name: The public name (``gemsops.<name>``); the function's name by default.
        fn: The implementation.
        module: The module that declared it.
        overloads: Overloads whose schema the implementation takes directly.
        out: ``out=`` overloads, derived (see the module docstring).
        inplace: In-place overloads, derived.
        args: Schema argument -> implementation parameter (None drops the argument).
        vendor: The vendor this declaration applies on, or None for every vendor.
        arch: The arch tag it applies on (with ``vendor``), or None for every arch.
        public: Whether ``gemsops.<name>`` is this function.
        autograd: Serve at the vendor's autograd key (the function runs its own backward,
            as ``cross_entropy_loss`` does), not at its dispatch key.
    """

    name: str
    fn: Callable[..., Any] = attrs.field(repr=False)
    module: str
    overloads: tuple[str, ...] = ()
    out: tuple[str, ...] = ()
    inplace: tuple[str, ...] = ()
    args: Mapping[str, str | None] = attrs.field(factory=dict, repr=False)
    vendor: str | None = None
    arch: str | None = None
    public: bool = True
    autograd: bool = False

    @property
    def served(self) -> tuple[str, ...]:
        """Every overload this declaration serves, in declaration order."""
        return self.overloads + self.out + self.inplace

    def applies(self, vendor: str, arch: str) -> bool:
        """Whether the declaration is in force on ``vendor`` with arch tag ``arch``."""
        return (self.vendor is None or self.vendor == vendor) and (
            self.arch is None or self.arch == arch)


_LOCK = threading.Lock()
_DECLARED: list[Declaration] = []
_LOADED: set[str] = set()
"""Packages whose modules (and the plugin op modules) :func:`load` has imported."""


def op(*overloads: str, out: str | Iterable[str] = (), inplace: str | Iterable[str] = (),
       name: str | None = None, args: Mapping[str, str | None] | None = None,
       vendor: str | None = None, arch: str | None = None,
       public: bool | None = None, autograd: bool = False) -> Callable[[F], F]:
    """Declare the decorated function as the implementation of aten overloads.

    Args:
        *overloads: Overloads served by calling the function directly, e.g. ``"mm.default"``.
        out: ``out=`` overloads derived from the function, e.g. ``"mm.out"``.
        inplace: In-place overloads derived from the function, e.g. ``"add_.Tensor"``.
        name: The public name (``gemsops.<name>``); the function's ``__name__`` by default.
        args: Schema argument name -> the function's parameter name, or None to drop it.
        vendor: Apply on this vendor only (a per-vendor override).
        arch: With ``vendor``, apply on this arch tag only (``"sm90"``, ``"gfx942"``).
        public: Whether ``gemsops.<name>`` is this function; by default, true for
            portable declarations and false for vendor overrides.

    Returns:
        A decorator that records the declaration and returns the function unchanged.

    Raises:
        DeclarationError: an overload name that is not ``op.overload``, or ``arch``
            without ``vendor``.
    """
    direct, outs, inplaces = _names(overloads), _names(out), _names(inplace)
    if arch is not None and vendor is None:
        raise DeclarationError(f"arch={arch!r} needs a vendor (an arch tag names no vendor)")
    renames = dict(args or {})

    def decorate(fn: F) -> F:
        declared = Declaration(
            name=name or fn.__name__, fn=fn, module=getattr(fn, "__module__", "?"),
            overloads=direct, out=outs, inplace=inplaces, args=renames, vendor=vendor,
            arch=arch, public=(vendor is None) if public is None else public,
            autograd=autograd)
        with _LOCK:
            _DECLARED.append(declared)
        return fn

    return decorate


def declarations() -> tuple[Declaration, ...]:
    """Every declaration made so far, in the order the modules made them."""
    with _LOCK:
        return tuple(_DECLARED)


def load(package: str = "gemsops.ops") -> tuple[Declaration, ...]:
    """Import every module under ``package`` and every plugin op module; their declarations.

    The walk happens once per package; later calls return the declarations at once.

    Plugin modules are the values of the ``gemsops.ops`` entry-point group. A plugin
    module that fails to import raises: a vendor's override silently missing would serve
    the portable kernel where the vendor said it must not.
    """
    with _LOCK:
        if package in _LOADED:
            return tuple(_DECLARED)
    root = importlib.import_module(package)
    for info in sorted(pkgutil.walk_packages(root.__path__, f"{package}."),
                       key=lambda i: i.name):
        importlib.import_module(info.name)
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                     key=lambda e: e.name):
        try:
            importlib.import_module(ep.value.split(":", 1)[0])
        except Exception as exc:
            raise DeclarationError(
                f"plugin op module {ep.value!r} (entry point {ep.name!r} in group "
                f"{ENTRY_POINT_GROUP!r}) failed to import: {exc}") from exc
    with _LOCK:
        _LOADED.add(package)
    return declarations()


def table(decls: Iterable[Declaration], vendor: str,
          arch: str) -> dict[str, tuple[Declaration, Callable[..., Any]]]:
    """Overload -> (declaration, bound callable) for the declarations in force.

    A declaration for ``vendor`` (and ``arch``) wins over a portable one for the same
    overload; an arch-specific one wins over a vendor-wide one.

    Raises:
        DeclarationError: two declarations of equal rank serve one overload.
    """
    chosen: dict[str, tuple[int, Declaration]] = {}
    for decl in decls:
        if not decl.applies(vendor, arch):
            continue
        rank = (decl.vendor is not None) + (decl.arch is not None)
        for overload in decl.served:
            held = chosen.get(overload)
            if held is not None and held[0] == rank:
                raise DeclarationError(
                    f"{overload} is declared twice: by {held[1].module}.{held[1].fn.__name__} "
                    f"and by {decl.module}.{decl.fn.__name__}")
            if held is None or held[0] < rank:
                chosen[overload] = (rank, decl)
    return {overload: (decl, bind(decl, overload))
            for overload, (_, decl) in sorted(chosen.items())}


# --- the shared writer ------------------------------------------------------------


def _schema(overload: str) -> Any:
    import torch

    op_name, variant = overload.split(".")
    try:
        return getattr(getattr(torch.ops.aten, op_name), variant)._schema
    except (AttributeError, RuntimeError) as exc:
        raise DeclarationError(f"torch has no aten overload {overload!r}") from exc


def bind(decl: Declaration, overload: str) -> Callable[..., Any]:
    """The callable the registry serves ``overload`` with: the schema's exact signature,
    forwarding to ``decl.fn`` (see the module docstring for the out= and in-place rules).

    Raises:
        DeclarationError: the overload is not one of ``decl``'s, or the implementation
            lacks a parameter the schema passes.
    """
    if overload in decl.overloads:
        kind = "direct"
    elif overload in decl.out:
        kind = "out"
    elif overload in decl.inplace:
        kind = "inplace"
    else:
        raise DeclarationError(f"{decl.name} does not declare {overload}")
    schema = _schema(overload)
    arguments = list(schema.arguments)
    params = inspect.signature(decl.fn).parameters
    takes = set(params)
    outs = [a.name for a in arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    if kind == "out" and not outs:
        raise DeclarationError(f"{overload} has no out argument; declare it in overloads=")
    if kind == "direct" and _same_signature(arguments, params, decl.args):
        return decl.fn

    signature: list[str] = []
    calls: list[str] = []
    defaults: dict[str, Any] = {"_fn": decl.fn}
    star = False
    for index, arg in enumerate(arguments):
        pname = arg.name if not keyword.iskeyword(arg.name) else f"{arg.name}_"
        if keyword.iskeyword(arg.name) and arg.kwarg_only:
            raise DeclarationError(f"{overload}: keyword-only argument {arg.name!r} is a "
                                   "Python keyword")
        if arg.kwarg_only and not star:
            signature.append("*")
            star = True
        if arg.has_default_value():
            defaults[f"_d{index}"] = arg.default_value
            signature.append(f"{pname}=_d{index}")
        else:
            signature.append(pname)
        if kind == "out" and arg.name in outs and "out" not in takes:
            continue  # written by the shared writer below
        target = decl.args.get(arg.name, arg.name)
        if index == 0 and target not in takes and params and target == arg.name:
            target = next(iter(params))  # the first argument may go by any name (x, input)
        if kind == "out" and arg.name in outs and len(outs) == 1:
            target = "out"
        if target is None:
            continue
        if target not in takes and not _takes_kwargs(params):
            raise DeclarationError(
                f"{decl.module}.{decl.fn.__name__} serves {overload} but has no parameter "
                f"{target!r} (schema argument {arg.name!r}); rename it with "
                f"args={{{arg.name!r}: ...}} or drop it with None")
        calls.append(f"{target}={pname}")
    tensor_args = [a.name for a in arguments
                   if a.name not in outs and "Tensor" in str(a.type)
                   and "[]" not in str(a.type)]
    call = f"_fn({', '.join(calls)})"
    if kind == "inplace":
        self_name = arguments[0].name
        if "inplace" in takes:
            call = f"_fn({', '.join([*calls, f'out={self_name}', 'inplace=True'])})"
            body = f"return {call}"
        else:
            defaults["_write"] = _import_writer("write_inplace")
            body = f"return _write({self_name}, {call})"
    elif kind == "out" and "out" not in takes:
        inputs = "".join(f", {n}" for n in tensor_args)
        if len(outs) == 1:
            defaults["_write"] = _import_writer("write_out")
            body = f"return _write({outs[0]}, {call}{inputs})"
        else:
            defaults["_write"] = _import_writer("write_outs")
            body = f"return _write(({', '.join(outs)},), {call}{inputs})"
    else:
        body = f"return {call}"
    fname = overload.replace(".", "__")
    source = f"def {fname}({', '.join(signature)}):\n    {body}\n"
    namespace: dict[str, Any] = dict(defaults)
    exec(compile(source, f"<gemsops.declare {overload}>", "exec"), namespace)
    bound: Callable[..., Any] = namespace[fname]
    bound.__doc__ = f"aten {overload}, served by {decl.module}.{decl.fn.__name__}."
    bound.__qualname__ = fname
    bound.__module__ = decl.module
    return bound


def _import_writer(name: str) -> Callable[..., Any]:
    from gemsops.ops import outputs

    writer: Callable[..., Any] = getattr(outputs, name)
    return writer


def _takes_kwargs(params: Mapping[str, inspect.Parameter]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _same_signature(arguments: list[Any], params: Mapping[str, inspect.Parameter],
                    renames: Mapping[str, str | None]) -> bool:
    """Whether the implementation takes the schema's arguments as the dispatcher passes them
    (same names in the same order, keyword-only where the schema's are, defaults alike)."""
    if renames or len(arguments) != len(params):
        return False
    for arg, param in zip(arguments, params.values(), strict=True):
        want = (inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if param.name != arg.name or param.kind is not want:
            return False
        if arg.has_default_value():
            if param.default is inspect.Parameter.empty or param.default != arg.default_value:
                return False
        elif param.default is not inspect.Parameter.empty:
            return False
    return True
