"""The sides of ``gemsops bench`` (torch, gemsops, FlagGems when installed) and its timer:
what the kernel rows (:mod:`gemsops.bench`), the model case (:mod:`gemsops.bench_model`)
and the model-shape suite (:mod:`gemsops.bench_suite`) share."""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from gemsops import registry
from gemsops.bench_cases import Thunk

__all__ = ["flag_gems", "sides_of", "timer_for"]


def flag_gems() -> Any | None:
    """FlagGems' module when it is installed, else None (the benchmark's peer)."""
    try:
        return importlib.import_module("flag_gems")
    except ImportError:
        return None


def timer_for(interpreter: bool) -> Callable[[Thunk], float]:
    """Milliseconds per call: do_bench's median on a device, a wall-clock median otherwise."""
    if interpreter:

        def wall(fn: Thunk) -> float:
            fn()
            samples = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - start) * 1e3)
            return statistics.median(samples)

        return wall
    import triton.testing

    def device_time(fn: Thunk) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    return device_time


def sides_of(peer: Any | None) -> dict[str, Callable[[], AbstractContextManager[Any]]]:
    """The benchmark's sides by name: torch, gemsops and, with ``peer``, FlagGems; each a
    context manager factory that turns that side on."""
    sides: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "torch": nullcontext,
        "gemsops": registry.use_gems,
    }
    if peer is not None:
        sides["flag_gems"] = peer.use_gems
    return sides
