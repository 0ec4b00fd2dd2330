"""``torch.compile(model, backend="gemsops")``: Inductor, with gemsops' kernels for the ops kept.

The backend compiles with Inductor. After AOT autograd has traced the forward and
backward graphs (aten ops), each call of an aten overload in the *keep* set is replaced
by a call of a ``gemsops::`` op with the same schema, whose kernel is gemsops' (handing
an input it cannot take to torch's kernel, as a served call does). Inductor cannot see
into those ops, so it calls them as extern kernels and fuses the pointwise ops around
them; everything else it generates itself. Kept overloads are taken out of Inductor's
decomposition table so that they reach the graph whole.

Which overloads to keep is an option: ``torch.compile(m, backend="gemsops",
options={"keep": ["mm", "bmm"]})`` (op names or overloads, as :func:`gemsops.enable`
takes them; the other options go to Inductor's config). ``mode="reduce-overhead"``
adds CUDA graphs as with Inductor; with ``keep`` it goes into the options
(``options={"keep": [...], "mode": "reduce-overhead"}``), as ``torch.compile`` takes
``mode=`` or ``options=``, not both. :data:`DEFAULT_KEEP` is the set kept without the
option. Only overloads that write no argument and return tensors only can be kept;
:func:`kept_op` says why another cannot.

What ran: :func:`gemsops.record` counts the kept ops' calls inside compiled code (as
``served``, or as a fallback with its reason), except under a CUDA graph replay, where
no Python runs; :func:`graphs` lists, for every graph this backend compiled, the kept
overloads it calls and how often.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import torch

import gemshal
from gemsops import registry
from gemsops.errors import GemsopsError

__all__ = ["DEFAULT_KEEP", "CompiledGraph", "compile_backend", "graphs", "kept_op"]

DEFAULT_KEEP: frozenset[str] = frozenset()
"""Overloads kept when ``options`` names none: the ones whose kernels measured faster than
Inductor's own in a compiled model step. None yet: on the H200, keeping every keepable
overload made 4-layer Llama, GPT-2, BERT and ViT steps 1.2-3.0x Inductor's, and on an
H100 keeping the matmuls alone made them 1.00-2.48x with ``mode="reduce-overhead"``
(docs/compile.md)."""

_LIB_NAME = "gemsops"
_lock = threading.Lock()
_library: Any = None
_kept: dict[str, torch._ops.OpOverload] = {}


@attrs.frozen
class CompiledGraph:
    """One graph the backend handed to Inductor."""

    name: str
    """``forward``, ``backward`` or ``inference`` (and a number when there are several)."""
    kept: dict[str, int]
    """aten overload -> how many calls of it in the graph now go to gemsops' kernel."""
    left: dict[str, int]
    """Overloads gemsops implements that stayed with Inductor (not kept), with counts."""


_graphs: list[CompiledGraph] = []


def graphs() -> list[CompiledGraph]:
    """Every graph :func:`compile_backend` compiled in this process, oldest first."""
    return list(_graphs)


def _overload_name(op: torch._ops.OpOverload) -> str:
    """``aten.mm.default`` -> ``mm.default``, as gemsops' tables spell overloads."""
    return f"{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


def _why_not(schema: Any) -> str | None:
    if schema.is_mutable:
        return "it writes an argument"
    for ret in schema.returns:
        if ret.alias_info is not None:
            return "it returns a view of an argument"
        if not isinstance(ret.type, torch.TensorType):
            return f"it returns a {ret.type}, not a tensor"
    return None


def kept_op(overload: str) -> torch._ops.OpOverload:
    """The ``gemsops::`` op that stands for the aten ``overload`` in a compiled graph.

    Defined on first use, with the aten overload's schema; its kernel at the vendor's
    dispatch key is gemsops' served kernel, and its fake (shape) function is the aten
    overload's own.

    Raises:
        UnknownOpError: gemsops implements no such overload.
        GemsopsError: it cannot stand in a graph (it writes an argument, returns a view
            or something other than tensors).
    """
    impls = registry.implementations()
    if overload not in impls:
        registry.resolve_names([overload])  # an unknown name raises UnknownOpError here
        raise GemsopsError(f"kept_op takes one overload (say 'mm.default'), not the op "
                           f"name {overload!r}")
    with _lock:
        op = _kept.get(overload)
        if op is not None:
            return op
        aten = registry.aten_overload(overload)
        why = _why_not(aten._schema)
        if why is not None:
            raise GemsopsError(f"aten::{overload} cannot be kept in a compiled graph: {why}")
        return _define(overload, aten, impls[overload])


