"""``gemsops selftest``: which ops pass on this device, checked the way the test suite checks them.

A vendor runs it on its hardware. For each op and dtype of the table below it draws
examples with the test suite's strategies (:mod:`gemsops.testing.strategies`), calls
the op through aten inside ``use_gems()`` (the path users take), computes torch's
float64 reference on the CPU (:mod:`gemsops.testing.reference`) and compares them
with the suite's tolerance table (:mod:`gemsops.testing.tolerance`). Hypothesis
shrinks a failure to its smallest example. Each (op, dtype) ends as one of:

- ``passed``: every example matched torch;
- ``failed``: the smallest failing example, with the error or the difference;
- ``handed back``: gemsops handed every call back to torch, with the reasons;
- ``not implemented``: gemsops does not serve the op on this vendor (its unused list).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from torch.nn import functional as F

import gemshal
from gemshal.kernel import AUTOTUNE_ENV
from gemsops import registry
from gemsops.testing.reference import reference
from gemsops.testing.strategies import FLOAT_DTYPES, broadcast_pair, dims_for, tensors
from gemsops.testing.tolerance import assert_close

__all__ = [
    "CASES",
    "DEFAULT_EXAMPLES",
    "OUTCOMES",
    "Case",
    "Row",
    "add_parser",
    "main",
    "run",
]

DEFAULT_EXAMPLES = 10
OUTCOMES = ("passed", "failed", "handed back", "not implemented")

Args = tuple[Any, ...]
Inputs = Callable[[torch.dtype], st.SearchStrategy[Args]]


@attrs.frozen
class Case:
    """One op of the self-test: how to draw its inputs, the torch call, what serves it."""

    op: str
    inputs: Inputs
    """A strategy of the call's positional arguments, for one dtype."""
    call: Callable[..., Any]
    """The torch call, run on the drawn arguments (through gemsops, and as the reference)."""
    aten: tuple[str, ...]
    """gemsops op names (as ``gemsops ops`` lists them) that serve the call."""
    reduce: Callable[[Args], int] = lambda args: 1
    """The reduction length, which widens the tolerance."""
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES


@attrs.frozen
class Row:
    """The outcome for one op and dtype."""

    op: str
    dtype: str
    outcome: str
    examples: int
    detail: str = ""
    example: str = ""
    """The smallest failing example (failed rows only)."""


# Input strategies, built from the test suite's generators.


def _unary(specials: bool = True) -> Inputs:
    return lambda dtype: tensors(dtypes=[dtype], specials=specials).map(lambda x: (x,))


@st.composite
def _binary_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    a, b = draw(broadcast_pair())
    return (
        draw(tensors(shape=a, dtypes=[dtype], specials=True)),
        draw(tensors(shape=b, dtypes=[dtype], specials=True)),
    )


def _binary(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _binary_args(dtype)


@st.composite
def _dims_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype]))
    return x, list(draw(dims_for(x.dim())))


def _over_dims(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _dims_args(dtype)


@st.composite
def _dim_args(draw: st.DrawFn, dtype: torch.dtype, specials: bool) -> Args:
    # An empty dim (argmax refuses it) is skipped: torch refuses the reference too.
    x = draw(tensors(dtypes=[dtype], specials=specials, min_rank=1))
    return x, draw(st.integers(-x.dim(), x.dim() - 1))


def _along_dim(specials: bool) -> Inputs:
    return lambda dtype: _dim_args(dtype, specials)


@st.composite
def _norm_args(draw: st.DrawFn, dtype: torch.dtype, bias: bool) -> Args:
    lead = draw(st.lists(st.sampled_from([1, 2, 3, 7]), max_size=2))
    n = draw(st.sampled_from([1, 5, 16, 33, 100, 257]))
    x = draw(tensors(shape=(*lead, n), dtypes=[dtype]))
    w = draw(tensors(shape=(n,), dtypes=[dtype], layouts=False))
    if not bias:
        return x, w
    return x, w, draw(tensors(shape=(n,), dtypes=[dtype], layouts=False))


def _norm(bias: bool) -> Inputs:
    return lambda dtype: _norm_args(dtype, bias)


_SIZES = st.sampled_from([1, 2, 5, 16, 33, 64])


@st.composite
def _mm_args(draw: st.DrawFn, dtype: torch.dtype, kind: str) -> Args:
    m, n, k = draw(_SIZES), draw(_SIZES), draw(_SIZES)
    batch = (draw(st.integers(1, 3)),) if kind == "bmm" else ()
    a = draw(tensors(shape=(*batch, m, k), dtypes=[dtype]))
    b = draw(tensors(shape=(*batch, k, n), dtypes=[dtype]))
    if kind == "addmm":
        return draw(tensors(shape=(n,), dtypes=[dtype], layouts=False)), a, b
    return a, b


def _mm(kind: str) -> Inputs:
    return lambda dtype: _mm_args(dtype, kind)


def _indices(draw: st.DrawFn, shape: tuple[int, ...], high: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    idx = torch.randint(0, high, shape, generator=gen, dtype=torch.int64)
    return idx.to(gemshal.current_device().torch_device)


@st.composite
def _embedding_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    num, dim = draw(st.integers(1, 40)), draw(st.sampled_from([1, 5, 64, 70]))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=2)))
    return _indices(draw, shape, num), draw(tensors(shape=(num, dim), dtypes=[dtype]))


