"""Per-vendor kernel overrides declared by a plugin: they win on their vendor only, fall
back to torch as built-in kernels do, and show in `gemsops ops`, record() and selftest.

The plugin is tests/plugins/overrides (real entry_points.txt metadata), put on the
import path for each test: nothing is installed."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import gemshal
import gemsops
from gemsops import declare, registry

OVERRIDES = Path(__file__).parent / "plugins" / "overrides"
NEG = "gemshal_override_vendor.ops.neg [overrider]"


@pytest.fixture
def overrider(monkeypatch: pytest.MonkeyPatch, isolated: None) -> Iterator[list[str]]:
    """The override plugin installed and its vendor chosen, with gemsops's op table built
    afresh for it; the session's table is put back afterwards. Yields the plugin's log of
    calls to its overrides."""
    monkeypatch.syspath_prepend(str(OVERRIDES))
    saved = (registry._IMPLS, dict(registry._SOURCES), registry._AUTOGRAD)
    registry.disable()
    registry._IMPLS = None
    registry._SOURCES.clear()
    try:
        gemshal.select("overrider")
        from gemshal_override_vendor import ops

        ops.CALLS.clear()
        yield ops.CALLS
    finally:
        registry.disable()
        registry._IMPLS, registry._AUTOGRAD = saved[0], saved[2]
        registry._SOURCES.clear()
        registry._SOURCES.update(saved[1])


def test_override_serves_on_its_vendor_and_record_names_it(overrider: list[str]) -> None:
    """On its vendor the plugin's neg serves aten neg; record() counts the call and names
    the override serving it, in ``overrides`` and in its summary."""
    x = torch.randn(7)
    with gemsops.use_gems(include="neg"), gemsops.record() as rec:
        y = torch.neg(x)
    assert torch.equal(y, -x)
    assert overrider == ["neg"]
    assert rec.served["neg.default"] == 1
    assert rec.overrides == {"neg.default": NEG}
    assert f"neg.default: 1 served  by vendor override {NEG}" in rec.summary()
    assert registry.source("neg.default") == NEG
    assert registry.overrides() == {"neg.default": NEG}


def test_override_falls_back_to_torch_on_unsupported(overrider: list[str]) -> None:
    """An input the override refuses (Unsupported) goes to torch's kernel, counted with
    the override's reason, as for built-in kernels."""
    x = torch.randn(5, dtype=torch.float64)
    with gemsops.use_gems(include="neg"), gemsops.record() as rec:
        y = torch.neg(x)
    assert torch.equal(y, -x)
    assert overrider == []
    assert not rec.served and not rec.overrides
    assert rec.fallbacks == {("neg.default", "overrider neg takes no float64"): 1}
    assert "handed back to torch (overrider neg takes no float64)" in rec.summary()


def test_override_for_another_arch_does_not_apply(overrider: list[str]) -> None:
    """An arch-specific override applies only on that arch tag: here abs stays portable."""
    assert "[overrider" not in registry.source("abs.default")
    x = torch.randn(6)
    expected = x.abs()
    with gemsops.use_gems(include="abs"), gemsops.record() as rec:
        y = torch.abs(x)
    assert torch.equal(y, expected)
    assert overrider == [] and rec.served["abs.default"] == 1 and not rec.overrides


def test_ops_command_marks_the_override(
    overrider: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemsops ops` stars the overridden overload and names the override below the table;
    `--sources` gives every overload's implementation."""
    from gemsops.cli import main

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    neg_line = next(line for line in out.splitlines() if line.startswith("neg "))
    assert "neg.default*" in neg_line and "neg.out," in neg_line  # out= stays portable
    assert "* served by a vendor override on overrider (1):" in out
    assert f"neg.default                {NEG}" in out
    assert main(["ops", "--sources"]) == 0
    sources = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert sources["neg.default"] == NEG and "[overrider" not in sources["neg.out"]


def test_selftest_row_names_the_override(overrider: list[str]) -> None:
    """selftest checks the override like any kernel and says the vendor's override served."""
    from gemsops import selftest

    case = next(c for c in selftest.CASES if c.op == "neg")
    row = selftest.check(case, torch.float32, examples=2)
    assert row.outcome == "passed", row
    assert f"served by vendor override {NEG}" in row.detail


def test_override_is_ignored_on_other_vendors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported but on another vendor, the override serves nothing: the portable kernels
    keep every overload (the session's cpu vendor here), and its arch-specific one applies
    only on that arch."""
    monkeypatch.syspath_prepend(str(OVERRIDES))
    from gemshal_override_vendor import ops

    decls = [d for d in declare.declarations() if d.module == ops.__name__]
    assert {d.vendor for d in decls} == {"overrider"}
    machine = gemshal.Arch(platform.machine() or "cpu").tag
    assert declare.table(decls, "cpu", machine) == {}
    assert set(declare.table(decls, "overrider", machine)) == {"neg.default"}
    assert set(declare.table(decls, "overrider", "no_such_arch")) == {"neg.default", "abs.default"}
    assert registry.override("neg.default") is None
    assert "neg.default" not in registry.overrides()
