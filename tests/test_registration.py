"""Serving aten ops: enable/disable/use_gems, names, the call record and fallbacks."""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import gemsops
from gemsops import registry
from gemsops.testing.strategies import target_device

WATCHED = (
    "aten::add.Tensor",
    "aten::mul.Tensor",
    "aten::sum.dim_IntList",
    "aten::mm",
    "aten::cross_entropy_loss",  # served at the autograd key
)


def _dispatch_tables() -> dict[str, str]:
    return {op: torch._C._dispatch_dump(op) for op in WATCHED}


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    gemsops.disable()
    yield
    gemsops.disable()


def test_use_gems_leaves_torch_exactly_as_found() -> None:
    """After the block, every watched op's dispatch table is what it was before."""
    before = _dispatch_tables()
    with gemsops.use_gems() as served:
        assert "add.Tensor" in served
        assert _dispatch_tables() != before
    assert _dispatch_tables() == before
    assert gemsops.registered_ops() == ()


def test_enabling_twice_registers_once() -> None:
    """A second enable() with the same arguments changes nothing."""
    first = gemsops.enable()
    tables = _dispatch_tables()
    second = gemsops.enable()
    assert first == second
    assert _dispatch_tables() == tables
    gemsops.disable()
    gemsops.disable()  # disabling twice is harmless
    assert gemsops.registered_ops() == ()


def test_nesting_restores_the_outer_registration() -> None:
    """An inner use_gems(include=...) narrows; leaving it restores the outer set."""
    with gemsops.use_gems():
        outer = gemsops.registered_ops()
        with gemsops.use_gems(include=["add"]):
            inner = gemsops.registered_ops()
            assert set(inner) == {o for o in outer if registry.base_name(o) == "add"}
        assert gemsops.registered_ops() == outer
    assert gemsops.registered_ops() == ()


def test_op_name_covers_all_overloads_but_an_overload_only_itself() -> None:
    """'add' covers add.Tensor, add_.Tensor, add.out; 'add.Tensor' means that one alone."""
    every = registry.resolve_names(["add"])
    assert {"add.Tensor", "add_.Tensor", "add.out"} <= every
    assert registry.resolve_names(["add.Tensor"]) == {"add.Tensor"}
    served = gemsops.enable(unused=["add"])
    assert not any(registry.base_name(o) == "add" for o in served)
    assert "mul.Tensor" in served


def test_unknown_op_name_lists_close_matches() -> None:
    """A misspelt op is an UnknownOpError suggesting the names it resembles."""
    with pytest.raises(gemsops.UnknownOpError, match=r"'ad'.*add"):
        gemsops.enable(unused=["ad"])
    with pytest.raises(LookupError, match="no op named 'definitely_not_an_op'"):
        gemsops.enable(include=["definitely_not_an_op"])


def test_record_counts_served_calls_with_correct_results() -> None:
    """Calls through torch inside use_gems are served by gemsops, counted, and correct."""
    x = torch.arange(12.0, device=target_device()).reshape(3, 4)
    expected = x.cpu() + 2 * x.cpu()
    with gemsops.use_gems(), gemsops.record() as rec:
        got = torch.add(x, x, alpha=2)
    torch.testing.assert_close(got.cpu(), expected)
    assert rec.served["add.Tensor"] == 1
    assert not rec.fallbacks


def test_nested_records_each_count_their_own_block() -> None:
    """An inner record() counts its block only, the outer one counts both, and both close."""
    x = torch.arange(4.0, device=target_device())
    with gemsops.use_gems(), gemsops.record() as outer:
        with gemsops.record() as inner:
            torch.add(x, x)  # both count it: equal records when the inner one closes
        torch.add(x, x)
    assert inner.served["add.Tensor"] == 1
    assert outer.served["add.Tensor"] == 2
    with gemsops.use_gems(), gemsops.record() as after:
        torch.add(x, x)
    assert after.served["add.Tensor"] == 1 and outer.served["add.Tensor"] == 2