def _embedding(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _embedding_args(dtype)


@st.composite
def _cross_entropy_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    rows, classes = draw(st.integers(1, 16)), draw(st.sampled_from([2, 5, 33, 100]))
    x = draw(tensors(shape=(rows, classes), dtypes=[dtype]))
    return x, _indices(draw, (rows,), classes)


def _cross_entropy(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _cross_entropy_args(dtype)


@st.composite
def _attention_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    b, heads, d = draw(st.integers(0, 2)), draw(st.sampled_from([1, 2])), draw(
        st.sampled_from([16, 64]))
    lq, lk = draw(st.integers(1, 33)), draw(st.integers(1, 33))
    q = draw(tensors(shape=(b, heads, lq, d), dtypes=[dtype], layouts=False))
    k = draw(tensors(shape=(b, heads, lk, d), dtypes=[dtype], layouts=False))
    v = draw(tensors(shape=(b, heads, lk, d), dtypes=[dtype], layouts=False))
    return q, k, v, draw(st.booleans()) and lq == lk


def _attention(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _attention_args(dtype)


@st.composite
def _gather_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3, specials=True))
    dim = draw(st.integers(0, x.dim() - 1))
    shape = tuple(min(s, 3) for s in x.shape)
    return x, dim, _indices(draw, shape, x.shape[dim]) if x.shape[dim] else _indices(
        draw, tuple(0 for _ in shape), 1)


def _gather(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _gather_args(dtype)


@st.composite
def _select_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3, specials=True))
    dim = draw(st.integers(0, x.dim() - 1))
    n = draw(st.integers(0, 6)) if x.shape[dim] else 0
    return x, dim, _indices(draw, (n,), max(x.shape[dim], 1))


def _select(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _select_args(dtype)


@st.composite
def _tril_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=2, max_rank=3, specials=True))
    return x, draw(st.integers(-3, 3))


