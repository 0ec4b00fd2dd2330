"""The thread model: one process-wide registration, counted across use_gems() blocks."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

import gemsops
from gemsops import registry
from gemsops.testing.strategies import target_device

TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    gemsops.disable()
    yield
    gemsops.disable()


def _run(*targets: Callable[[], None]) -> None:
    """Run each target in its own thread; re-raise the first error any of them raised."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


def _served_add() -> bool:
    """Whether torch.add is served by gemsops right now (and gives the right answer)."""
    x = torch.arange(4.0, device=target_device())
    with gemsops.record() as rec:
        got = torch.add(x, x)
    torch.testing.assert_close(got.cpu(), torch.arange(4.0) * 2)
    return rec.served["add.Tensor"] > 0


def test_interleaved_blocks_keep_the_registration_while_any_is_open() -> None:
    """A enters, B enters, A leaves: B's block is still served; after B leaves, nothing is."""
    step = threading.Barrier(2, timeout=TIMEOUT)
    seen: dict[str, bool] = {}

    def a() -> None:
        with gemsops.use_gems():
            step.wait()  # 1: both inside
            step.wait()  # 2
        step.wait()  # 3: A has left
        step.wait()  # 4: B has looked

    def b() -> None:
        step.wait()  # 1 (A entered first)
        with gemsops.use_gems():
            step.wait()  # 2
            step.wait()  # 3: A has left
            seen["b after a left"] = bool(gemsops.registered_ops()) and _served_add()
            step.wait()  # 4

    _run(a, b)
    assert seen == {"b after a left": True}
    assert gemsops.registered_ops() == ()


def test_overlapping_blocks_with_other_arguments_share_the_newest() -> None:
    """The newest open block's arguments serve everyone; leaving it restores the one under."""
    step = threading.Barrier(2, timeout=TIMEOUT)
    seen: dict[str, tuple[str, ...]] = {}

    def outer() -> None:
        with gemsops.use_gems():
            seen["outer alone"] = gemsops.registered_ops()
            step.wait()  # 1: outer inside
            step.wait()  # 2: inner inside
            seen["both"] = gemsops.registered_ops()
            step.wait()  # 3
            step.wait()  # 4: inner has left
            seen["inner left"] = gemsops.registered_ops()

    def inner() -> None:
        step.wait()  # 1
        with gemsops.use_gems(include="add"):
            step.wait()  # 2
            step.wait()  # 3
        step.wait()  # 4

    _run(outer, inner)
    adds = {o for o in seen["outer alone"] if registry.base_name(o) == "add"}
    assert set(seen["both"]) == adds
    assert seen["inner left"] == seen["outer alone"]
    assert gemsops.registered_ops() == ()


def test_the_newest_block_leaving_last_restores_what_was_found() -> None:
    """Blocks leaving in entry order (not nested) end with torch's kernels, not stale ones."""
    step = threading.Barrier(2, timeout=TIMEOUT)

    def first() -> None:
        with gemsops.use_gems(include="mul"):
            step.wait()  # 1
            step.wait()  # 2: second inside
        step.wait()  # 3: first has left

    def second() -> None:
        step.wait()  # 1
        with gemsops.use_gems(include="add"):
            step.wait()  # 2
            step.wait()  # 3
            assert all(registry.base_name(o) == "add" for o in gemsops.registered_ops())

    _run(first, second)
    assert gemsops.registered_ops() == ()


def test_blocks_restore_an_explicit_enable_when_the_last_leaves() -> None:
    """enable() before any block is put back when the last block of any thread leaves."""
    before = gemsops.enable(include=["mul"])
    step = threading.Barrier(2, timeout=TIMEOUT)

    def block() -> None:
        with gemsops.use_gems():
            step.wait()
            step.wait()

    _run(block, block)
    assert set(gemsops.registered_ops()) == before


def test_stress_enable_and_disable_from_threads_while_ops_run() -> None:
    """Stress: threads enter and leave use_gems() with varied arguments while others run
    ops; every result is right, and nothing stays registered at the end."""
    rng = random.Random(0)
    choices: list[dict[str, object]] = [{}, {"include": "add"}, {"unused": ["mul"]}]
    plans = [[rng.choice(choices) for _ in range(4)] for _ in range(4)]
    x = torch.arange(-3.0, 5.0, device=target_device())
    expected = {"add": x.cpu() + x.cpu(), "mul": x.cpu() * 3, "sum": x.cpu().sum()}
    start = threading.Barrier(len(plans) + 1, timeout=TIMEOUT)

    def check() -> None:
        torch.testing.assert_close(torch.add(x, x).cpu(), expected["add"])
        torch.testing.assert_close(torch.mul(x, 3).cpu(), expected["mul"])
        torch.testing.assert_close(x.sum().cpu(), expected["sum"])

    def worker(plan: list[dict[str, object]]) -> Callable[[], None]:
        def run() -> None:
            start.wait()
            for kwargs in plan:
                with gemsops.use_gems(**kwargs):  # type: ignore[arg-type]
                    check()
                check()  # outside any block of this thread: served or not, right

        return run

    def outsider() -> None:
        start.wait()
        for _ in range(10):
            check()

    _run(*(worker(p) for p in plans), outsider)
    assert gemsops.registered_ops() == ()
    assert registry._BLOCKS == []
