"""Background compiles (gemshal.kernel.compile): a first launch that the caller can serve
another way does not wait for its compile; benchmarked buckets compile their candidates
in parallel; gemsops serves such calls with torch's kernels, never a wrong answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
from fake_kernels import FakeJit
from strategies_tune import fresh_tune
from torch.nn import functional as F

import gemshal
from gemshal import tune
from gemshal.errors import ConfigError
from gemshal.kernel import compile as bg
from gemshal.kernel import decorator as at
from gemshal.kernel import kernel as declare
from gemsops import registry

GPU = tune.TuneContext(vendor="nvidia", arch="sm90", interpreter=False)
DEV = gemshal.current_device().torch_device

TABLE = """
[ops.k]
configs = [{ BLOCK = 64, num_warps = 4 }, { BLOCK = 128, num_warps = 4 }, { BLOCK = 256 }]
table = [{ n = 1024, dtype = "float32", config = { BLOCK = 256, num_warps = 8 } }]
"""
ROW = triton.Config({"BLOCK": 256}, num_warps=8).all_kwargs()


@pytest.fixture
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tuning directory holding TABLE, a compiled-mode GPU context, background mode."""
    monkeypatch.setattr(tune, "current_context", lambda: GPU)
    monkeypatch.delenv("GEMS_AUTOTUNE", raising=False)
    monkeypatch.setenv("GEMS_COMPILE", "background")
    (tmp_path / "nvidia.toml").write_text(TABLE)
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        yield tmp_path


def test_settings_name_the_bad_value_and_the_valid_ones() -> None:
    """GEMS_COMPILE takes background (the default) or wait; GEMS_COMPILE_THREADS a positive
    integer; waiting() makes the mode wait whatever the setting."""
    assert bg.mode({}) == "background"
    assert bg.mode({"GEMS_COMPILE": "wait"}) == "wait"
    with bg.waiting():
        assert bg.mode({"GEMS_COMPILE": "background"}) == "wait"
    assert bg.mode({"GEMS_COMPILE": "background"}) == "background"
    with pytest.raises(ConfigError, match=r"'background'.*'wait'.*got 'later'"):
        bg.mode({"GEMS_COMPILE": "later"})
    assert 1 <= bg.threads({}) <= 8
    assert bg.threads({"GEMS_COMPILE_THREADS": "3"}) == 3
    for bad in ("0", "-2", "two"):
        with pytest.raises(ConfigError, match=f"GEMS_COMPILE_THREADS.*got '{bad}'"):
            bg.threads({"GEMS_COMPILE_THREADS": bad})


def test_a_first_launch_compiles_in_the_background_then_launches(gpu: Path) -> None:
    """Inside deferring(), the first launch at a new specialization raises KernelCompiling
    at once (its compile runs on a pool thread, with the table row's config, once); when
    it is done, the next launch runs that compiled config."""
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    with bg.hold() as release, bg.deferring():
        with pytest.raises(bg.KernelCompiling) as info:
            k[(1,)](x, 1000)
        assert info.value.op == "k" and "n=1024" in info.value.what
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 1000)  # still compiling: no second compile starts
        assert fake.warmups == [] and fake.launches == []
        release()
        assert bg.wait_compiles(timeout=10)
        assert fake.warmups == [ROW]
        k[(1,)](x, 1000)
    assert fake.launches == [ROW]
    assert [c["how"] for c in k.choices()] == ["table"]