def _tril(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _tril_args(dtype)


@st.composite
def _pad_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    pads = [draw(st.integers(0, 3)) for _ in range(2 * draw(st.integers(1, x.dim())))]
    return x, pads, draw(st.sampled_from([0.0, -1.5]))


def _pad(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _pad_args(dtype)


def _cast(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    # Every dtype to float32 and back to bfloat16: what a mixed-precision model casts.
    return tensors(dtypes=[dtype], specials=True).map(lambda x: (x,))


@st.composite
def _scatter_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    shape = tuple(min(s, 3) for s in x.shape)
    src = draw(tensors(shape=shape, dtypes=[dtype], layouts=False))
    return x, dim, _indices(draw, shape, max(x.shape[dim], 1)), src


def _scatter(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _scatter_args(dtype)


@st.composite
def _topk_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    return x, draw(st.integers(0, min(x.shape[-1], 8)))


def _topk(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _topk_args(dtype)


@st.composite
def _cat_args(draw: st.DrawFn, dtype: torch.dtype) -> Args:
    x = draw(tensors(dtypes=[dtype], min_rank=1, max_rank=3))
    dim = draw(st.integers(0, x.dim() - 1))
    other = list(x.shape)
    other[dim] = draw(st.integers(0, 4))
    return x, draw(tensors(shape=other, dtypes=[dtype])), dim


def _cat(dtype: torch.dtype) -> st.SearchStrategy[Args]:
    return _cat_args(dtype)


def _reduced(args: Args) -> int:
    x, dims = args[0], args[1]
    if isinstance(dims, int):
        dims = [dims]
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def _last(args: Args) -> int:
    return int(args[0].shape[-1])


def _k(args: Args) -> int:
    return int(args[-1].shape[-2])


CASES: tuple[Case, ...] = (
    Case("add", _binary, torch.add, ("add",)),
    Case("sub", _binary, torch.sub, ("sub",)),
    Case("mul", _binary, torch.mul, ("mul",)),
    Case("div", _binary, torch.div, ("div",)),
    Case("neg", _unary(), torch.neg, ("neg",)),
    Case("exp", _unary(), torch.exp, ("exp",)),
    Case("sigmoid", _unary(), torch.sigmoid, ("sigmoid",)),
    Case("silu", _unary(), F.silu, ("silu",)),
    Case("gelu", _unary(), F.gelu, ("gelu",)),
    Case("sum", _over_dims, torch.sum, ("sum",), _reduced),
    Case("mean", _over_dims, torch.mean, ("mean",), _reduced),
    Case("amax", _over_dims, torch.amax, ("amax",), _reduced),
    Case("argmax", _along_dim(False), torch.argmax, ("argmax",), _reduced),
    Case("softmax", _along_dim(True), torch.softmax, ("_softmax",), _reduced),
    Case("log_softmax", _along_dim(True), torch.log_softmax, ("_log_softmax",), _reduced),
    Case(
        "layer_norm",
        _norm(bias=True),
        lambda x, w, b: F.layer_norm(x, w.shape, w, b, 1e-5),
        ("native_layer_norm",),
        _last,
    ),
    Case(
        "rms_norm",
        _norm(bias=False),
        lambda x, w: F.rms_norm(x, w.shape, w, 1e-6),
        ("_fused_rms_norm",),
        _last,
    ),
    Case("mm", _mm("mm"), torch.mm, ("mm",), _k),
    Case("addmm", _mm("addmm"), torch.addmm, ("addmm",), _k),
    Case("bmm", _mm("bmm"), torch.bmm, ("bmm",), _k),
    Case("embedding", _embedding, F.embedding, ("embedding",)),
    Case("attention", _attention,
         lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
         ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"),
         lambda args: int(args[1].shape[2])),
    Case("gather", _gather, torch.gather, ("gather",)),
    Case("index_select", _select, torch.index_select, ("index_select",)),
    Case("tril", _tril, torch.tril, ("tril",)),
    Case("pad", _pad, lambda x, pads, value: F.pad(x, pads, value=value),
         ("constant_pad_nd",)),
    Case("cast", _cast, lambda x: x.to(torch.float32).to(torch.bfloat16), ("_to_copy",)),
    Case("floor", _unary(), torch.floor, ("floor",)),
    Case("cumsum", _along_dim(False), torch.cumsum, ("cumsum",), _reduced),
    *(Case(name, _unary(), getattr(torch, name), (name,))
      for name in ("log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "relu", "abs")),
    Case("maximum", _binary, torch.maximum, ("maximum",)),
    Case("pow", _binary, torch.pow, ("pow",)),
    Case("lt", _binary, torch.lt, ("lt",)),
    Case("prod", _along_dim(False), torch.prod, ("prod",), _reduced),
    Case("amin", _over_dims, torch.amin, ("amin",), _reduced),
    Case("argmin", _along_dim(False), torch.argmin, ("argmin",), _reduced),
    Case("var_mean", _along_dim(False), torch.var_mean, ("var_mean",), _reduced),
    Case("any", _along_dim(True), torch.any, ("any",)),
    Case("scatter_add", _scatter, torch.scatter_add, ("scatter_add",), lambda args: 9),
    Case("topk", _topk, lambda x, k: torch.topk(x, k).values, ("topk",)),
    Case("triu", _tril, torch.triu, ("triu",)),
    Case("cat", _cat, lambda a, b, dim: torch.cat([a, b], dim), ("cat",)),
    Case(
        "cross_entropy",
        _cross_entropy,
        F.cross_entropy,
        ("cross_entropy_loss", "nll_loss_forward"),
        lambda args: int(args[0].numel()),
    ),
)
"""The ops checked, one line each."""


# Running one (op, dtype).


def _describe(args: Args) -> str:
    parts = []
    for value in args:
        if isinstance(value, torch.Tensor):
            layout = "" if value.is_contiguous() else f" strides {tuple(value.stride())}"
            parts.append(f"tensor{tuple(value.shape)} {str(value.dtype)[6:]}{layout}")
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


def check(case: Case, dtype: torch.dtype, *, examples: int) -> Row:
    """Draw ``examples`` inputs of ``dtype`` for ``case`` and classify the op on this device."""
    name = str(dtype)[6:]
    caps = gemshal.current_vendor().capabilities
    if dtype == torch.bfloat16 and not caps.bf16:
        return Row(case.op, name, "not implemented", 0, "the vendor declares no bfloat16")
    calls = 0

    def fails(args: Args) -> bool:
        nonlocal calls
        calls += 1
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
    if smallest is not None:
        detail = failure or "failed once, then passed on the same inputs (flaky)"
        return Row(case.op, name, "failed", calls, detail, _describe(smallest))
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
    return Row(case.op, name, "passed", calls, "; ".join(notes)[:300])


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


# The command line.

_HEADER = f"{'op':<14} {'dtype':<9} {'outcome':<16} {'examples':>8}  detail"


def _line(row: Row) -> str:
    detail = row.detail
    if row.example:
        detail = f"{detail}\n{'':<50}smallest example: {row.example}"
    return f"{row.op:<14} {row.dtype:<9} {row.outcome:<16} {row.examples:>8}  {detail}".rstrip()


def summary(rows: Sequence[Row]) -> dict[str, int]:
    """How many rows ended in each outcome."""
    return {outcome: sum(r.outcome == outcome for r in rows) for outcome in OUTCOMES}


def add_parser(sub: Any) -> None:
    """Add the ``selftest`` subcommand to the gemsops command line."""
    p = sub.add_parser(
        "selftest", help="check which ops pass on this device (the test suite's properties)"
    )
    p.add_argument("--ops", help="comma-separated op names to check (default: all)")
    p.add_argument("--dtypes", help="comma-separated dtypes to check, e.g. bfloat16,float32")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"examples drawn per op and dtype (default: {DEFAULT_EXAMPLES})",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="benchmark every size bucket's configs, as GEMS_AUTOTUNE=all does (default: "
        "launch the tuning tables' configs, benchmarking nothing: the check is of results, "
        "and tuning every drawn shape would take most of its time)",
    )
    p.set_defaults(run=main)


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [n.strip() for n in value.split(",") if n.strip()]


def _selected(args: argparse.Namespace) -> tuple[list[Case], list[torch.dtype] | None]:
    """The cases and dtypes the arguments pick, or a one-line exit naming a bad value."""
    by_name = {case.op: case for case in CASES}
    ops = _names(args.ops)
    if ops is not None:
        bad = [op for op in ops if op not in by_name]
        if bad or not ops:
            raise SystemExit(
                f"gemsops selftest: unknown op(s) {bad}; known: {', '.join(sorted(by_name))}"
            )
    known = {str(d)[6:]: d for case in CASES for d in case.dtypes}
    names = _names(args.dtypes)
    dtypes = None
    if names is not None:
        names = [n.removeprefix("torch.") for n in names]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise SystemExit(
                f"gemsops selftest: unknown dtype(s) {bad}; known: {', '.join(sorted(known))}"
            )
        dtypes = [known[n] for n in names]
    if args.examples < 1:
        raise SystemExit(f"gemsops selftest: --examples must be at least 1, not {args.examples}")
    cases = list(CASES) if ops is None else [by_name[op] for op in dict.fromkeys(ops)]
    return cases, dtypes


def main(args: argparse.Namespace) -> int:
    """Run the self-test; print a row per op and dtype and a summary. 1 when any failed."""
    from gemsops.bench import output_problem

    problem = output_problem(args.json)
    if problem:
        raise SystemExit(f"gemsops selftest: {problem}")
    cases, dtypes = _selected(args)
    if AUTOTUNE_ENV not in os.environ:
        # This process only (the command exits after): --tune benchmarks every bucket as
        # a tuning run would; otherwise the tables' configs, nothing benchmarked.
        os.environ[AUTOTUNE_ENV] = "all" if getattr(args, "tune", False) else "0"
    dev = gemshal.current_device()
    print(f"gemsops selftest on {dev.vendor.display_name} ({dev.name}), {args.examples} examples")
    for overload, where in registry.overrides().items():
        print(f"vendor override: {overload} <- {where}")
    print(_HEADER)
    start = time.perf_counter()
    rows = run(
        cases, dtypes, examples=args.examples, on_row=lambda row: print(_line(row), flush=True)
    )
    counts = summary(rows)
    took = time.perf_counter() - start
    print(", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + f" ({took:.1f} s)")
    if args.json:
        result = {
            "device": dev.as_dict(),
            "examples": args.examples,
            "rows": [attrs.asdict(row) for row in rows],
            "summary": counts,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return 1 if counts["failed"] else 0
