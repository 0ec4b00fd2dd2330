"""gemshal.launch: the cheap key, the path decision, and every fallback of the direct path.

The direct path itself runs only on a GPU (``.ci/gpu`` and the ``gpu`` tests below);
on the CPU its logic runs over stand-ins for Triton's compiled kernel, its
``JITFunction.run`` and its argument binder, which record what they are given.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import gemshal
from gemshal.kernel import launcher as launch
from gemshal.kernel.launcher import CONST, NO_DEFAULT, NOSPEC, SPEC, Launcher, ParamSpec


def _triton_spec(value: Any, specialize: bool) -> tuple[Any, ...]:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return tuple(native_specialize_impl(BaseBackend, value, False, specialize, True))


def _key_of(value: Any, kind: int) -> tuple[Any, ...] | None:
    rig = Launcher(
        object(),
        specs=[ParamSpec("a", kind, NO_DEFAULT)],
        slow=lambda *a, **k: None,
        bind=lambda d, a, k: None,
        triton=FakeTriton(),
    )
    return rig.key(0, (value,), {})


ints = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, 15, 16, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63]),
    st.integers(2**63, 2**64 - 1),
)


@given(ints, ints, st.booleans())
def test_int_key_at_least_as_fine_as_triton(a: int, b: int, specialize: bool) -> None:
    """Property: two integers with the same cheap key get the same Triton specialization."""
    kind = SPEC if specialize else NOSPEC
    if _key_of(a, kind) == _key_of(b, kind):
        assert _triton_spec(a, specialize) == _triton_spec(b, specialize)


@given(
    st.sampled_from([torch.float32, torch.float16, torch.int64, torch.bool]),
    st.sampled_from([torch.float32, torch.bfloat16, torch.int32]),
    st.integers(0, 9),
    st.integers(0, 9),
)
def test_tensor_key_at_least_as_fine_as_triton(
    da: torch.dtype, db: torch.dtype, oa: int, ob: int
) -> None:
    """Property: two tensors with the same cheap key (dtype, 16-byte alignment) get the
    same Triton specialization; a different dtype or alignment gives another key."""
    base_a = torch.empty(64, dtype=da)
    base_b = torch.empty(64, dtype=db)
    a, b = base_a[oa:], base_b[ob:]
    same_key = _key_of(a, SPEC) == _key_of(b, SPEC)
    same_spec = _triton_spec(a, True) == _triton_spec(b, True)
    assert same_key == same_spec


def test_scalars_and_none_keys() -> None:
    """Floats, bools and None key by type, as Triton types them; a constexpr by value."""
    assert _key_of(1.5, SPEC) == _key_of(-3.0, SPEC) != _key_of(1.5, CONST)
    assert _key_of(True, SPEC) == _key_of(False, SPEC)
    assert _key_of(True, SPEC) != _key_of(1, SPEC)
    assert _key_of(None, SPEC) != _key_of(0, SPEC)
    assert _key_of(128, CONST) != _key_of(256, CONST)
    assert _key_of((1, 2), SPEC) is None


def test_decide_path_reasons() -> None:
    """The path decision names its reason: the setting, the interpreter, the version."""
    jit = launch.decide_path(choice="jit", interpreter=False, version="3.6.0")
    assert not jit.direct and "GEMS_LAUNCH=jit" in jit.reason
    interp = launch.decide_path(choice="direct", interpreter=True, version="3.6.0")
    assert not interp.direct and "interpreter" in interp.reason
    other = launch.decide_path(choice="direct", interpreter=False, version="3.9.0")
    assert not other.direct and "3.9.0" in other.reason and "3.6" in other.reason
    ok = launch.decide_path(choice="direct", interpreter=False, version="3.6.0")
    assert ok.direct and "3.6.0" in ok.reason


def test_bad_setting_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMS_LAUNCH accepts direct or jit; anything else is an error naming both."""
    monkeypatch.setenv("GEMS_LAUNCH", "fast")
    launch.reset()
    try:
        with pytest.raises(gemshal.ConfigError, match="'fast'"):
            launch.launch_path()
    finally:
        monkeypatch.delenv("GEMS_LAUNCH")
        launch.reset()


interpreted = pytest.mark.skipif(
    not gemshal.current_device().interpreter, reason="a compiled device: see the gpu tests"
)


@interpreted
def test_interpreter_path_here() -> None:
    """On the interpreter every launch takes JITFunction.run, and info says why."""
    path = launch.launch_path()
    assert not path.direct and "interpreter" in path.reason
    assert launch.launcher_for(object()) is None


# --- the launcher over stand-ins ----------------------------------------------------