def test_unsupported_input_goes_to_torch_and_is_counted() -> None:
    """A complex input is handed to torch's kernel, counted with its reason, and correct."""
    z = torch.tensor([1 + 2j, 3 - 1j], device=target_device())
    with gemsops.use_gems(), gemsops.record() as rec:
        got = z + z
    torch.testing.assert_close(got.cpu(), torch.tensor([2 + 4j, 6 - 2j]))
    assert rec.served["add.Tensor"] == 0
    reasons = rec.fallback_ops()["add.Tensor"]
    assert reasons and all(isinstance(r, str) and r for r in reasons)


def test_vendor_and_user_unused_lists_combine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops named in the tune files' unused lists stay with torch, with the user's own."""
    from gemshal import tune

    user = tmp_path / "user.toml"
    user.write_text('unused = ["mul"]\n')
    monkeypatch.setenv("GEMS_TUNE_CONFIG", str(user))
    tune.clear_cache()
    try:
        served = gemsops.enable(unused=["sub"])
        assert not any(registry.base_name(o) in ("mul", "sub") for o in served)
        assert "add.Tensor" in served
    finally:
        gemsops.disable()
        monkeypatch.delenv("GEMS_TUNE_CONFIG")
        tune.clear_cache()


@pytest.mark.parametrize("overload", sorted(registry.implementations()))
def test_every_implementation_takes_its_aten_schema(overload: str) -> None:
    """Each served overload's function takes aten's arguments by aten's names (a name that
    is a Python keyword, as uniform_'s ``from``, with a trailing underscore), keyword-only
    exactly where aten's are, with a default exactly where aten has one."""
    name, over = overload.split(".")
    schema = getattr(getattr(torch.ops.aten, name), over)._schema
    params = list(inspect.signature(registry.implementations()[overload]).parameters.values())
    aten_names = [f"{a.name}_" if keyword.iskeyword(a.name) else a.name
                  for a in schema.arguments]
    assert [p.name for p in params] == aten_names
    for p, a in zip(params, schema.arguments, strict=True):
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), p.name
        assert (p.kind is p.KEYWORD_ONLY) == a.kwarg_only, p.name
        assert (p.default is not p.empty) == a.has_default_value(), p.name


def test_a_string_names_one_op_not_its_letters() -> None:
    """include="mm" and unused="add" are one name each, as a one-element list would be."""
    assert gemsops.enable(include="mm") == gemsops.enable(include=["mm"])
    assert {registry.base_name(o) for o in gemsops.registered_ops()} == {"mm"}
    served = gemsops.enable(unused="add")
    assert "mul.Tensor" in served and not any(registry.base_name(o) == "add" for o in served)
    with gemsops.use_gems(include="add.Tensor") as inside:
        assert inside == {"add.Tensor"}
    assert registry.resolve_names("add.Tensor") == {"add.Tensor"}
    with pytest.raises(gemsops.UnknownOpError, match="'mx'"):
        gemsops.enable(include="mx")


COMPILE_AFTER_BLOCK = """
import sys, warnings
import torch, gemsops
warnings.simplefilter("ignore")
backend = sys.argv[1]
x = torch.randn(8, generator=torch.Generator().manual_seed(0))
with gemsops.use_gems():
    inside = torch.compile(lambda t: t.sin() + 1, backend=backend)(x)
after = torch.compile(lambda t: t.cos() * 2, backend=backend)(x)
again = torch.compile(lambda t: t.exp(), backend=backend)(x)
# float32 tolerances: gemsops' sin inside the block is not torch's to the last bit, and
# sin(x) + 1 near 0 fails allclose's default absolute tolerance of 1e-8
torch.testing.assert_close(inside, x.sin() + 1)
torch.testing.assert_close(after, x.cos() * 2)
torch.testing.assert_close(again, x.exp())
print("ok")
"""


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiling_after_a_use_gems_block_does_not_crash(backend: str) -> None:
    """torch.compile inside a use_gems() block, then compiling something new after the
    block: the process survives (it died with a segfault in dynamo's RNG-state clone, through
    a dispatch handler torch's Python dispatcher had cached for gemsops' freed kernel) and
    every result is right. In a fresh process: a crash must not take the test run down."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", COMPILE_AFTER_BLOCK, backend],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip().endswith("ok")
