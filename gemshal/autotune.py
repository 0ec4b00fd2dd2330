"""``autotune`` and ``heuristics``: Triton's decorators, fed from tuning files.

Both go above ``@triton.jit`` like their Triton namesakes, and name an op instead
of listing configs::

    @gemshal.autotune.autotune("softmax", key=["N"])
    @gemshal.autotune.heuristics("softmax", ONE_TILE=lambda a: a["N"] <= a["BLOCK_N"])
    @triton.jit
    def softmax_kernel(out, inp, N, BLOCK_N: tl.constexpr, ONE_TILE: tl.constexpr): ...

    softmax_kernel[grid](out, inp, N)

Decorating reads nothing and needs no driver: the op's entry is looked up at the
first launch (and again after :func:`gemshal.tune.clear_cache`). Then:

* under the Triton interpreter one config is pinned (the entry's ``interpreter``
  config, else its first) and the kernel is launched with its meta-parameters;
* with one config the kernel is launched with it directly, no autotuner;
* with several a ``triton.autotune`` autotuner is built once (with
  ``cache_results=True`` where the installed Triton has it, so choices persist
  across processes in Triton's cache); after the first launch for a key the chosen
  config is launched directly, skipping the autotuner's per-call work.

Tuning results are shared within a size bucket: integer key values are rounded up
to a power of two, so 1000 and 1024 rows share one benchmark run, and a workload
with varying token counts tunes once per bucket, not once per count.

``GEMS_AUTOTUNE=0`` turns benchmarking off: each launch takes the first config its
entry lists that survives the kernel's pruning. Correctness runs on a GPU use it
to compile one config per kernel instead of all of them; unset or ``1`` tunes. Any
other value raises :class:`~gemshal.errors.ConfigError` at a kernel's first launch on
every device, the Triton interpreter included (where it changes nothing).
"""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gemshal import launch as _launch
from gemshal import tune as _tune
from gemshal.detect import env_flag
from gemshal.errors import ConfigError
from gemshal.tune_format import LAUNCH_KEYS, OpTuning, TuneConfig
from gemshal.tune_rules import HeuristicRule

__all__ = ["AutotunedKernel", "HeuristicsKernel", "Rule", "autotune", "heuristics", "tuned"]

Rule = Callable[[dict[str, Any]], Any]
"""A Python heuristic, mapping ``{argument name: value}`` to the keyword's value."""

_PRUNE_KEYS = ("early_config_prune", "perf_model", "top_k")
_NO_DTYPE = object()
AUTOTUNE_ENV = "GEMS_AUTOTUNE"


def _tuning_enabled() -> bool:
    return env_flag(
        os.environ,
        AUTOTUNE_ENV,
        default=True,
        meaning=" (0: launch each op's first config, 1: tune)",
    )


def _bucket(value: Any) -> Any:
    # Integers (not bools) round up to a power of two; anything else is its own key.
    if type(value) is int and value > 0:
        return 1 << (value - 1).bit_length()
    return value


def _check_names(param: str, names: Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"{param} names {', '.join(map(repr, unknown))}, not arguments of the kernel; "
            f"its arguments are {', '.join(valid)}"
        )
    return tuple(names)


def _stack(fn: Any) -> Iterator[Any]:
    """A kernel's decorator stack, outermost first: ``.fn`` links (as Triton's
    autotuner follows them), down to and including the Python function."""
    while fn is not None:
        yield fn
        if inspect.isfunction(fn):
            return
        fn = getattr(fn, "fn", None)