class FakeLauncherObject:
    """Stands for Triton's compiled launcher: records each launch."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def __call__(self, g0: int, g1: int, g2: int, stream: int, function: Any, *rest: Any) -> None:
        _metadata, launch_meta, enter, leave, *args = rest
        assert launch_meta is None and enter is None and leave is None
        self.log.append(("direct", (g0, g1, g2), stream, function, tuple(args)))


class FakeKernel:
    def __init__(self, spec: tuple[Any, ...], log: list[tuple[Any, ...]]) -> None:
        self.spec = spec
        self.run = FakeLauncherObject(log)
        self.function = ("function", spec)
        self.packed_metadata = ("meta", spec)
        self.hash = repr(spec)  # Triton's compile hash: one per specialization


SPECS = (
    ParamSpec("out", SPEC, NO_DEFAULT),
    ParamSpec("x", SPEC, NO_DEFAULT),
    ParamSpec("n", SPEC, NO_DEFAULT),
    ParamSpec("size_class", NOSPEC, NO_DEFAULT),
    ParamSpec("BLOCK", CONST, NO_DEFAULT),
    ParamSpec("FLAG", CONST, False),
)


class FakeTriton:
    """Device, stream and hook queries; ``hooks`` and ``stream`` can be changed by a test."""

    def __init__(self) -> None:
        self.hooks = False
        self.stream = 7
        self.device = 0

    def quiet(self) -> bool:
        return not self.hooks

    def get_device(self) -> int:
        return self.device

    def get_stream(self, device: int) -> int:
        return self.stream + device


class Rig:
    """A launcher over stand-ins, and the record of every launch it made."""

    def __init__(
        self, *, unstable: bool = False, bad_bind: bool = False, recompiled: bool = False
    ) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.kernels: dict[tuple[Any, ...], FakeKernel] = {}
        self.unstable = unstable
        self.recompiled = recompiled
        self.triton = FakeTriton()
        self.launcher = Launcher(
            object(),
            specs=SPECS,
            slow=self.slow,
            bind=self.bind_bad if bad_bind else self.bind,
            triton=self.triton,
        )

    def bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        named = dict(zip([s.name for s in SPECS], args, strict=False))
        named.update(kwargs)
        return tuple(named.get(s.name, s.default) for s in SPECS)

    def spec(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        values = self.bound(args, kwargs)
        out: list[Any] = [self.triton.device]
        for value, s in zip(values, SPECS, strict=True):
            if s.kind == CONST:
                out.append(repr(value) if isinstance(value, list) else value)
            else:
                out.append(_triton_spec(value, s.kind == SPEC))
        out.append(tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.names)))
        return tuple(out)

    names = frozenset(s.name for s in SPECS)

    def slow(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> FakeKernel:
        spec = self.spec(args, kwargs)
        if self.unstable:
            spec = (*spec, len(self.log))  # a new kernel each call: the key is too coarse
        if self.recompiled:  # a new object of the same compile each call
            self.kernels[spec] = FakeKernel(spec, self.log)
        kernel = self.kernels.setdefault(spec, FakeKernel(spec, self.log))
        values = self.bound(args, kwargs)
        if callable(grid):
            grid = grid(dict(zip([s.name for s in SPECS], values, strict=True)))
        g = (*grid, 1, 1)[:3]
        self.log.append(("jit", g, self.triton.get_stream(0), kernel.function, values))
        return kernel

    def bind(self, device: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return self.bound(args, kwargs)

    def bind_bad(
        self, device: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, ...]:
        return self.bound(args, kwargs)[::-1]

    def call(self, n: int, *, grid: Any = None, offset: int = 0, **kw: Any) -> tuple[Any, ...]:
        out = torch.empty(n + 16)[offset : offset + n]
        x = torch.empty(n + 16)[offset : offset + n]
        g = grid if grid is not None else (lambda meta: ((n + meta["BLOCK"] - 1) // meta["BLOCK"],))
        self.launcher.run(g, (out, x, n, n.bit_length()), {"BLOCK": 64, **kw})
        return self.log[-1]


def test_first_call_compiles_second_checks_third_is_direct() -> None:
    """A key's first call and its first reuse go through JITFunction.run; later calls
    launch the same compiled kernel directly, with the arguments and grid Triton binds."""
    rig = Rig()
    paths = [rig.call(1000)[0] for _ in range(4)]
    assert paths == ["jit", "jit", "direct", "direct"]
    assert rig.launcher.counts == {"direct": 2, "jit": 2, "compiled": 1}


def test_direct_launch_matches_jit_launch() -> None:
    """The direct launch passes exactly what the JITFunction.run path passes: grid,
    stream, compiled function and every argument, defaults included."""
    rig = Rig()
    rig.call(1000)
    slow = rig.call(1000)
    fast = rig.call(1000)
    assert slow[0] == "jit" and fast[0] == "direct"
    assert slow[1:4] == fast[1:4]
    assert len(slow[4]) == len(fast[4])
    for a, b in zip(slow[4][2:], fast[4][2:], strict=True):
        assert a == b
    assert slow[4][-1] is False  # FLAG's default reached the launcher


def test_stream_is_fetched_on_every_call() -> None:
    """The direct path asks for the current stream each time (graph capture needs it)."""
    rig = Rig()
    for _ in range(3):
        rig.call(512)
    rig.triton.stream = 99
    assert rig.call(512)[2] == 99


def test_new_specialization_gets_its_own_entry() -> None:
    """Another alignment, size class or constexpr makes a new entry, never a reuse."""
    rig = Rig()
    for _ in range(3):
        rig.call(1024)
    assert rig.call(1024, offset=1)[0] == "jit"  # misaligned pointers
    assert rig.call(1)[0] == "jit"  # n == 1 is a Triton constant
    assert rig.call(1024, FLAG=True)[0] == "jit"
    assert rig.call(1024)[0] == "direct"
    assert rig.launcher.counts["compiled"] == 4  # one entry per specialization


def test_equal_keyword_dicts_share_an_entry() -> None:
    """Keyword dicts equal in content reach one entry; another value reaches another."""
    rig = Rig()
    out = torch.empty(64)
    kept = {"BLOCK": 64}
    for kw in (kept, kept, {"BLOCK": 64}, dict(kept)):
        rig.launcher.run((1,), (out, out, 64, 7), kw)
    assert [e[0] for e in rig.log] == ["jit", "jit", "direct", "direct"]
    rig.launcher.run((1,), (out, out, 64, 7), {"BLOCK": 32})
    assert rig.log[-1][0] == "jit"


def test_hooks_send_calls_to_jit() -> None:
    """With a launch hook installed (a profiler), every call takes JITFunction.run."""
    rig = Rig()
    for _ in range(3):
        rig.call(256)
    rig.triton.hooks = True
    assert rig.call(256)[0] == "jit"
    rig.triton.hooks = False
    assert rig.call(256)[0] == "direct"


def test_failed_self_check_turns_direct_path_off() -> None:
    """When a reuse of a key reaches another compiled kernel, the launcher stops
    launching directly, says why, and every call still launches through Triton."""
    rig = Rig(unstable=True)
    paths = [rig.call(300)[0] for _ in range(4)]
    assert paths == ["jit"] * 4
    assert rig.launcher.disabled is not None and "another compiled kernel" in rig.launcher.disabled


def test_a_new_object_of_the_same_compile_passes_the_self_check() -> None:
    """When Triton's cache holds another object of the same compile at the key's reuse (two
    threads compiled one specialization; the later store replaced the first), the entry
    is still the same kernel: it is trusted and later calls launch directly (on the H200,
    background compiles turned the pointwise kernels' direct path off this way)."""
    rig = Rig(recompiled=True)
    paths = [rig.call(1000)[0] for _ in range(4)]
    assert paths == ["jit", "jit", "direct", "direct"]
    assert rig.launcher.disabled is None


def test_argument_mismatch_turns_direct_path_off() -> None:
    """When the arguments the direct path would pass differ from Triton's binding,
    it is never used for that kernel."""
    rig = Rig(bad_bind=True)
    paths = [rig.call(300)[0] for _ in range(3)]
    assert paths == ["jit"] * 3
    assert rig.launcher.disabled is not None and "arguments differ" in rig.launcher.disabled


def test_grid_reading_a_runtime_argument() -> None:
    """A grid function that reads a runtime argument gets it from this call, not the first."""
    rig = Rig()

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (meta["n"] // meta["BLOCK"],)

    for _ in range(3):
        rig.call(640, grid=grid)
    assert rig.call(1280, grid=grid)[1][0] == 20


def test_runtime_argument_by_keyword_and_unhashable_constexpr() -> None:
    """Calls the key cannot describe go through JITFunction.run, every time."""
    rig = Rig()
    out = torch.empty(8)
    for _ in range(3):
        rig.launcher.run((1,), (out, out), {"n": 8, "size_class": 4, "BLOCK": 8})
        assert rig.log[-1][0] == "jit"
    for _ in range(3):
        rig.launcher.run((1,), (out, out, 8, 4), {"BLOCK": [8]})
        assert rig.log[-1][0] == "jit"


def test_devices_have_separate_entries() -> None:
    """A kernel compiled on one device is never launched directly on another."""
    rig = Rig()
    for _ in range(3):
        rig.call(256)
    rig.triton.device = 1
    assert rig.call(256)[0] == "jit"


@interpreted
def test_interpreted_ops_make_no_launcher() -> None:
    """On the interpreter an op runs through Triton's own run: no launcher is made."""
    import gemsops

    x = torch.arange(8.0)
    torch.testing.assert_close(gemsops.add(x, x), x + x)
    assert launch.stats() == []


# --- on a GPU: the real direct path ----------------------------------------------------


@pytest.mark.gpu
def test_direct_path_on_device_matches_jit() -> None:
    """On a device, gemsops ops launched directly give the same results as launched
    through JITFunction.run, and the direct path is really taken."""
    import gemsops

    path = launch.launch_path()
    if not path.direct:
        pytest.skip(path.reason)
    dev = gemshal.current_device().torch_device
    x = torch.randn(4097, device=dev)
    y = torch.randn(4097, device=dev)
    outs = [gemsops.add(x, y) for _ in range(4)]
    rows = torch.randn(33, 1000, device=dev)
    soft = [gemsops.softmax(rows, -1) for _ in range(4)]
    direct = sum(r["direct"] for r in launch.stats())
    assert direct > 0, launch.stats()
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    for s in soft[1:]:
        assert torch.equal(s, soft[0])
    torch.testing.assert_close(outs[-1], x + y)
    torch.testing.assert_close(soft[-1], torch.softmax(rows, -1))


# --- ready launches (Launcher.ready) ----------------------------------------------------


def _ready_rig(n: int = 1000) -> tuple[Rig, Any, tuple[Any, ...], dict[str, Any]]:
    rig = Rig()
    out = torch.empty(n + 16)[:n]
    x = torch.empty(n + 16)[:n]
    kw = {"BLOCK": 64}

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return ((n + meta["BLOCK"] - 1) // meta["BLOCK"],)

    args = (out, x, n, n.bit_length())
    return rig, grid, args, kw


def test_ready_needs_a_verified_entry_then_fires_what_run_fires() -> None:
    """A launch is made ready only once its entry is verified (first call and first reuse
    go through Triton); its fire passes the grid, stream, function and arguments the
    direct path passes."""
    rig, grid, args, kw = _ready_rig()
    rig.launcher.run(grid, args, kw)
    assert rig.launcher.ready(grid, args, kw) is None  # made, not yet checked
    rig.launcher.run(grid, args, kw)
    ready = rig.launcher.ready(grid, args, kw)
    assert ready is not None
    rig.launcher.run(grid, args, kw)
    direct = rig.log[-1]
    assert ready.fire(args)
    fired = rig.log[-1]
    assert fired[0] == "direct" and fired[1:4] == direct[1:4]
    assert all(a is b or a == b for a, b in zip(fired[4], direct[4], strict=True))


def test_ready_stands_down_after_clear_hooks_device_or_disable() -> None:
    """fire launches nothing and says so when the entries were dropped, a launch hook is
    installed or another device is current; it fires again once the hook is gone."""
    rig, grid, args, kw = _ready_rig()
    for _ in range(2):
        rig.launcher.run(grid, args, kw)
    ready = rig.launcher.ready(grid, args, kw)
    assert ready is not None
    logged = len(rig.log)
    rig.triton.hooks = True
    assert not ready.fire(args)
    rig.triton.hooks = False
    rig.triton.device = 1
    assert not ready.fire(args)
    rig.triton.device = 0
    assert len(rig.log) == logged
    assert ready.fire(args)
    rig.launcher.clear()
    assert not ready.fire(args)
    assert len(rig.log) == logged + 1
    for _ in range(2):
        rig.launcher.run(grid, args, kw)
    again = rig.launcher.ready(grid, args, kw)
    assert again is not None
    rig.launcher._disable("a test turned the direct path off")
    assert not again.fire(args)


def test_ready_refuses_a_tensor_on_another_device() -> None:
    """A call whose first tensor is not on the current device is not made ready (the
    guard must run)."""
    rig, grid, args, kw = _ready_rig()
    for _ in range(2):
        rig.launcher.run(grid, args, kw)

    class _Elsewhere(torch.Tensor):
        def get_device(self) -> int:  # type: ignore[override]
            return 3

    moved = args[0].as_subclass(_Elsewhere)  # the same memory: the entry is found
    assert rig.launcher.lookup((moved, *args[1:]), kw)[2] is not None
    assert rig.launcher.ready(grid, (moved, *args[1:]), kw) is None
    assert rig.launcher.ready(grid, args, kw) is not None
