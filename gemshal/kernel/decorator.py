"""``@kernel``: one decorator for a Triton kernel, its tuning entry and its launch.

It goes above ``@triton.jit`` and names the op's tuning entry instead of listing
configs::

    @kernel("softmax_rows", key=["M", "N"])
    @triton.jit
    def _softmax_rows_kernel(X, OUT, M, N, ..., BLOCK_M: tl.constexpr, ...): ...

    _softmax_rows_kernel[grid](x, out, m, n, ..., **consts)

**One key per call.** A launch computes one tuple: the direct launcher's cheap key
(:mod:`gemshal.kernel.launcher`: dtypes, alignment and integer classes, the constant
keywords by identity, the current device) extended by the size buckets of the key
arguments and the exact values of the arguments the heuristic rules read. A hit goes
straight to the compiled kernel. A miss resolves everything once: the tuning entry
(read once per tuning generation), the config for the bucket (see
:mod:`gemshal.kernel.plan` for the tables-first policy), the heuristic keywords (the
entry's ``heuristics`` table, then the Python ``rules`` given here), the compile, and
the launcher's entry.

**Rules** see the kernel's key arguments, its constant keywords, the config's values and
the rules computed before them; a Python rule reading anything else is an error naming
it (its value would not be part of the key).

**The device guard** belongs here too: when the first tensor argument lives on a device
other than the current one, the launch runs under :func:`gemshal.device_guard`; op code
needs no guard of its own.

**Progress.** A miss that takes more than half a second (a compile Triton's cache did
not hold, or a benchmark) writes one line on stderr while it runs, when stderr is a
terminal or ``GEMS_PROGRESS=1`` (``GEMS_PROGRESS=0`` silences it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import Any

import torch

from gemshal import _record, _triton
from gemshal import tune as _tune
from gemshal.errors import ConfigError
from gemshal.kernel import compile as _compile
from gemshal.kernel import launcher as _launcher
from gemshal.kernel import plan as _plan
from gemshal.tune_format import OpTuning, TuneConfig
from gemshal.tune_values import LAUNCH_KEYS

__all__ = [
    "PROGRESS_ENV",
    "Kernel",
    "Prepared",
    "Recording",
    "Rule",
    "choices",
    "kernel",
    "recording",
    "tuned",
]

Rule = Callable[[Mapping[str, Any]], Any]
# A Python heuristic: {name: value} of the key arguments, constants and config -> the
# keyword's value.

PROGRESS_ENV = "GEMS_PROGRESS"
_PRUNE_KEYS = ("early_config_prune", "perf_model", "top_k")
_PROGRESS_AFTER = 0.5


def _progress_on() -> bool:
    raw = os.environ.get(PROGRESS_ENV, "").strip()
    if raw == "":
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    if raw in ("0", "1"):
        return raw == "1"
    raise ConfigError(
        f"{PROGRESS_ENV} must be 0 (no progress lines), 1 (progress lines on stderr) or "
        f"unset (progress lines when stderr is a terminal); got {raw!r}"
    )


class _Progress:
    """A line on stderr while a slow step runs (printed only if it passes half a second)."""

    compiled = 0

    def __init__(self, what: Callable[[], str]) -> None:
        self._what = what
        self.what = ""
        self.shown = False
        self.start = time.perf_counter()
        self.timer: threading.Timer | None = None
        if _progress_on():
            self.timer = threading.Timer(_PROGRESS_AFTER, self._show)
            self.timer.daemon = True
            self.timer.start()

    def _show(self) -> None:
        self.what = self._what()
        self.shown = True
        sys.stderr.write(f"gemshal: {self.what} ...\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.shown:
            _Progress.compiled += 1
            took = time.perf_counter() - self.start
            sys.stderr.write(
                f"gemshal: {self.what}: {took:.1f} s ({_Progress.compiled} slow "
                f"preparations so far)\n"
            )
            sys.stderr.flush()


def _check_names(param: str, names: Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise TypeError(f"{param} must be a list of argument names such as [{names!r}], not a str")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"{param} names {', '.join(map(repr, unknown))}, not arguments of the kernel; "
            f"its arguments are {', '.join(valid)}"
        )
    return tuple(names)


def _dtype_name(args: tuple[Any, ...]) -> str | None:
    for value in args:
        dtype = getattr(value, "dtype", None)
        if isinstance(dtype, torch.dtype):
            return str(dtype).removeprefix("torch.")
    return None


class _Restricted(dict[str, Any]):
    """What a Python rule may read; a missing name is a ConfigError naming it."""

    def __init__(self, values: Mapping[str, Any], owner: str) -> None:
        super().__init__(values)
        self.owner = owner

    def __missing__(self, name: str) -> Any:
        raise ConfigError(
            f"{self.owner}: reads {name!r}, which is not a key argument, constant keyword or "
            f"config value of the launch (rules may read only those: add it to key=)"
        )


class _Choice:
    """The config one bucket launches with, and how it was found."""

    __slots__ = ("dtype", "how", "meta", "when")

    def __init__(
        self, when: dict[str, Any], dtype: str | None, meta: dict[str, Any], how: str
    ) -> None:
        self.when = when
        self.dtype = dtype
        self.meta = meta
        self.how = how


class _State:
    """How a kernel launches under one tuning generation (made on the first launch)."""

    __slots__ = (
        "bucket_index",
        "built",
        "choices",
        "configs",
        "file_rules",
        "fulls",
        "generation",
        "interpreted",
        "launcher",
        "pending",
        "pinned",
        "policy",
        "raw_index",
        "rules",
        "table",
        "too_big",
        "tuner",
        "tuning",
        "where",
    )

    def __init__(self) -> None:
        self.generation = -1
        self.tuning: OpTuning | None = None
        self.configs: tuple[TuneConfig, ...] = ()
        self.table: tuple[Any, ...] = ()
        self.pinned: dict[str, Any] | None = None
        self.policy = "tables"
        self.rules: tuple[tuple[str, Rule], ...] = ()
        self.file_rules: frozenset[str] = frozenset()
        self.where: dict[str, str] = {}
        self.bucket_index: tuple[int, ...] = ()
        self.raw_index: tuple[int, ...] = ()
        self.launcher: _launcher.Launcher | None = None
        self.choices: dict[tuple[Any, ...], _Choice] = {}
        self.fulls: dict[tuple[Any, ...], tuple[Mapping[str, Any], dict[str, Any]]] = {}
        self.too_big: set[tuple[Any, ...]] = set()
        self.pending: dict[Any, Future[Any]] = {}
        self.built: set[Any] = set()
        self.tuner: Any = None
        self.interpreted = False


Recording = _record.Recording


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Inside the block, this thread's kernel launches are appended to the yielded
    :class:`Recording` (other threads' are not). Blocks on one thread nest: an inner
    block's launches are appended to the outer one's too when it ends, so an outer
    block sees every launch made inside it.

    gemsops' replay memos use it to learn, from one call, the launches an op makes.
    """
    ident = threading.get_ident()
    before = _record.RECORDERS.get(ident)
    rec = Recording()
    _record.RECORDERS[ident] = rec
    try:
        yield rec
    finally:
        if before is None:
            _record.RECORDERS.pop(ident, None)
        else:
            before.launches.extend(rec.launches)
            before.scratch = before.scratch or rec.scratch
            _record.RECORDERS[ident] = before