def test_nothing_defers_outside_deferring_in_wait_mode_or_while_capturing(
    gpu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch outside deferring(), with GEMS_COMPILE=wait, inside waiting(), or while a
    graph is captured compiles and launches on the calling thread."""
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    k[(1,)](x, 1000)  # not inside deferring()
    with bg.deferring(), bg.waiting():
        k[(1,)](x, 2000)
    monkeypatch.setenv("GEMS_COMPILE", "wait")
    with bg.deferring():
        k[(1,)](x, 5000)
    monkeypatch.setenv("GEMS_COMPILE", "background")
    monkeypatch.setattr(bg, "_capturing", lambda: True)
    with bg.deferring():
        k[(1,)](x, 9000)
    assert len(fake.launches) == 4 and fake.warmups == []


def test_a_kernel_declared_without_deferral_compiles_here_inside_deferring(gpu: Path) -> None:
    """A kernel declared with defer=False (the random kernels: who serves a call decides
    its numbers) compiles and launches on the calling thread even inside deferring() in
    background mode, where the same kernel declared the default way defers."""
    held = FakeJit()
    deferred = declare("k", key=["n"])(held)
    fake = FakeJit()
    here = declare("k", key=["n"], defer=False)(fake)
    x = torch.empty(4)
    with bg.hold() as release, bg.deferring():
        with pytest.raises(bg.KernelCompiling):
            deferred[(1,)](x, 1000)
        here[(1,)](x, 1000)
        assert fake.launches == [ROW] and held.launches == []
        release()
    assert bg.wait_compiles(timeout=10)
    with pytest.raises(TypeError, match="defer must be True or False; got 'no'"):
        declare("k", defer="no")  # type: ignore[arg-type]


def test_a_failed_background_compile_fails_the_next_launch_here(gpu: Path) -> None:
    """A compile that fails on the pool is not swallowed: the launch after it compiles on
    the calling thread and raises that error (at once, where the failed compile was
    quick and nothing else compiled)."""

    class Broken(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            time.sleep(2 * bg.QUICK_S)
            raise ValueError("out of registers (stand-in)")

    k = declare("k", key=["n"])(Broken())
    x = torch.empty(4)
    with bg.deferring():
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 1000)
        assert bg.wait_compiles(timeout=10)
        with pytest.raises(ValueError, match="out of registers"):
            k[(1,)](x, 1000)

    class Quick(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            raise ValueError("out of registers (stand-in)")

    quick = declare("k", key=["n"])(Quick())
    with bg.deferring(), pytest.raises(ValueError, match="out of registers"):
        quick[(1,)](x, 1000)


def test_a_quick_compile_launches_at_once_unless_another_compile_runs(gpu: Path) -> None:
    """With no other compile running, a first launch waits up to QUICK_S for its own (a
    kernel in Triton's disk cache loads in milliseconds) and launches it; while a slow
    compile runs, a first launch hands the call back at once."""

    class Slow(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            if warmup and args[1] > 4000:
                time.sleep(0.5)
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    fake = Slow()
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    with bg.deferring():
        k[(1,)](x, 1000)  # quick, pool idle: compiled and launched by this call
        assert len(fake.launches) == 1
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 9000)  # slow: left to the pool
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 2000)  # quick, but the slow one still runs: not waited for
        started = time.monotonic()
        assert bg.wait_compiles(timeout=10)
        assert time.monotonic() - started > 0.2
        k[(1,)](x, 9000)
        k[(1,)](x, 2000)
    assert len(fake.launches) == 3 and len(fake.warmups) == 3


def test_prewarm_computes_tritons_key_once_on_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """prewarm() starts Triton's own cache key on a daemon thread, once per process, and
    prewarmed() waits for it."""
    from gemshal import _triton

    calls: list[str] = []

    def slow_key() -> None:
        time.sleep(0.2)
        calls.append(threading.current_thread().name)

    monkeypatch.setattr(_triton, "warm_cache_key", slow_key)
    monkeypatch.setattr(bg, "_PREWARMED", threading.Event())
    monkeypatch.setattr(bg, "_PREWARM", [])
    bg.prewarm()
    bg.prewarm()
    bg.prewarmed()  # compiles wait for it: the key is then computed once
    assert calls == ["gemshal-triton-key"]


def test_a_background_compile_prints_its_progress_line(
    gpu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A background compile that takes a while says so on stderr, naming the kernel, its
    bucket and that it runs in the background."""

    class Slow(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            time.sleep(0.2)
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setenv("GEMS_PROGRESS", "1")
    monkeypatch.setattr(at, "_PROGRESS_AFTER", 0.01)
    k = declare("k", key=["n"])(Slow())
    with bg.deferring(), pytest.raises(bg.KernelCompiling):
        k[(1,)](torch.empty(4), 1000)
    assert bg.wait_compiles(timeout=10)
    err = capsys.readouterr().err
    assert "compiling k (float32, n=1024) in the background ..." in err
    assert "compiling k (float32, n=1024) in the background: 0." in err


def test_a_benchmarked_bucket_compiles_its_candidates_on_the_pool_first(
    gpu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=all: every candidate config is compiled on pool threads before the
    first one is timed."""
    monkeypatch.setenv("GEMS_AUTOTUNE", "all")
    monkeypatch.setenv("GEMS_COMPILE_THREADS", "3")
    events: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    class Logged(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            with lock:
                kind = "compile" if warmup else "launch"
                events.append((kind, kwargs["BLOCK"], threading.current_thread().name))
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    def do_bench(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        return [1.0, 1.0, 1.0]

    real = triton.autotune

    def spy(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("cache_results", None)
        return real(*args, **kwargs, do_bench=do_bench)

    monkeypatch.setattr(triton, "autotune", spy)
    k = declare("k", key=["n"])(Logged())
    k[(1,)](torch.empty(4), 1000)
    compiles = [e for e in events if e[0] == "compile"]
    assert sorted(b for _, b, _ in compiles) == [64, 128, 256]
    assert all(name.startswith("gemshal-compile-") for _, _, name in compiles)
    first_launch = next(i for i, e in enumerate(events) if e[0] == "launch")
    assert first_launch >= 3  # all three compiled before anything was timed


# --- gemsops: calls served by torch while their kernels compile ---------------------------


@pytest.fixture
def fresh_plans() -> Iterator[None]:
    """A new tuning generation: every kernel meets its buckets for the first time."""
    tune.clear_cache()
    yield
    bg.wait_compiles(timeout=30)
    tune.clear_cache()


def _until_served(fn: Any, overload: str, rounds: int = 8) -> None:
    """Call ``fn`` under hold() until ``overload`` is served (each round lets the compiles
    the previous one started finish)."""
    for _ in range(rounds):
        with bg.hold() as release, registry.use_gems(), registry.record() as rec:
            fn()
            release()
        assert bg.wait_compiles(timeout=30)
        if rec.served[overload]:
            return
    raise AssertionError(f"{overload} never served: {rec.summary()}")


def test_a_functional_op_is_served_by_torch_while_compiling_then_by_gemsops(
    fresh_plans: None,
) -> None:
    """Property: while add's kernel compiles, add gives torch's answer and record() names
    the reason; once compiled, gemsops serves it with the same answer."""
    a = torch.randn(300, device=DEV)
    b = torch.randn(300, device=DEV)
    with bg.hold() as release:
        with registry.use_gems(), registry.record() as rec:
            got = a + b
        assert rec.fallbacks[("add.Tensor", registry.COMPILING)] == 1
        assert rec.served["add.Tensor"] == 0
        torch.testing.assert_close(got, torch.add(a, b))
        release()
    assert bg.wait_compiles(timeout=30)
    with bg.hold(), registry.use_gems(), registry.record() as rec:
        again = a + b
    assert rec.served["add.Tensor"] == 1, rec.summary()
    torch.testing.assert_close(again, torch.add(a, b))


def test_an_op_that_writes_its_argument_never_defers(fresh_plans: None) -> None:
    """An in-place overload compiles on the calling thread: torch may not redo a call that
    already wrote its argument."""
    a = torch.randn(300, device=DEV)
    b = torch.randn(300, device=DEV)
    want = a + b
    with bg.hold(), registry.use_gems(), registry.record() as rec:
        a.add_(b)
    assert rec.served["add_.Tensor"] == 1, rec.summary()
    assert not rec.fallbacks
    torch.testing.assert_close(a, want)


def test_a_backward_whose_kernel_compiles_gives_torchs_gradients(fresh_plans: None) -> None:
    """Property: cross_entropy's forward served by gemsops, its backward kernel compiling:
    the gradients are torch's (recomputed through torch's loss), and record() says the
    backward was handed back."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g).to(DEV)
    t = torch.randint(0, 10, (6,), generator=g).to(DEV)

    def loss(leaf: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(leaf, t, label_smoothing=0.1)

    # The forward that stores row statistics for a backward is its own kernel (a grad-free
    # call compiles the one without them): warm that one, never running the backward.
    _until_served(lambda: loss(x.clone().requires_grad_()), "cross_entropy_loss.default")
    ref = x.clone().requires_grad_()
    loss(ref).backward()
    mine = x.clone().requires_grad_()
    with bg.hold(), registry.use_gems(), registry.record() as rec:
        loss(mine).backward()
    assert rec.served["cross_entropy_loss.default"] == 1, rec.summary()
    assert rec.fallbacks[("cross_entropy backward", registry.COMPILING)] == 1, rec.summary()
    assert mine.grad is not None and ref.grad is not None
    torch.testing.assert_close(mine.grad, ref.grad)


def test_a_forked_child_starts_the_compiles_its_parent_left_running(gpu: Path) -> None:
    """After a fork the parent's compile threads are gone: a compile they had not finished
    is started again in the child instead of being waited for forever."""
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    with bg.hold() as release, bg.deferring():
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 1000)
        bg._POOL.forget()  # what os.fork's child hook does
        with pytest.raises(bg.KernelCompiling):
            k[(1,)](x, 1000)  # submitted again, to this process's pool
        release()
        assert bg.wait_compiles(timeout=10)
        k[(1,)](x, 1000)
    assert fake.launches == [ROW]
    assert fake.warmups[-1] == ROW


def test_a_launch_whose_keywords_come_in_a_new_dict_each_call_is_deferred_once(
    gpu: Path,
) -> None:
    """Compiles are told apart by value: a caller passing a fresh (equal) keyword dict on
    every call defers its first call only, and runs once the compile is done (keyed by the
    dict's identity, every call started a compile and was handed back, for good)."""
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    with bg.hold() as release, bg.deferring():
        with pytest.raises(bg.KernelCompiling):
            k.launch((1,), (x, 1000), {})
        release()
        assert bg.wait_compiles(timeout=10)
        for _ in range(3):
            k.launch((1,), (x, 1000), {})
    assert fake.launches == [ROW] * 3
    assert fake.warmups == [ROW]


def test_bad_settings_fail_at_a_served_call_on_every_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad GEMS_COMPILE or GEMS_COMPILE_THREADS is an error at the first served call that
    could defer, on the interpreter too (where nothing compiles in the background), not a
    value accepted and ignored."""
    a = torch.ones(3, device=DEV)
    for name, bad in (("GEMS_COMPILE", "later"), ("GEMS_COMPILE_THREADS", "two")):
        monkeypatch.setenv(name, bad)
        tune.clear_cache()
        with registry.use_gems(), pytest.raises(ConfigError, match=f"{name}.*got '{bad}'"):
            torch.add(a, a)
        monkeypatch.delenv(name)
    tune.clear_cache()


def test_at_exit_cancels_queued_compiles_and_waits_for_running_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At interpreter exit the compiles not started are cancelled and the one running is
    waited for (a worker inside Triton while the interpreter finalizes aborts it)."""
    monkeypatch.setenv(bg.THREADS_ENV, "1")
    pool = bg._Pool()
    monkeypatch.setattr(bg, "_POOL", pool)
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return "compiled"

    running = pool.submit(slow)
    assert started.wait(5)
    queued = [pool.submit(lambda: "never") for _ in range(3)]
    bg._at_exit()
    assert running.done() and running.result() == "compiled"
    assert all(f.cancelled() for f in queued)
    assert pool.outstanding() == []