def _define(overload: str, aten: torch._ops.OpOverload,
            impl: Callable[..., Any]) -> torch._ops.OpOverload:
    global _library
    if _library is None:
        _library = torch.library.Library(_LIB_NAME, "FRAGMENT")  # type: ignore[no-untyped-call]
    name = overload.replace(".", "_")
    text = str(aten._schema)
    _library.define(name + text[text.index("("):])
    key = gemshal.current_vendor().dispatch_key
    kernel, _alone = registry.served_kernel(overload, impl, key)
    _library.impl(name, kernel, key, with_keyset=True)

    def fake(*args: Any, **kwargs: Any) -> Any:
        return aten(*args, **kwargs)

    torch.library.register_fake(f"{_LIB_NAME}::{name}", fake, lib=_library)
    op: torch._ops.OpOverload = getattr(getattr(torch.ops, _LIB_NAME), name).default
    _kept[overload] = op
    return op


def _resolve_keep(keep: Iterable[str] | str | None) -> dict[torch._ops.OpOverload, str]:
    """aten op -> overload name for every overload to keep (those that cannot stand in a
    graph are skipped when they came from an op name, refused when named exactly)."""
    if keep is None:
        names: frozenset[str] = DEFAULT_KEEP
    else:
        names = registry.resolve_names(keep)
    exact = set() if keep is None else {k for k in ((keep,) if isinstance(keep, str) else keep)
                                        if "." in k}
    out: dict[torch._ops.OpOverload, str] = {}
    for overload in sorted(names):
        aten = registry.aten_overload(overload)
        why = _why_not(aten._schema)
        if why is not None:
            if overload in exact:
                raise GemsopsError(
                    f"aten::{overload} cannot be kept in a compiled graph: {why}")
            continue
        out[aten] = overload
    return out


def _swap(gm: torch.fx.GraphModule, keep: dict[torch._ops.OpOverload, str],
          name: str) -> CompiledGraph:
    """Point every call of a kept aten overload in ``gm`` at its ``gemsops::`` op."""
    implemented = registry.implementations()
    kept: Counter[str] = Counter()
    left: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        overload = keep.get(node.target)
        if overload is not None:
            node.target = kept_op(overload)
            kept[overload] += 1
        elif node.target.namespace == "aten":
            spelled = _overload_name(node.target)
            if spelled in implemented:
                left[spelled] += 1
    gm.recompile()
    return CompiledGraph(name, dict(sorted(kept.items())), dict(sorted(left.items())))


def compile_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                    mode: str | None = None,
                    options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The ``gemsops`` dynamo backend (see the module docstring).

    Args:
        gm: The graph dynamo captured.
        example_inputs: Its inputs.
        mode: As ``torch.compile``'s for Inductor (``"reduce-overhead"``: CUDA graphs).
        options: ``keep`` (op names or overloads to serve with gemsops' kernels;
            default :data:`gemsops.compiler.DEFAULT_KEEP`); ``mode``, as the argument
            (``torch.compile`` refuses ``mode=`` beside ``options=``); any other key is
            an Inductor config setting.
    """
    from torch._functorch import config as functorch_config
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    options = dict(options or {})
    keep = _resolve_keep(options.pop("keep", None))
    if "mode" in options:  # torch.compile takes mode= or options=, not both
        if mode is not None:
            raise GemsopsError("give the mode once: mode= or options['mode'], not both")
        mode = options.pop("mode")
    patches = {**list_mode_options(mode or "default"), **options}
    decompositions = {op: fn for op, fn in select_decomp_table().items() if op not in keep}
    count = Counter[str]()

    def inner(graph: torch.fx.GraphModule, inputs: Sequence[Any], **kwargs: Any) -> Any:
        kind = "backward" if kwargs.get("is_backward") else (
            "inference" if kwargs.get("is_inference") else "forward")
        count[kind] += 1
        label = kind if count[kind] == 1 else f"{kind} {count[kind]}"
        _graphs.append(_swap(graph, keep, label))
        return compile_fx_inner(graph, inputs, **kwargs)

    # AOT autograd's cache sits above inner_compile and its key does not see the graph
    # pass: it would hand back a graph compiled with another keep set (or by Inductor
    # alone). Inductor's own cache, inside compile_fx_inner, keys the swapped graph.
    with functorch_config.patch(enable_autograd_cache=False):
        compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
            gm, example_inputs, inner_compile=inner, config_patches=patches,
            decompositions=decompositions)
    return compiled