class Prepared:
    """A kernel's launch made ready to repeat (:meth:`Kernel.prepare`): a call whose
    arguments have the same kind as the prepared one's goes straight to the compiled
    kernel, without the launch key, the bucket or the lookup."""

    __slots__ = ("_ready", "_state")

    def __init__(self, state: _State, ready: _launcher.Ready) -> None:
        self._state = state
        self._ready = ready

    def fire(self, args: tuple[Any, ...]) -> bool:
        """Launch with ``args``; False (nothing launched) when the preparation no longer
        holds: the tuning changed, the launcher's entries were dropped, a launch hook
        was installed, another device is current, or this thread is recording
        (:func:`recording`). Then launch the usual way."""
        if self._state.generation != _tune._GENERATION:
            return False
        if _record.RECORDERS and threading.get_ident() in _record.RECORDERS:
            return False  # launch the usual way, so the recording sees it
        return self._ready.fire(args)


class Kernel:
    """A ``@triton.jit`` function with its op's tuning entry; made by :func:`kernel`."""

    def __init__(
        self,
        fn: Any,
        op: str,
        key: Sequence[str],
        rules: Mapping[str, Rule],
        prune: Mapping[str, Any] | None,
        reset_to_zero: Sequence[str],
        restore_value: Sequence[str],
        categories: Sequence[str] = (),
    ) -> None:
        names = getattr(fn, "arg_names", None)
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"gemshal.kernel.kernel decorates a @triton.jit function; got {fn!r}")
        self.fn = fn
        self.op = op
        self.arg_names: tuple[str, ...] = tuple(names)
        self.keys = _check_names("key", key, self.arg_names)
        outside = [n for n in categories if n not in self.keys]
        if outside:
            raise ValueError(
                f"categories names {', '.join(map(repr, outside))}, not in the kernel's key "
                f"({', '.join(self.keys) or 'empty'}); a category is a key value"
            )
        self.categories = frozenset(categories)
        self.reset_to_zero = _check_names("reset_to_zero", reset_to_zero, self.arg_names)
        self.restore_value = _check_names("restore_value", restore_value, self.arg_names)
        valid = [*self.arg_names, *LAUNCH_KEYS]
        _check_names("rules", list(rules), valid)
        for name, rule in rules.items():
            if not callable(rule):
                raise TypeError(f"rule {name!r} must be callable (args -> value); got {rule!r}")
        self.rules = dict(rules)
        self.prune = dict(prune) if prune else None
        self.defer = True
        """Whether a first launch may compile in the background (:func:`kernel`)."""
        self.__name__ = getattr(fn, "__name__", op)
        self._state = _State()
        self._lock = threading.RLock()
        _KERNELS.add(self)

    def __repr__(self) -> str:
        return f"<Kernel op={self.op!r} fn={self.__name__}>"

    # --- launch syntax ---------------------------------------------------------------

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """Launch syntax: ``kernel[grid](*args, **kwargs)``; grid is a tuple or ``f(meta)``."""
        # No keywords: one shared empty dict, so the launch key sees the same object.
        return lambda *args, **kwargs: self.launch(grid, args, kwargs or _NO_KEYWORDS)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        """Launch (or, with ``warmup``, only compile) the kernel, as ``JITFunction.run``."""
        if warmup:
            return self._warmup(grid, args, kwargs)
        return self.launch(grid, args, kwargs)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        """Compile without launching; arguments may be dtypes, as in Triton."""
        return self._warmup(grid, tuple(map(_triton.mock_dtype, args)), kwargs)

    def launch(self, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Launch with the arguments as a tuple and the constant keywords as a dict.

        Callers keep one ``kwargs`` dict per constant set and never change it: the key
        remembers it by identity.
        """
        if _record.RECORDERS:
            recorder = _record.RECORDERS.get(threading.get_ident())
            if recorder is not None:
                recorder.launches.append((self, grid, args, kwargs))
        state = self._state
        if state.generation != _tune._GENERATION:
            state = self._resolve()
        n = len(args)
        # A positive int's half-octave bucket (plan.bucket) as a code, inline (no call):
        # its bit length and its top two bits (10: at most 3/4 of the power of two).
        extra = (
            state,
            *[
                (((v - 1) >> (b - 2) if b > 1 else v) | b << 2)
                if type(v) is int and v > 0 and (b := (v - 1).bit_length()) >= 0
                else v
                for v in [args[i] for i in state.bucket_index if i < n]
            ],
            *[args[i] for i in state.raw_index if i < n],
        )
        launcher = state.launcher
        if launcher is not None:
            device, key, entry = launcher.lookup(args, kwargs, extra)
            if entry is not None and entry.verified:
                # The guard check: the first argument's device (a parameter is a
                # Tensor subclass, so isinstance, not a type test).
                first = args[0] if n else None
                if not isinstance(first, torch.Tensor) or first.get_device() in (device, -1):
                    return launcher.fire(entry, grid, args, device)
            return self._slow(state, grid, args, kwargs, extra, device, key, entry)
        return self._slow(state, grid, args, kwargs, extra, -1, None, None)

    def prepare(
        self, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Prepared | None:
        """The launch just made with these arguments, ready to repeat (:class:`Prepared`),
        or None when it is not on the direct path yet (compiling, its entry not yet
        checked, the interpreter, the direct path off). Callers pass the same ``grid``,
        integers and ``kwargs`` object, and tensors of the same dtypes and alignment, to
        each later :meth:`Prepared.fire`.
        """
        state = self._state
        launcher = state.launcher
        if launcher is None or state.generation != _tune._GENERATION:
            return None
        n = len(args)
        # A positive int's half-octave bucket (plan.bucket) as a code, inline (no call):
        # its bit length and its top two bits (10: at most 3/4 of the power of two).
        extra = (
            state,
            *[
                (((v - 1) >> (b - 2) if b > 1 else v) | b << 2)
                if type(v) is int and v > 0 and (b := (v - 1).bit_length()) >= 0
                else v
                for v in [args[i] for i in state.bucket_index if i < n]
            ],
            *[args[i] for i in state.raw_index if i < n],
        )
        ready = launcher.ready(grid, args, kwargs, extra)
        return None if ready is None else Prepared(state, ready)

    def _slow(
        self,
        state: _State,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: tuple[Any, ...],
        device: int,
        key: tuple[Any, ...] | None,
        entry: Any,
    ) -> Any:
        # Every launch but a verified hit on the current device: the device guard, then
        # the miss path (choose, compute, compile, make or check the launcher's entry).
        first = args[0] if args else None
        if isinstance(first, torch.Tensor):
            index = first.get_device()
            if index >= 0:
                if device < 0:
                    from gemshal.device import device_module

                    device = int(device_module().current_device())
                if index != device:
                    from gemshal.device import device_guard

                    with device_guard(first.device):
                        return self.launch(grid, args, kwargs)
        return self._miss(state, grid, args, kwargs, extra, device, key, entry)

    # --- resolution ------------------------------------------------------------------

    def _resolve(self) -> _State:
        with self._lock:
            generation = _tune._GENERATION
            if self._state.generation == generation:
                return self._state
            state = _State()
            state.policy = _plan.policy()  # read everywhere, so a bad value always fails
            context = _tune.current_context()
            tuning = _tune.lookup(self.op, context=context)
            self._check(tuning, context.extra_launch_keys)
            state.tuning = tuning
            state.configs = tuning.configs
            state.table = tuning.table
            state.interpreted = context.interpreter
            if context.interpreter or _launcher.stubbed():
                pinned = tuning.pinned
                assert pinned is not None  # _check() ensured configs exist
                # The interpreter runs each program in Python: one small config is
                # plenty, and launch keywords mean nothing there.
                state.pinned = dict(pinned.meta) if context.interpreter else _meta(pinned)
            elif len(tuning.configs) == 1:
                state.pinned = _meta(tuning.configs[0])
            rules, where, reads = self._rules(tuning, context.extra_launch_keys)
            state.rules, state.where = rules, where
            state.file_rules = frozenset(r.name for r in tuning.heuristics)
            index = {name: i for i, name in enumerate(self.arg_names)}
            key_index = tuple(index[k] for k in self.keys)
            raw = tuple(sorted({index[r] for r in reads if r in index}))
            state.raw_index = raw
            state.bucket_index = tuple(i for i in key_index if i not in raw)
            state.launcher = _launcher.launcher_for(self.fn)
            if state.launcher is not None:
                state.launcher.clear()  # entries hold the previous generation's configs
            state.generation = generation
            self._state = state
            return state

    def _check(self, tuning: OpTuning, extra_keys: Sequence[str]) -> None:
        if not tuning.configs:
            raise ConfigError(
                f"{tuning.location}: lists no configs; a gemshal kernel needs 'configs' or 'grid'"
            )
        valid = set(self.arg_names)
        everything = [
            *tuning.configs,
            *([tuning.interpreter] if tuning.interpreter else []),
            *(row.config for row in tuning.table),
        ]
        for config in everything:
            for name, _value in config.meta:
                if name not in valid:
                    raise ConfigError(
                        f"{tuning.location}: key {name!r} is not an argument of kernel "
                        f"{self.__name__!r}; its arguments are {', '.join(self.arg_names)}"
                    )
        for i, row in enumerate(tuning.table):
            for name, _value in row.when:
                if name not in self.keys:
                    raise ConfigError(
                        f"{tuning.location} key 'table' row {i}: {name!r} is not in the "
                        f"kernel's key; its key is {', '.join(self.keys) or '(empty)'}"
                    )

    def _rules(
        self, tuning: OpTuning, extra_keys: Sequence[str]
    ) -> tuple[tuple[tuple[str, Rule], ...], dict[str, str], set[str]]:
        valid = [*self.arg_names, *LAUNCH_KEYS, *extra_keys]
        rules: dict[str, Rule] = {}
        where: dict[str, str] = {}
        reads: set[str] = set()
        for rule in tuning.heuristics:
            for name in sorted({rule.name} | rule.references()):
                if name not in valid:
                    raise ConfigError(
                        f"{tuning.location} heuristics key {rule.name!r}: {name!r} is not an "
                        f"argument or launch keyword of the kernel; valid: {', '.join(valid)}"
                    )
            rules[rule.name] = rule.compile()
            where[rule.name] = f"{tuning.location} heuristics key {rule.name!r}"
            reads |= rule.references()
        # File rules run first, so Python rules can read what they compute; a file rule
        # replaces a Python one of the same name (files override per device).
        for name, fn in self.rules.items():
            if name not in rules:
                rules[name] = fn
                where[name] = f"kernel {self.__name__!r} rule {name!r}"
                reads |= set(self.keys)
        return tuple(rules.items()), where, reads

    # --- a miss: choose, compute, compile ----------------------------------------------

    def _when(
        self, state: _State, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        n = len(args)
        out: dict[str, Any] = {}
        for name in self.keys:
            i = self.arg_names.index(name)
            value = args[i] if i < n else kwargs.get(name)
            out[name] = _plan.bucket(value)
        return out

    def _named(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        named = dict(zip(self.arg_names, args, strict=False))
        named.update(kwargs)
        return named

    def _pruned(
        self, state: _State, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> list[TuneConfig]:
        prune = (self.prune or {}).get("early_config_prune")
        configs = list(state.configs)
        if prune is None:
            return configs
        triton_configs = [c.to_triton() for c in configs]
        kept = prune(triton_configs, self._named(args, kwargs), **kwargs)
        ids = {id(c) for c in kept}
        return [c for c, t in zip(configs, triton_configs, strict=True) if id(t) in ids] or configs

    def _choose(
        self, state: _State, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], _Choice | None, list[TuneConfig]]:
        """(choice key, the choice made for it or None, configs to try in order)."""
        when = self._when(state, args, kwargs)
        dtypes = tuple(a.dtype for a in args if hasattr(a, "dtype"))
        ckey = (*when.values(), *dtypes)
        chosen = state.choices.get(ckey)
        if chosen is not None:
            return ckey, chosen, []
        dtype = _dtype_name(args)
        if state.pinned is not None:
            choice = _Choice(when, dtype, state.pinned, "pinned")
            state.choices[ckey] = choice
            return ckey, choice, []
        if state.policy == "first":
            row, exact = None, False  # every bucket: the first config the pruning keeps
        else:
            row, exact = _plan.nearest_row(state.table, when, dtype, self.categories)
        if state.policy == "all" or (state.policy == "uncovered" and not exact):
            return ckey, None, []  # benchmark
        order = _plan.config_order(
            self._pruned(state, args, kwargs), row.config if row is not None else None
        )
        how = "table" if exact else ("nearest" if row is not None else "first")
        return ckey, _Choice(when, dtype, {}, how), order

    def _compute(
        self,
        state: _State,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        meta: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The complete keywords of a launch: the caller's, the config's and the rules'."""
        full = {**kwargs, **meta}
        if not state.rules:
            return full
        keys = set(self.keys)
        visible = {n: v for n, v in zip(self.arg_names, args, strict=False) if n in keys}
        visible.update(full)
        name = ""
        try:
            for name, rule in state.rules:
                if name in self.rules and name not in state.file_rules:
                    value = rule(_Restricted(visible, state.where[name]))
                else:
                    value = rule({**self._named(args, kwargs), **visible})
                visible[name] = full[name] = value
        except KeyError as exc:
            raise ConfigError(
                f"{state.where.get(name, name)}: reads {exc.args[0]!r}, which this launch did "
                "not pass"
            ) from None
        return full

    def _miss(
        self,
        state: _State,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: tuple[Any, ...],
        device: int,
        key: tuple[Any, ...] | None,
        entry: Any,
    ) -> Any:
        memo = (id(kwargs), extra)
        hit = state.fulls.get(memo)
        if hit is not None and hit[0] is kwargs:
            return self._fire(state, grid, args, hit[1], device, key, entry, False)
        if entry is None and self.defer and _compile.SCOPE.defer and _compile.may_defer():
            self._defer(state, grid, args, kwargs, extra)
        ckey, choice, order = self._choose(state, args, kwargs)
        if choice is None:
            return self._benchmark(state, ckey, grid, args, kwargs)
        if choice.meta or not order:
            full = self._compute(state, args, kwargs, choice.meta)
            result = self._fire(state, grid, args, full, device, key, entry, True)
            self._remember(state, memo, kwargs, full)
            return result
        # First launch at this bucket: the preferred config, else the next that the
        # device can run (a table row tuned for another dtype may not fit this one).
        too_big = _triton.out_of_resources()
        dtypes = tuple(getattr(a, "dtype", None) for a in args)
        for i, config in enumerate(order):
            meta = _meta(config)
            mark = (config.identity(), dtypes)
            last = i == len(order) - 1
            if mark in state.too_big and not last:
                continue
            full = self._compute(state, args, kwargs, meta)
            try:
                result = self._fire(state, grid, args, full, device, key, entry, True)
            except too_big:
                state.too_big.add(mark)
                if last:
                    raise
                continue
            choice.meta = meta
            state.choices[ckey] = choice
            self._remember(state, memo, kwargs, full)
            return result
        raise ConfigError(f"tuning entry {self.op!r}: no config to launch")

    def _defer(
        self,
        state: _State,
        grid: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: tuple[Any, ...],
    ) -> None:
        """Raise KernelCompiling while this launch's kernel compiles on the pool (started
        here on its first launch); return when it has been compiled, or when it cannot be
        compiled off this thread (then the caller's path compiles, or raises the error).

        Compiles are told apart by value (the call's bucket and rule inputs, its dtypes and
        keywords), not by the launcher's key: a call whose keywords come in a new dict each
        time would otherwise start a compile, and be handed back, on every call. A call
        whose compile is done costs one such key and a set lookup here.
        """
        if state.interpreted and not _compile.holding():
            return  # nothing to compile
        vkey = (extra, tuple(getattr(a, "dtype", None) for a in args), _frozen(kwargs))
        if vkey in state.built:
            return
        future = state.pending.get(vkey)
        if future is not None and _compile.lost(future):
            future = None  # started before this process was forked: start it again
        if future is not None:
            if not future.done():
                raise _compile.KernelCompiling(self.op, self._what(state, args, kwargs))
            del state.pending[vkey]
            state.built.add(vkey)
            return  # compiled: launching finds it in Triton's cache (or fails as it did)
        _ckey, choice, order = self._choose(state, args, kwargs)
        if choice is None:
            state.built.add(vkey)
            return  # benchmarked: that times launches, so it runs here
        if choice.meta:
            meta: Mapping[str, Any] = choice.meta
        else:
            dtypes = tuple(getattr(a, "dtype", None) for a in args)
            fits = [c for c in order if (c.identity(), dtypes) not in state.too_big]
            meta = _meta((fits or order)[0])
        full = self._compute(state, args, kwargs, meta)
        what = self._what(state, args, full)
        # hold() under the interpreter defers too, with nothing to compile
        build = _nothing if state.interpreted else self._builder(grid, args, full, what)
        idle = not state.interpreted and _compile.pending() == 0
        future = _compile.submit(build)
        state.pending[vkey] = future
        if idle and _compile.settle(future):
            # No other compile was running and this one was quick (Triton's disk cache
            # had it): launch it now rather than hand the call back.
            del state.pending[vkey]
            state.built.add(vkey)
            return
        raise _compile.KernelCompiling(self.op, what)

    def _builder(
        self, grid: Any, args: tuple[Any, ...], full: Mapping[str, Any], what: str | None
    ) -> Callable[[], None]:
        """A function compiling one launch's kernel without launching it, on the launch's
        device (it runs on a pool thread), with a progress line naming ``what`` (None:
        no line)."""
        fn = self.fn
        where = next((a.device for a in args if isinstance(a, torch.Tensor)), None)

        def compile_only() -> None:
            _compile.prewarmed()
            if where is not None and where.type != "cpu":
                from gemshal.device import device_guard

                with device_guard(where):
                    fn.run(*args, grid=grid, warmup=True, **full)
            else:
                fn.run(*args, grid=grid, warmup=True, **full)

        if what is None:
            return compile_only

        def build() -> None:
            progress = _Progress(lambda: f"compiling {what} in the background")
            try:
                compile_only()
            finally:
                progress.done()

        return build

    def _precompile(
        self, state: _State, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Compile a benchmarked bucket's candidates on the pool, in parallel, before the
        autotuner times them (it then finds each compiled)."""
        if state.interpreted or len(state.configs) < 2 or _compile.threads() < 2:
            return
        futures = [
            _compile.submit(
                self._builder(grid, args, self._compute(state, args, kwargs, _meta(c)), None)
            )
            for c in self._pruned(state, args, kwargs)
        ]
        for future in futures:
            future.exception()  # a candidate that fails to compile fails again when timed

    def _what(self, state: _State, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        return f"{self.op} ({_describe(self._when(state, args, kwargs), args)})"

    def _remember(
        self, state: _State, memo: tuple[Any, ...], kwargs: Mapping[str, Any], full: dict[str, Any]
    ) -> None:
        if len(state.fulls) >= 512:
            state.fulls.clear()
        state.fulls[memo] = (kwargs, full)

    def _fire(
        self,
        state: _State,
        grid: Any,
        args: tuple[Any, ...],
        full: dict[str, Any],
        device: int,
        key: tuple[Any, ...] | None,
        entry: Any,
        first: bool,
    ) -> Any:
        launcher = state.launcher
        if launcher is not None and key is not None and entry is not None and entry.verified:
            return launcher.fire(entry, grid, args, device)
        progress = None
        if first and entry is None:
            progress = _Progress(
                lambda: f"compiling {self.op} ({_describe(self._when(state, args, full), args)})"
            )
        try:
            if launcher is not None:
                return launcher.launch(grid, args, full, device, key, entry)
            if state.interpreted:
                return _interpret(self.fn, grid, args, full)
            return self.fn.run(*args, grid=grid, warmup=False, **full)
        finally:
            if progress is not None:
                progress.done()

    def _benchmark(
        self,
        state: _State,
        ckey: tuple[Any, ...],
        grid: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> Any:
        with self._lock:
            if state.tuner is None:
                state.tuner = self._tuner(state)
            when = self._when(state, args, kwargs)
            progress = _Progress(
                lambda: f"tuning {self.op} ({_describe(when, args)}): {len(state.configs)} configs"
            )
            try:
                self._precompile(state, grid, args, kwargs)
                result = state.tuner.run(*args, grid=grid, warmup=False, **kwargs)
            finally:
                progress.done()
            best = getattr(state.tuner, "best_config", None)
            if best is not None:
                state.choices[ckey] = _Choice(
                    when, _dtype_name(args), best.all_kwargs(), "benchmark"
                )
            return result

    def _tuner(self, state: _State) -> Any:
        import inspect

        import triton

        inner = self.fn
        if state.rules:
            rules = state.rules
            inner = triton.heuristics(
                {name: (lambda r: lambda named: r(named))(rule) for name, rule in rules}
            )(self.fn)
        extra: dict[str, Any] = {}
        if "cache_results" in inspect.signature(triton.autotune).parameters:
            extra["cache_results"] = True
        return triton.autotune(
            configs=[c.to_triton() for c in state.configs],
            key=list(self.keys),
            prune_configs_by=self.prune,
            reset_to_zero=list(self.reset_to_zero) or None,
            restore_value=list(self.restore_value) or None,
            **extra,
        )(inner)

    def _warmup(self, grid: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        state = self._state
        if state.generation != _tune._GENERATION:
            state = self._resolve()
        _ckey, choice, order = self._choose(state, args, kwargs)
        if choice is not None and choice.meta:
            meta = choice.meta
        else:
            meta = _meta((order or list(state.configs))[0])
        full = self._compute(state, args, kwargs, meta)
        return self.fn.run(*args, grid=grid, warmup=True, **full)

    # --- what it knows -----------------------------------------------------------------

    def configs_for_current_device(self) -> tuple[TuneConfig, ...]:
        """The configs this kernel chooses from here (one when pinned under the interpreter).

        Raises:
            ConfigError: the op has no entry, its entry lists no configs, or a config
                sets a meta-parameter the kernel does not take.
        """
        state = self._resolve() if self._state.generation != _tune._GENERATION else self._state
        assert state.tuning is not None
        if _tune.current_context().interpreter:
            pinned = state.tuning.pinned
            assert pinned is not None
            return (pinned,)
        return state.configs

    def rules_for_current_device(self) -> dict[str, Any]:
        """Each keyword this kernel's rules compute, with the rule computing it, in order."""
        tuning = _tune.lookup(self.op)
        out: dict[str, Any] = {r.name: r for r in tuning.heuristics}
        out.update((k, v) for k, v in self.rules.items() if k not in out)
        return out

    def choices(self) -> Iterator[dict[str, Any]]:
        """The config chosen at each bucket so far in this generation, and how
        (``table``, ``nearest``, ``first``, ``benchmark`` or ``pinned``)."""
        for choice in list(self._state.choices.values()):
            yield {
                "op": self.op,
                "kernel": self.__name__,
                "when": dict(choice.when),
                "dtype": choice.dtype,
                "how": choice.how,
                "config": {k: _plain(v) for k, v in choice.meta.items()},
            }


def _nothing() -> None:
    return None


def _frozen(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """A launch's keywords as a hashable value (an unhashable value by its repr)."""
    out = []
    for name, value in kwargs.items():
        try:
            hash(value)
        except TypeError:
            value = repr(value)
        out.append((name, value))
    return tuple(out)


def _interpret(fn: Any, grid: Any, args: tuple[Any, ...], full: dict[str, Any]) -> Any:
    # The interpreter runs a kernel's lanes with numpy, padding lanes included: a masked
    # lane's 0 / 0 or overflow is computed and discarded, as on a device, but numpy warns
    # about it. Those warnings say nothing about the result; they are not shown.
    import warnings

    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn.run(*args, grid=grid, warmup=False, **full)


def _meta(config: TuneConfig) -> dict[str, Any]:
    out: dict[str, Any] = config.to_triton().all_kwargs()
    return out


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float | str) else str(value)


def _describe(when: Mapping[str, Any], args: tuple[Any, ...]) -> str:
    dtype = _dtype_name(args)
    sizes = ", ".join(f"{k}={v}" for k, v in when.items())
    return ", ".join(p for p in (dtype, sizes) if p) or "no key"


_KERNELS: weakref.WeakSet[Kernel] = weakref.WeakSet()
_NO_KEYWORDS: Mapping[str, Any] = MappingProxyType({})


def choices() -> list[dict[str, Any]]:
    """Every kernel's choices in this process (see :meth:`Kernel.choices`), sorted."""
    out = [c for k in list(_KERNELS) for c in k.choices()]
    return sorted(out, key=lambda r: (r["op"], r["kernel"], str(r["when"]), str(r["dtype"])))


def tuned() -> list[dict[str, Any]]:
    """What benchmarking chose in this process: one record per op, kernel and bucket.

    Each record has ``op``, ``kernel``, ``when`` (the key's bucket values), ``dtype``,
    ``how`` (``benchmark``) and ``config`` (the chosen meta-parameters and launch
    keywords). ``gemsops tune`` writes them as tuning tables; benchmarks save them.
    """
    return [c for c in choices() if c["how"] == "benchmark"]


def kernel(
    op: str,
    key: Sequence[str] = (),
    *,
    rules: Mapping[str, Rule] | None = None,
    prune: Callable[..., Any] | Mapping[str, Any] | None = None,
    reset_to_zero: Sequence[str] = (),
    restore_value: Sequence[str] = (),
    defer: bool = True,
    categories: Sequence[str] = (),
) -> Callable[[Any], Kernel]:
    """Declare a ``@triton.jit`` kernel with its op's tuning entry.

    Args:
        op: The op's name in the tuning files.
        key: Argument names whose size buckets (with the tensor dtypes) select a config.
        rules: Python heuristics for keywords the file's rule language cannot say, as
            ``triton.heuristics``; they run after the file's rules.
        prune: ``early_config_prune(configs, named_args, **kwargs)``, or a
            ``prune_configs_by`` mapping (``early_config_prune``, ``perf_model``, ``top_k``).
        reset_to_zero: Arguments zeroed before each benchmarked run.
        restore_value: Arguments restored after each benchmarked run.
        defer: Whether a first launch may compile in the background while the caller
            serves the call another way (:func:`gemshal.kernel.compile.deferring`).
            False for kernels whose results depend on who serves the call (the random
            kernels: torch's generator would give other numbers); their first launch
            compiles on the calling thread.
        categories: Integer names in ``key`` that are not sizes (a split count, a mode):
            a table row for another value of one never serves a call as its nearest
            bucket. Other integer keys are sizes, compared on a log scale.

    Returns:
        A decorator making a :class:`Kernel`.

    Raises:
        TypeError: ``key`` is a string, a rule is not callable, or the decorated object
            is no Triton kernel.
        ValueError: a name in ``key``, ``rules``, ``reset_to_zero`` or ``restore_value``
            is not a kernel argument, a name in ``categories`` is not in ``key``, or
            ``prune`` has unknown keys.
    """
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be a non-empty string naming the tuning entry; got {op!r}")
    for param, names in (
        ("key", key),
        ("reset_to_zero", reset_to_zero),
        ("restore_value", restore_value),
        ("categories", categories),
    ):
        if isinstance(names, str):
            raise TypeError(
                f"{param} must be a list of argument names such as [{names!r}], not a str"
            )
    prune_by: dict[str, Any] | None = None
    if isinstance(prune, Mapping):
        unknown = sorted(set(prune) - set(_PRUNE_KEYS))
        if unknown:
            raise ValueError(f"prune has unknown keys {unknown}; valid: {', '.join(_PRUNE_KEYS)}")
        prune_by = dict(prune)
    elif callable(prune):
        prune_by = {"early_config_prune": prune}
    elif prune is not None:
        raise TypeError(f"prune must be a callable or a mapping; got {prune!r}")
    if not isinstance(defer, bool):
        raise TypeError(f"defer must be True or False; got {defer!r}")

    def decorate(fn: Any) -> Kernel:
        made = Kernel(
            fn,
            op,
            key,
            rules or {},
            prune_by,
            reset_to_zero or (),
            restore_value or (),
            categories,
        )
        made.defer = defer
        return made

    return decorate
