"""Compiling kernels off the calling thread: background compiles and parallel candidates.

**Background compiles.** A kernel's first launch at a new specialization compiles it
(0.3-2 s each on an H200 host; a model's first training step meets dozens). Where the
caller can serve the call another way, the launch does not wait: the compile is handed
to a pool of worker threads and the launch raises :class:`KernelCompiling`; a later
launch with the same specialization finds the kernel compiled and runs it. gemsops
serves such a call with torch's own kernel (``record()`` names the reason
``compiling in the background``), so a first step runs at about torch's speed while
every kernel it met compiles in parallel.

A launch may defer only inside :func:`deferring` (gemsops enters it for the overloads
that write no argument, and for the backward of its autograd functions, which can
recompute through torch), with ``GEMS_COMPILE`` unset or ``background``, and never
while a CUDA graph is being captured. ``GEMS_COMPILE=wait`` compiles on the calling
thread, as Triton does; benchmarks, the conformance command and the test suite use it
so that what they time and check is gemsops' own kernels. :func:`wait_compiles` waits
for every compile started so far (a benchmark calls it after its warm-up).

**Parallel candidates.** A benchmarked bucket (``GEMS_AUTOTUNE=1`` or ``all``, and so
``gemsops tune``) compiles all its candidate configs on the pool first, then times them.

Triton's compiler releases the interpreter lock in its native passes and runs ``ptxas``
as a subprocess, so threads compile in parallel (``.ci/compile_threads.py``: four matmul
configs took 0.64x the time of one thread on two, on this project's two-core machine).
The workers are daemon threads: a process may exit with compiles still running.

**A warm cache.** A kernel already in Triton's on-disk cache loads in milliseconds. So a
first launch that finds no other compile running waits up to :data:`QUICK_S` for its
own (:func:`settle`): in a process whose kernels are all cached, each loads and the
first step runs gemsops' kernels, where handing every call back would have cost more
than the loads. A compile that takes longer is left running; while any is, first
launches do not wait. :func:`prewarm` computes Triton's own cache key (0.4 s, once per
process) on a thread when gemsops registers its kernels, before the first compile.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

from gemshal.errors import ConfigError

__all__ = [
    "COMPILE_ENV",
    "MODES",
    "QUICK_S",
    "THREADS_ENV",
    "KernelCompiling",
    "deferring",
    "hold",
    "mode",
    "pending",
    "prefetching",
    "prewarm",
    "prewarmed",
    "settle",
    "submit",
    "submitted",
    "threads",
    "wait_compiles",
    "waiting",
]

COMPILE_ENV = "GEMS_COMPILE"
THREADS_ENV = "GEMS_COMPILE_THREADS"
MODES = ("background", "wait")
"""``GEMS_COMPILE`` values: compile first launches on worker threads where the caller can
serve the call another way (the default), or always on the calling thread."""
QUICK_S = 0.05
"""How long a first launch waits for its compile when no other compile was running."""


class KernelCompiling(Exception):
    """A launch's kernel is compiling in the background and the caller may serve the
    call another way (it launched inside :func:`deferring`).

    Attributes:
        op: The tuning entry of the kernel being compiled.
        what: The kernel and its size bucket, as the progress lines name it.
    """

    def __init__(self, op: str, what: str) -> None:
        super().__init__(f"{what}: compiling in the background")
        self.op = op
        self.what = what


_WAITING = [0]


def mode(env: Mapping[str, str] | None = None) -> str:
    """The compile mode: ``wait`` inside :func:`waiting`, else what ``GEMS_COMPILE`` asks
    for (``background`` when unset).

    Raises:
        ConfigError: ``GEMS_COMPILE`` holds another value.
    """
    raw = (os.environ if env is None else env).get(COMPILE_ENV, "").strip()
    if raw in ("", "background"):
        return "wait" if _WAITING[0] else "background"
    if raw == "wait":
        return "wait"
    raise ConfigError(
        f"{COMPILE_ENV} must be 'background' (a first launch that the caller can serve "
        f"another way compiles on worker threads; the default) or 'wait' (every compile "
        f"runs on the calling thread); got {raw!r}"
    )


def threads(env: Mapping[str, str] | None = None) -> int:
    """How many compile threads to run: ``GEMS_COMPILE_THREADS``, else the CPU count
    capped at 8.

    Raises:
        ConfigError: a value that is not a positive integer.
    """
    raw = (os.environ if env is None else env).get(THREADS_ENV, "").strip()
    if raw == "":
        return max(1, min(8, os.cpu_count() or 1))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"{THREADS_ENV} must be a positive integer (the number of compile threads); got {raw!r}"
        )
    return value


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Inside the block (process-wide), every compile runs on the calling thread, whatever
    ``GEMS_COMPILE`` says: what benchmarks time and conformance checks check must be
    gemsops' own kernels from the first call."""
    _WAITING[0] += 1
    try:
        yield
    finally:
        _WAITING[0] -= 1


