"""Running one (op, dtype): :func:`check`; every case in each of its dtypes: :func:`run`."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import gemshal
from gemsops import registry
from gemsops.selftest.records import DEFAULT_EXAMPLES, Args, Case, Row
from gemsops.testing.reference import reference
from gemsops.testing.tolerance import assert_close

__all__ = [
    "check",
    "run",
]


def _describe(args: Args) -> str:
    parts = []
    for value in args:
        if isinstance(value, torch.Tensor):
            layout = "" if value.is_contiguous() else f" strides {tuple(value.stride())}"
            parts.append(f"tensor{tuple(value.shape)} {str(value.dtype)[6:]}{layout}")
        elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
            parts.append(f"[{_describe(tuple(value))}]")
        else:
            parts.append(repr(value))
    return ", ".join(parts)


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = "; ".join(lines) or type(error).__name__
    if not isinstance(error, AssertionError):
        text = f"{type(error).__name__}: {text}"
    return text[:300]


def _compare(actual: Any, expected: Any, reduce_size: int) -> None:
    if isinstance(actual, (tuple, list)):
        assert isinstance(expected, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _compare(a, e, reduce_size)
        return
    assert isinstance(actual, torch.Tensor), f"returned {type(actual).__name__}"
    assert actual.dtype == expected.dtype or expected.dtype == torch.float64, (
        f"dtype {actual.dtype}, torch gives {expected.dtype}"
    )
    assert_close(actual, expected, reduce_size=reduce_size)


def _mismatch(case: Case, args: Args, tally: registry.CallRecord) -> str | None:
    """Why gemsops' result for ``args`` differs from torch's, or None when it matches.

    Call inside ``use_gems()``: the reference and the comparison run as gemsops' own
    work, so torch's kernels serve them and record() does not count them. The calls
    gemsops served or handed back are added to ``tally`` unless torch refuses the inputs.
    """
    with registry.record() as rec:
        try:
            actual = case.call(*args)
        except Exception as error:  # a gemsops error, or torch's on a call handed back
            actual = error
    with registry.running():  # torch's kernels compute the reference and compare
        try:
            if case.unregistered:
                with registry.use_gems(include=()):
                    expected = reference(case.call, *args)
            else:
                expected = reference(case.call, *args)
        except Exception:
            return None  # torch refuses these inputs too: not a property of gemsops
        tally.served.update(rec.served)
        tally.fallbacks.update(rec.fallbacks)
        tally.overrides.update(rec.overrides)
        if isinstance(actual, Exception):
            return _one_line(actual)
        try:
            _compare(actual, expected, case.reduce(args))
        except AssertionError as error:
            return _one_line(error)
    return None


@st.composite
def _drawn(draw: st.DrawFn, strategy: st.SearchStrategy[Args]) -> Args:
    # Inputs are made by torch's kernels: a broken gemsops kernel must not corrupt them.
    with registry.running():
        return draw(strategy)


def check(case: Case, dtype: torch.dtype, *, examples: int, light: bool = False) -> Row:
    """Draw ``examples`` inputs of ``dtype`` for ``case`` and classify the op on this device.

    With ``light``, each example is only called (no reference, no comparison: the row
    says nothing), for :func:`prepare`: the draws are the same as a full check's."""
    name = str(dtype)[6:]
    caps = gemshal.current_vendor().capabilities
    if dtype == torch.bfloat16 and not caps.bf16:
        return Row(case.op, name, "not implemented", 0, "the vendor declares no bfloat16")
    calls = 0

    def fails(args: Args) -> bool:
        nonlocal calls
        calls += 1
        if light:
            with contextlib.suppress(Exception):  # a warm-up call: the check reports errors
                case.call(*args)
            return False
        return _mismatch(case, args, rec) is not None

    rec = registry.CallRecord()
    with registry.use_gems() as served:
        if not any(registry.base_name(o) in case.aten for o in served):
            return Row(case.op, name, "not implemented", 0, "left to torch on this vendor")
        try:
            smallest = find(
                _drawn(case.inputs(dtype)),
                fails,
                settings=settings(
                    max_examples=examples,
                    database=None,
                    deadline=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except NoSuchExample:
            smallest = None
        failure = None if smallest is None else _mismatch(case, smallest, rec)
    ops = tuple(sorted({registry.base_name(o) for o in rec.served}))
    if smallest is not None:
        detail = failure or "failed once, then passed on the same inputs (flaky)"
        return Row(case.op, name, "failed", calls, detail, _describe(smallest), ops)
    reasons = sorted({reason for (_, reason) in rec.fallbacks})
    handed = sum(rec.fallbacks.values())
    if handed and not rec.served:
        return Row(case.op, name, "handed back", calls, "; ".join(reasons)[:300])
    if not rec.served:
        return Row(case.op, name, "not implemented", calls, "no example reached gemsops")
    notes = []
    if rec.overrides:
        by = sorted(set(rec.overrides.values()))
        notes.append("served by vendor override " + ", ".join(by))
    if handed:
        total = handed + sum(rec.served.values())
        notes.append(f"{handed} of {total} calls handed back: " + "; ".join(reasons))
    return Row(case.op, name, "passed", calls, "; ".join(notes)[:300], served=ops)


def prepare(cases: Sequence[Case], dtypes: Sequence[torch.dtype] | None = None, *,
            examples: int = DEFAULT_EXAMPLES) -> int:
    """Compile the kernels the checks will launch on the compile pool, side by side, and
    wait for them; how many compiles it started.

    Each check's examples (derandomized: the draws the check will make) are called once
    inside :func:`prefetching`, with no reference computed: a first launch queues its
    compile and the call is handed to torch, so the checks after this launch built
    kernels instead of compiling one at a time on the calling thread. A kernel an op
    launches only after an earlier one of its own still compiles during the checks. On
    the Triton interpreter there is nothing to compile and nothing is run (unless a test
    holds the pool)."""
    from gemshal.kernel import compile as _compile

    if gemshal.current_device().interpreter and not _compile.holding():
        return 0
    before = _compile.submitted()
    with warnings.catch_warnings(), _compile.prefetching():
        warnings.simplefilter("ignore", RuntimeWarning)
        for case in cases:
            for dtype in case.dtypes:
                if dtypes is None or dtype in dtypes:
                    check(case, dtype, examples=examples, light=True)
    started = _compile.submitted() - before
    if not _compile.holding():
        _compile.wait_compiles()
    return started


def run(
    cases: Sequence[Case],
    dtypes: Sequence[torch.dtype] | None = None,
    *,
    examples: int = DEFAULT_EXAMPLES,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Check every case in each of its dtypes (those in ``dtypes`` when given)."""
    rows = []
    with warnings.catch_warnings():
        # The interpreter evaluates padding lanes (inf - inf) in numpy, which warns.
        warnings.simplefilter("ignore", RuntimeWarning)
        for case in cases:
            for dtype in case.dtypes:
                if dtypes is not None and dtype not in dtypes:
                    continue
                row = check(case, dtype, examples=examples)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows
