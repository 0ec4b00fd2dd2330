"""gemshal.launch: the compiled-kernel cache in front of ``JITFunction.run``.

A real (uncompiled) ``JITFunction`` stands in for a kernel; its ``run`` is replaced by a
recorder that returns a fake compiled kernel, and the device and stream lookups by
constants, so the cache's decisions are visible without a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from gemshal import launch


def _kernel(X, Y, n, scale, BLOCK: tl.constexpr, flag=None):  # type: ignore[no-untyped-def]
    pass


class _Compiled:
    """Records what ``CompiledKernel[grid](*args, stream=...)`` would have launched."""

    def __init__(self, tag: int, launches: list[tuple[Any, ...]]) -> None:
        self.tag = tag
        self.launches = launches

    def __getitem__(self, grid: tuple[int, int, int]) -> Any:
        def runner(*args: Any, stream: Any = None) -> None:
            self.launches.append((self.tag, grid, args, stream))

        return runner


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Any:
    fn = JITFunction(_kernel)
    fn.compiles = []  # type: ignore[attr-defined]
    fn.launches = []  # type: ignore[attr-defined]

    def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> _Compiled:
        fn.compiles.append((args, kwargs))  # type: ignore[attr-defined]
        return _Compiled(len(fn.compiles), fn.launches)  # type: ignore[attr-defined]

    fn.run = run  # type: ignore[method-assign]
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream", lambda device: f"stream{device}")
    monkeypatch.delenv(launch.FAST_LAUNCH_ENV, raising=False)
    launch.clear()
    yield fn
    launch.clear()


def _x(n: int = 64, offset: int = 0) -> torch.Tensor:
    return torch.zeros(n + offset)[offset:]


def test_second_launch_skips_run_and_passes_every_argument(kernel: Any) -> None:
    """A repeated signature launches the remembered kernel with all arguments in
    signature order (defaults filled in), the grid padded to three and the stream."""
    x, y = _x(), _x()
    launch.launch(kernel, (4,), (x, y, 64, 0.5), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.compiles) == 1 and kernel.launches == []
    launch.launch(kernel, (4, 2), (x, y, 96, 1.5), {"BLOCK": 128, "num_warps": 4})
    assert len(kernel.compiles) == 1
    assert kernel.launches == [(1, (4, 2, 1), (x, y, 96, 1.5, 128, None), "stream0")]


def test_grid_function_sees_arguments_by_name(kernel: Any) -> None:
    """A callable grid is called with every kernel argument by name, constexprs too."""
    seen: list[dict[str, Any]] = []

    def grid(meta: dict[str, Any]) -> tuple[int]:
        seen.append(meta)
        return (meta["n"] // meta["BLOCK"],)

    for _ in range(2):
        launch.launch(kernel, grid, (_x(), _x(), 256, 1.0), {"BLOCK": 64})
    assert seen == [{"X": seen[0]["X"], "Y": seen[0]["Y"], "n": 256, "scale": 1.0,
                     "BLOCK": 64, "flag": None}]
    assert kernel.launches[0][1] == (4, 1, 1)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ((_x(), _x(), 64, 1.0), (_x(offset=1), _x(), 64, 1.0)),  # address alignment
        ((_x(), _x(), 64, 1.0), (_x().double(), _x(), 64, 1.0)),  # dtype
        ((_x(), _x(), 64, 1.0), (_x(), _x(), 65, 1.0)),  # divisibility by 16
        ((_x(), _x(), 2, 1.0), (_x(), _x(), 1, 1.0)),  # the value 1
        ((_x(), _x(), 64, 1.0), (_x(), _x(), 2**40, 1.0)),  # int32 against int64
        ((_x(), _x(), 64, 1.0), (_x(), _x(), 64, 1)),  # float against int
    ],
)
def test_a_different_specialization_goes_through_run(
    kernel: Any, first: tuple[Any, ...], second: tuple[Any, ...]
) -> None:
    """Arguments Triton would specialize differently never share a compiled kernel."""
    launch.launch(kernel, (1,), first, {"BLOCK": 32})
    launch.launch(kernel, (1,), second, {"BLOCK": 32})
    assert len(kernel.compiles) == 2 and kernel.launches == []


def test_constexpr_values_and_launch_options_are_part_of_the_signature(kernel: Any) -> None:
    """A new constexpr value or launch option compiles (through run); a repeat does not."""
    args = (_x(), _x(), 64, 1.0)
    for kwargs in ({"BLOCK": 32}, {"BLOCK": 64}, {"BLOCK": 64, "num_warps": 8},
                   {"BLOCK": 64, "num_warps": 8}, {"BLOCK": 32}):
        launch.launch(kernel, (1,), args, kwargs)
    assert len(kernel.compiles) == 3 and [t for t, *_ in kernel.launches] == [3, 1]


def test_unkeyable_arguments_and_the_off_switch_always_take_run(
    kernel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An argument of an unknown kind, or GEMS_FAST_LAUNCH=0, launches through run."""
    odd = (_x(), _x(), 64, 1.0, 8, object())
    launch.launch(kernel, (1,), odd, {})
    launch.launch(kernel, (1,), odd, {})
    assert len(kernel.compiles) == 2
    launch.clear()
    monkeypatch.setenv(launch.FAST_LAUNCH_ENV, "0")
    for _ in range(2):
        launch.launch(kernel, (1,), (_x(), _x(), 64, 1.0), {"BLOCK": 32})
    assert len(kernel.compiles) == 4 and kernel.launches == []


def test_the_device_is_part_of_the_signature(kernel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel compiled while one device was current is not launched on another."""
    args = (_x(), _x(), 64, 1.0)
    launch.launch(kernel, (1,), args, {"BLOCK": 32})
    monkeypatch.setattr(launch, "_device", lambda: 1)
    launch.launch(kernel, (1,), args, {"BLOCK": 32})
    launch.launch(kernel, (1,), args, {"BLOCK": 32})
    assert len(kernel.compiles) == 2
    assert kernel.launches == [(2, (1, 1, 1), (*args, 32, None), "stream1")]


def test_interpreted_functions_are_never_cached() -> None:
    """Anything but a compiled JITFunction (the interpreter's, a wrapper) runs as is."""
    calls: list[Any] = []

    class Wrapper:
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            calls.append(args)

    w = Wrapper()
    launch.launch(w, (1,), (1,), {})
    launch.launch(w, (1,), (1,), {})
    assert len(calls) == 2