class _Scope(threading.local):
    """Whether launches on this thread may defer their compile right now."""

    defer = False


SCOPE = _Scope()
"""This thread's scope; gemsops' dispatch wrapper sets ``SCOPE.defer`` directly (two
attribute writes per call) instead of entering :func:`deferring`."""


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """Inside the block, a first launch may raise :class:`KernelCompiling` instead of
    compiling on this thread (when the mode is ``background``). The caller catches it and
    serves the call another way; nothing the block launched before it counts."""
    before = SCOPE.defer
    SCOPE.defer = True
    try:
        yield
    finally:
        SCOPE.defer = before


def _capturing() -> bool:
    from gemshal.device import device_module

    try:
        check = getattr(device_module(), "is_current_stream_capturing", None)
        return bool(check()) if callable(check) else False
    except Exception:  # a backend without graphs, or not initialized: nothing captures
        return False


def may_defer() -> bool:
    """Whether a first launch here should compile in the background (checked on a miss):
    inside :func:`deferring`, in ``background`` mode (or under :func:`hold`), and not
    while a graph is captured."""
    if not SCOPE.defer:
        return False
    chosen = mode()
    threads()  # read wherever the mode is, so a bad value fails on every path
    if _HOLD[0] is not None:
        return True
    return (chosen == "background" or _PREFETCH[0] > 0) and not _capturing()


_PREFETCH = [0]


@contextlib.contextmanager
def prefetching() -> Iterator[None]:
    """Inside the block (process-wide), first launches inside :func:`deferring` compile on
    the pool whatever the mode, :func:`waiting` included, and their calls are served
    another way: a warm-up pass that only queues compiles, so that the pass after it
    (inside :func:`waiting`, once :func:`wait_compiles` returns) finds them built. The
    conformance command runs one before it checks."""
    _PREFETCH[0] += 1
    try:
        yield
    finally:
        _PREFETCH[0] -= 1


# --- the pool ----------------------------------------------------------------------------