class _Kernel:
    """What both decorators share: the wrapped kernel, launch syntax, resolution state."""

    def __init__(self, fn: Any, op: str, decorator: str) -> None:
        names = getattr(fn, "arg_names", None)
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"gemshal.autotune.{decorator} decorates a @triton.jit function (or another "
                f"decorator over one); got {fn!r}"
            )
        self.fn = fn
        self.op = op
        self.arg_names: list[str] = list(names)
        self._lock = threading.RLock()
        # The tuning generation the resolved state belongs to; -1: not resolved yet.
        self._generation = -1
        # The direct launcher of the wrapped @triton.jit function (gemshal.launch), or
        # None where the wrapped object launches itself (another decorator, the
        # interpreter, or the direct path off).
        self._launcher: _launch.Launcher | None = None
        self._merges: dict[tuple[Any, ...], tuple[Any, Any, dict[str, Any]]] = {}

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """Launch syntax: ``kernel[grid](*args, **kwargs)``; grid is a tuple or ``f(meta)``."""
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        """Launch (or, with ``warmup``, only compile) the kernel."""
        if warmup:
            return self._warmup(args, grid, kwargs)
        return self.launch(grid, args, kwargs)

    def launch(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch with the arguments as a tuple and a dict (no repacking on the way)."""
        raise NotImplementedError

    def _warmup(self, args: tuple[Any, ...], grid: Any, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _merged(self, kwargs: dict[str, Any], more: Mapping[str, Any], tag: Any) -> dict[str, Any]:
        """``{**kwargs, **more}``, the same dict object again for the same inputs.

        Launchers remember keyword dicts by identity (gemshal.launch), so handing them
        one stable dict per (caller's dict, config) saves re-freezing it on every call.
        With ``tag`` None, ``more`` is a kept object (a config) and counts by identity;
        otherwise ``tag`` stands for its values (heuristics computed per call).
        """
        slot = (id(kwargs), id(more) if tag is None else tag)
        hit = self._merges.get(slot)
        if hit is not None and hit[0] is kwargs and (tag is not None or hit[1] is more):
            return hit[2]
        merged = {**kwargs, **more}
        if len(self._merges) >= 256:
            self._merges.clear()
        self._merges[slot] = (kwargs, more, merged)
        return merged

    def _inner(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Launch the wrapped object with complete keywords: directly where a launcher
        # serves it, through the next decorator's launch, or through its own run.
        launcher = self._launcher
        if launcher is not None:
            return launcher.run(grid, args, kwargs)
        fn = self.fn
        if isinstance(fn, _Kernel):
            return fn.launch(grid, args, kwargs)
        return fn.run(*args, grid=grid, warmup=False, **kwargs)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        """Compile without launching; arguments may be dtypes, as in Triton."""
        from triton.runtime.jit import MockTensor

        return self.run(*map(MockTensor.wrap_dtype, args), grid=grid, warmup=True, **kwargs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} op={self.op!r} fn={self.fn!r}>"


class _Plan:
    """How an autotuned kernel launches under one tuning generation."""

    __slots__ = ("benchmark", "chosen", "configs", "fixed", "too_big", "tuner")

    def __init__(
        self,
        configs: tuple[TuneConfig, ...],
        fixed: dict[str, Any] | None,
        tuner: Any,
        benchmark: bool = True,
    ) -> None:
        self.configs = configs
        self.fixed = fixed
        self.tuner = tuner
        self.benchmark = benchmark
        # GEMS_AUTOTUNE=0: (config, argument dtypes, keyword values) that ran out of
        # resources, so later sizes skip them instead of compiling them again.
        self.too_big: set[tuple[Any, ...]] = set()
        self.chosen: dict[tuple[Any, ...], dict[str, Any]] = {}


class AutotunedKernel(_Kernel):
    """A kernel whose configs come from its op's tuning entry; made by :func:`autotune`."""

    def __init__(
        self,
        fn: Any,
        op: str,
        key: Sequence[str],
        reset_to_zero: Sequence[str] | None,
        restore_value: Sequence[str] | None,
        prune_configs_by: dict[str, Any] | None,
    ) -> None:
        super().__init__(fn, op, "autotune")
        self.keys = _check_names("key", key, self.arg_names)
        self.reset_to_zero = _check_names("reset_to_zero", reset_to_zero or (), self.arg_names)
        self.restore_value = _check_names("restore_value", restore_value or (), self.arg_names)
        self.prune_configs_by = prune_configs_by
        self._plan: _Plan | None = None
        self._key_index = tuple(self.arg_names.index(k) for k in self.keys)
        self._name_set = frozenset(self.arg_names)
        _KERNELS.add(self)

    def configs_for_current_device(self) -> tuple[TuneConfig, ...]:
        """The configs this kernel chooses from here (one when pinned under the interpreter).

        Raises:
            ConfigError: the op has no entry, its entry lists no configs, or a
                config sets a meta-parameter the kernel does not take.
        """
        return self._resolve().configs

    def _resolve(self) -> _Plan:
        with self._lock:
            generation = _tune._GENERATION
            if self._plan is not None and self._generation == generation:
                return self._plan
            # Read on every path, the interpreter's included, so a bad value is refused
            # wherever it is set, not only where it would take effect.
            tuning_on = _tuning_enabled()
            context = _tune.current_context()
            tuning = _tune.lookup(self.op, context=context)
            self._check(tuning)
            configs = tuning.configs
            if context.interpreter:
                # The interpreter runs each program in Python: one small config is
                # plenty, and launch keywords mean nothing there.
                pinned = tuning.pinned
                assert pinned is not None  # _check() ensured configs exist
                plan = _Plan((pinned,), dict(pinned.meta), None)
            elif len(configs) == 1:
                plan = _Plan(configs, configs[0].to_triton().all_kwargs(), None)
            else:
                plan = _Plan(configs, None, self._build(configs), tuning_on)
            self._plan = plan
            self._launcher = _launch.launcher_for(self.fn)
            if self._launcher is not None:
                self._launcher.clear()  # entries hold the previous plan's configs
            self._generation = generation
            return plan

    def _check(self, tuning: OpTuning) -> None:
        if not tuning.configs:
            raise ConfigError(
                f"{tuning.location}: lists no configs; gemshal.autotune needs 'configs' or 'grid'"
            )
        everything = [*tuning.configs, *([tuning.interpreter] if tuning.interpreter else [])]
        for config in everything:
            for key, _value in config.meta:
                if key not in self._name_set:
                    raise ConfigError(
                        f"{tuning.location}: key {key!r} is not an argument of kernel "
                        f"{getattr(self.fn, '__name__', self.fn)!r}; its arguments are "
                        f"{', '.join(self.arg_names)}"
                    )

    def _build(self, configs: tuple[TuneConfig, ...]) -> Any:
        import triton

        extra: dict[str, Any] = {}
        if "cache_results" in inspect.signature(triton.autotune).parameters:
            extra["cache_results"] = True
        decorate = triton.autotune(
            configs=[c.to_triton() for c in configs],
            key=list(self.keys),
            prune_configs_by=self.prune_configs_by,
            reset_to_zero=list(self.reset_to_zero) or None,
            restore_value=list(self.restore_value) or None,
            **extra,
        )
        return decorate(self.fn)

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        # Triton's autotuner key (key-argument values, then the dtype of every argument
        # that has one), with integer values rounded up to their size bucket.
        n = len(args)
        parts = []
        for i in self._key_index:
            if i < n:
                parts.append(_bucket(args[i]))
            else:
                name = self.arg_names[i]
                if name in kwargs:
                    parts.append(_bucket(kwargs[name]))
        for value in args:
            dtype = getattr(value, "dtype", _NO_DTYPE)
            if dtype is not _NO_DTYPE:
                parts.append(dtype)
        if kwargs:
            names = self._name_set
            for name, value in kwargs.items():
                if name in names:
                    dtype = getattr(value, "dtype", _NO_DTYPE)
                    if dtype is not _NO_DTYPE:
                        parts.append(dtype)
        return tuple(parts)

    def _warmup(self, args: tuple[Any, ...], grid: Any, kwargs: dict[str, Any]) -> Any:
        plan = self._resolve()
        if plan.fixed is not None:
            return self.fn.run(*args, grid=grid, warmup=True, **kwargs, **plan.fixed)
        return plan.tuner.warmup(*args, grid=grid, **kwargs)

    def launch(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Launch the kernel with the config for this device and these arguments."""
        plan = self._plan
        if plan is None or self._generation != _tune._GENERATION:
            plan = self._resolve()
        launcher = self._launcher
        if launcher is not None:
            # One cheap key serves both choices: the launcher's specialization, and
            # (through the plan and the size buckets) the config this plan picks.
            extra = (plan, *[_bucket(args[i]) for i in self._key_index if i < len(args)])
            device, fast, entry = launcher.lookup(args, kwargs, extra)
            if entry is not None and entry.verified:
                return launcher.fire(entry, grid, args, device)
            if plan.fixed is not None:
                full = self._merged(kwargs, plan.fixed, None)
                return launcher.launch(grid, args, full, device, fast, entry)
            chosen = plan.chosen.get(self._key(args, kwargs))
            if chosen is not None:
                full = self._merged(kwargs, chosen, None)
                return launcher.launch(grid, args, full, device, fast, entry)
        elif plan.fixed is not None:
            return self._inner(grid, args, self._merged(kwargs, plan.fixed, None))
        key = self._key(args, kwargs)
        chosen = plan.chosen.get(key)
        if chosen is not None:
            return self._inner(grid, args, self._merged(kwargs, chosen, None))
        if not plan.benchmark:
            return self._run_first(plan, key, args, grid, kwargs)
        with self._lock:
            result = plan.tuner.run(*args, grid=grid, warmup=False, **kwargs)
            best = getattr(plan.tuner, "best_config", None)
            if best is not None:
                plan.chosen[key] = best.all_kwargs()
        return result

    def _run_first(
        self,
        plan: _Plan,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        grid: Any,
        kwargs: dict[str, Any],
    ) -> Any:
        """Launch the entry's first config that the kernel's pruning keeps and that
        compiles for this device (GEMS_AUTOTUNE=0): what the autotuner would have
        tried, without timing any."""
        from triton.runtime.errors import OutOfResources

        configs = [c.to_triton() for c in plan.configs]
        prune = (self.prune_configs_by or {}).get("early_config_prune")
        if prune is not None:
            named = dict(zip(self.arg_names, args, strict=False))
            named.update(kwargs)
            configs = list(prune(configs, named, **kwargs)) or configs
        dtypes = tuple(getattr(a, "dtype", None) for a in args)
        fixed = tuple(sorted((k, v) for k, v in kwargs.items() if not hasattr(v, "dtype")))
        for i, config in enumerate(configs):
            meta = dict(config.all_kwargs())
            memo = (tuple(sorted(meta.items())), dtypes, fixed)
            last = i == len(configs) - 1
            if memo in plan.too_big and not last:
                continue
            try:
                result = self.fn.run(*args, grid=grid, warmup=False, **kwargs, **meta)
            except OutOfResources:
                plan.too_big.add(memo)
                if last:
                    raise
                continue
            plan.chosen[key] = meta
            return result
        raise ConfigError(f"tuning entry {self.op!r}: no config to launch")


_KERNELS: weakref.WeakSet[AutotunedKernel] = weakref.WeakSet()


def _plain(value: Any) -> Any:
    # JSON-ready: numbers, strings, booleans and None as they are; anything else as text.
    return value if value is None or isinstance(value, int | float | str) else str(value)


def _function_name(fn: Any) -> str:
    # The name of the first layer of the decorator stack that has one.
    for layer in _stack(fn):
        name = getattr(layer, "__name__", None)
        if isinstance(name, str):
            return name
    return repr(fn)


def tuned() -> list[dict[str, Any]]:
    """What the autotuner chose in this process: one record per op and tuning key.

    Each record has ``op``, ``kernel`` (the function's name), ``key`` (the key's values
    as text: sizes rounded up to their bucket, then the argument dtypes) and
    ``config`` (the chosen meta-parameters and launch keywords). Kernels launched with
    a single or pinned config, or with ``GEMS_AUTOTUNE=0``, chose nothing and are not
    listed. Benchmarks save it, so tuning files can be written from measurements.
    """
    records = []
    for kernel in list(_KERNELS):
        plan = kernel._plan
        if plan is None or plan.tuner is None or not plan.benchmark:
            continue
        name = _function_name(kernel.fn)
        for key, config in list(plan.chosen.items()):
            records.append(
                {
                    "op": kernel.op,
                    "kernel": name,
                    "key": ", ".join(str(part) for part in key),
                    "config": {k: _plain(v) for k, v in config.items()},
                }
            )
    return sorted(records, key=lambda r: (r["op"], r["kernel"], r["key"]))


class HeuristicsKernel(_Kernel):
    """A kernel whose heuristic keywords come from its op's entry; made by :func:`heuristics`."""

    def __init__(self, fn: Any, op: str, rules: Mapping[str, Rule]) -> None:
        super().__init__(fn, op, "heuristics")
        valid = [*self.arg_names, *LAUNCH_KEYS]
        _check_names("heuristics", list(rules), valid)
        for name, rule in rules.items():
            if not callable(rule):
                raise TypeError(
                    f"heuristic {name!r} must be callable (args -> value); got {rule!r}"
                )
        self._callables = dict(rules)
        self._rules: tuple[tuple[str, Rule], ...] = ()
        self._where: dict[str, str] = {}

    def rules_for_current_device(self) -> dict[str, Rule | HeuristicRule]:
        """Each keyword this kernel computes, with the rule computing it, in order."""
        tuning = _tune.lookup(self.op)
        out: dict[str, Rule | HeuristicRule] = {r.name: r for r in tuning.heuristics}
        out.update((k, v) for k, v in self._callables.items() if k not in out)
        return out

    def _resolve(self) -> tuple[tuple[str, Rule], ...]:
        with self._lock:
            generation = _tune._GENERATION
            if self._generation == generation:
                return self._rules
            context = _tune.current_context()
            tuning = _tune.lookup(self.op, context=context)
            valid = [*self.arg_names, *LAUNCH_KEYS, *context.extra_launch_keys]
            rules: dict[str, Rule] = {}
            where: dict[str, str] = {}
            for rule in tuning.heuristics:
                for name in sorted({rule.name} | rule.references()):
                    if name not in valid:
                        raise ConfigError(
                            f"{tuning.location} heuristics key {rule.name!r}: {name!r} is not an "
                            f"argument or launch keyword of the kernel; valid: {', '.join(valid)}"
                        )
                rules[rule.name] = rule.compile()
                where[rule.name] = f"{tuning.location} heuristics key {rule.name!r}"
            # File rules run first, so Python rules can read what they compute; a file
            # rule replaces a Python one of the same name (files override per device).
            rules.update((k, v) for k, v in self._callables.items() if k not in rules)
            self._where = where
            self._rules = tuple(rules.items())
            self._launcher = _launch.launcher_for(self.fn)
            self._generation = generation
            return self._rules

    def _warmup(self, args: tuple[Any, ...], grid: Any, kwargs: dict[str, Any]) -> Any:
        kwargs = {**kwargs, **self._compute(args, kwargs)}
        return self.fn.run(*args, grid=grid, warmup=True, **kwargs)

    def launch(self, grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Compute the heuristic keywords from the arguments, then launch."""
        computed = self._compute(args, kwargs)
        try:
            values = tuple(computed.values())
            full = self._merged(kwargs, computed, (values, tuple(map(type, values))))
        except TypeError:  # a rule's value cannot be hashed: no stable dict for it
            full = {**kwargs, **computed}
        return self._inner(grid, args, full)

    def _compute(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The heuristic keywords for one launch (``kwargs`` is left as it was)."""
        rules = self._rules if self._generation == _tune._GENERATION else self._resolve()
        named = dict(zip(self.arg_names, args, strict=False))
        named.update(kwargs)
        computed: dict[str, Any] = {}
        name = ""
        try:
            for name, rule in rules:
                named[name] = computed[name] = rule(named)
        except KeyError as exc:
            if name not in self._where:
                raise
            raise ConfigError(
                f"{self._where[name]}: reads {exc.args[0]!r}, which this launch did not pass"
            ) from None
        return computed


def _check_op(op: object) -> str:
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be a non-empty string naming the tuning entry; got {op!r}")
    return op


def autotune(
    op: str,
    key: Sequence[str] = (),
    *,
    reset_to_zero: Sequence[str] | None = None,
    restore_value: Sequence[str] | None = None,
    prune: Callable[..., Any] | Mapping[str, Any] | None = None,
) -> Callable[[Any], AutotunedKernel]:
    """Autotune a ``@triton.jit`` kernel over the configs its op's tuning entry lists.

    Args:
        op: The op's name in the tuning files.
        key: Argument names whose values (with every tensor argument's dtype)
            select a tuning result, as in ``triton.autotune``.
        reset_to_zero: Arguments zeroed before each benchmarked run.
        restore_value: Arguments restored after each benchmarked run.
        prune: ``early_config_prune(configs, named_args, **kwargs)``, or a
            ``prune_configs_by`` mapping (``early_config_prune``, ``perf_model``, ``top_k``).

    Returns:
        A decorator making an :class:`AutotunedKernel`.

    Raises:
        TypeError: ``key`` is a string, or the decorated object is no Triton kernel.
        ValueError: a name in ``key``, ``reset_to_zero`` or ``restore_value`` is
            not a kernel argument, or ``prune`` has unknown keys.
    """
    _check_op(op)
    for param, names in (
        ("key", key),
        ("reset_to_zero", reset_to_zero),
        ("restore_value", restore_value),
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

    def decorate(fn: Any) -> AutotunedKernel:
        return AutotunedKernel(fn, op, key, reset_to_zero, restore_value, prune_by)

    return decorate


def heuristics(op: str, **rules: Rule) -> Callable[[Any], HeuristicsKernel]:
    """Compute keywords at each launch from the op's ``heuristics`` table and ``rules``.

    Args:
        op: The op's name in the tuning files (its entry must exist; it may have
            no ``heuristics`` table).
        **rules: Python rules for what the file's rule language cannot say, as in
            ``triton.heuristics``. They run after the file's rules (and can read
            their values); a file rule of the same name replaces one.

    Returns:
        A decorator making a :class:`HeuristicsKernel`.

    Raises:
        TypeError: a rule is not callable, or the decorated object is no Triton kernel.
        ValueError: a rule's name is not a kernel argument or launch keyword.
    """
    _check_op(op)

    def decorate(fn: Any) -> HeuristicsKernel:
        return HeuristicsKernel(fn, op, rules)

    return decorate