class _Pool:
    """Daemon worker threads taking (future, function) pairs from one queue."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._futures: list[Future[Any]] = []
        self.epoch = 0

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        future.gemshal_epoch = self.epoch  # type: ignore[attr-defined]
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
            if len(self._workers) < threads():
                worker = threading.Thread(
                    target=self._work, name=f"gemshal-compile-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                worker.start()
        self._queue.put((future, fn))
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._queue.get()
            gate = _HOLD[0]
            if gate is not None:
                gate.wait()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            # The function holds the launch's arguments: drop it before waiting again.
            del future, fn

    def forget(self) -> None:
        """In a forked child: the parent's workers do not exist there; start afresh (the
        compiles they had not finished are :func:`lost`)."""
        self.epoch += 1
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = []
        self._futures = []

    def cancel_queued(self) -> int:
        """Cancel every compile not yet taken by a worker; how many were cancelled."""
        cancelled = 0
        while True:
            try:
                future, _fn = self._queue.get_nowait()
            except queue.Empty:
                return cancelled
            if future.cancel():
                cancelled += 1

    def outstanding(self) -> list[Future[Any]]:
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            return list(self._futures)


_POOL = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_POOL.forget)
_HOLD: list[threading.Event | None] = [None]


EXIT_WAIT_S = 10.0
"""At interpreter exit, how long to wait for the compiles still running."""


def _at_exit() -> None:
    """At interpreter exit: cancel the compiles not started and wait up to
    :data:`EXIT_WAIT_S` for the running ones. A worker still inside Triton's compiler
    while the interpreter finalizes aborts the process ("FATAL: exception not
    rethrown", rc 134), after the user's program has finished."""
    _POOL.cancel_queued()
    wait_compiles(EXIT_WAIT_S)


atexit.register(_at_exit)


_SUBMITTED = [0]


def submit(fn: Callable[[], Any]) -> Future[Any]:
    """Run ``fn`` (a compile) on a worker thread; its future holds the result or error."""
    _SUBMITTED[0] += 1
    return _POOL.submit(fn)


def submitted() -> int:
    """How many compiles this process has submitted to the pool."""
    return _SUBMITTED[0]


def settle(future: Future[Any]) -> bool:
    """Wait up to :data:`QUICK_S` for ``future`` (a compile just submitted with no other
    running); whether it finished (or failed) in that time. Never waits under
    :func:`hold`, whose workers start only when the test says."""
    if _HOLD[0] is not None:
        return False
    prewarmed()  # a compile meanwhile would compute Triton's key itself, too slowly
    try:
        future.exception(timeout=QUICK_S)
    except TimeoutError:
        return False
    return True


_PREWARMED = threading.Event()
_PREWARM: list[threading.Thread] = []


def prewarm() -> None:
    """Start computing Triton's own cache key on a daemon thread (once per process)."""
    if _PREWARMED.is_set():
        return
    _PREWARMED.set()
    from gemshal import _triton

    def warm() -> None:
        with contextlib.suppress(Exception):  # the first compile computes it instead
            _triton.warm_cache_key()

    thread = threading.Thread(target=warm, name="gemshal-triton-key", daemon=True)
    _PREWARM.append(thread)
    thread.start()


def prewarmed(timeout: float = 5.0) -> None:
    """Wait (up to ``timeout`` seconds) for :func:`prewarm`'s thread, if one runs: a
    compile started meanwhile would compute Triton's key a second time, sharing the
    interpreter lock with it. Compiles on the pool call this first."""
    for thread in _PREWARM:
        if thread is not threading.current_thread():
            thread.join(timeout)


def lost(future: Future[Any]) -> bool:
    """Whether ``future`` will never finish: it was submitted before a fork, in the parent."""
    return getattr(future, "gemshal_epoch", _POOL.epoch) != _POOL.epoch and not future.done()


def pending() -> int:
    """How many submitted compiles have not finished."""
    return len(_POOL.outstanding())


def wait_compiles(timeout: float | None = None) -> bool:
    """Wait until every compile submitted so far has finished (or failed).

    Returns:
        True when none is left running; False when ``timeout`` seconds passed first.
    """
    import time

    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = _POOL.outstanding()
        if not left:
            return True
        for future in left:
            remaining = None if end is None else max(0.0, end - time.monotonic())
            try:
                future.exception(timeout=remaining)
            except TimeoutError:
                return False


def holding() -> bool:
    """Whether :func:`hold` is active (tests)."""
    return _HOLD[0] is not None


@contextlib.contextmanager
def hold() -> Iterator[Callable[[], None]]:
    """Tests: inside the block, launches inside :func:`deferring` defer whatever the mode,
    background compiles start only once the function it gives is called, and kernels
    the Triton interpreter runs defer too (their compile does nothing), so the deferred
    path runs on a CPU-only machine."""
    gate = threading.Event()
    before = _HOLD[0]
    _HOLD[0] = gate
    try:
        yield gate.set
    finally:
        gate.set()
        _HOLD[0] = before
