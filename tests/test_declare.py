"""gemsops.declare: one declaration binds an implementation to its aten overloads."""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any

import pytest
import torch
from torch import Tensor

import gemsops
from gemsops import declare, registry
from gemsops.declare import Declaration, DeclarationError
from gemsops.errors import Unsupported


def _decl(fn: Any, *overloads: str, out: tuple[str, ...] = (), inplace: tuple[str, ...] = (),
          **kw: Any) -> Declaration:
    return Declaration(name=fn.__name__, fn=fn, module=__name__, overloads=overloads, out=out,
                       inplace=inplace, **kw)


def _negate(x: Tensor) -> Tensor:
    return torch.neg(x)


def test_bad_overload_names_are_refused_with_the_expected_form() -> None:
    """op() names the malformed overload and shows the 'op.overload' form."""
    with pytest.raises(DeclarationError, match=r"'neg'.*'op.overload'"):
        declare.op("neg")
    with pytest.raises(DeclarationError, match=r"'a\.b\.c'"):
        declare.op("neg.default", out="a.b.c")
    with pytest.raises(DeclarationError, match="needs a vendor"):
        declare.op("neg.default", arch="sm90")


def test_op_records_a_declaration_and_returns_the_function(monkeypatch: Any) -> None:
    """The decorator leaves the function as it was and records what it serves."""
    monkeypatch.setattr(declare, "_DECLARED", [])
    decorated = declare.op("neg.default", out="neg.out", inplace="neg_.default")(_negate)
    assert decorated is _negate
    (decl,) = declare.declarations()
    assert decl.served == ("neg.default", "neg.out", "neg_.default")
    assert decl.name == "_negate" and decl.public and decl.vendor is None


def test_the_bound_function_takes_the_schema_and_forwards_by_name() -> None:
    """A direct overload gets aten's exact signature; the first argument may have any name,
    keyword-only ones arrive by keyword, and the defaults are the schema's."""
    seen: dict[str, Any] = {}

    def total(x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
        seen.update(dim=dim, keepdim=keepdim, dtype=dtype)
        return torch.sum(x, dim, keepdim, dtype=dtype)

    bound = declare.bind(_decl(total, "sum.dim_IntList"), "sum.dim_IntList")
    schema = torch.ops.aten.sum.dim_IntList._schema
    params = list(inspect.signature(bound).parameters.values())
    assert [p.name for p in params] == [a.name for a in schema.arguments]
    assert [p.kind is p.KEYWORD_ONLY for p in params] == [a.kwarg_only for a in schema.arguments]
    x = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(bound(x, [1]), x.sum(1))
    assert seen == {"dim": [1], "keepdim": False, "dtype": None}
    bound(x, [0], True, dtype=torch.float64)
    assert seen == {"dim": [0], "keepdim": True, "dtype": torch.float64}


def test_an_implementation_with_the_schema_signature_is_served_as_is() -> None:
    """No wrapper is generated when the function already takes aten's arguments."""

    def mm(self: Tensor, mat2: Tensor) -> Tensor:
        return self @ mat2

    assert declare.bind(_decl(mm, "mm.default"), "mm.default") is mm


def test_derived_out_writes_the_result_into_out() -> None:
    """An out= overload of a function without ``out`` computes, then copies into out and
    returns it; a mismatched out dtype hands the call back before out is touched."""
    bound = declare.bind(_decl(_negate, out=("neg.out",)), "neg.out")
    x = torch.tensor([1.0, -2.0])
    out = torch.empty(2)
    assert bound(x, out=out) is out
    assert torch.equal(out, -x)
    wrong = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(Unsupported, match="out dtype"):
        bound(x, out=wrong)
    assert torch.equal(wrong, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(Unsupported, match="shares storage"):
        bound(x, out=x)


def test_derived_out_with_several_outputs_writes_each() -> None:
    """max.dim_max's two out tensors receive the values and indices the function returns."""

    def max_dim(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
        return torch.max(x, dim, keepdim)

    bound = declare.bind(_decl(max_dim, out=("max.dim_max",)), "max.dim_max")
    x = torch.tensor([[1.0, 5.0], [7.0, 2.0]])
    values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
    result = bound(x, 1, max=values, max_values=indices)
    assert result[0] is values and result[1] is indices
    assert values.tolist() == [5.0, 7.0] and indices.tolist() == [1, 0]
    storage = torch.zeros(4)  # 16 bytes: two float32 values, then viewed as two int64
    aliased = torch.empty(0, dtype=torch.int64).set_(storage.untyped_storage(), 0, (2,), (1,))
    with pytest.raises(Unsupported, match="share storage"):
        bound(x, 1, max=storage[:2], max_values=aliased)
    assert storage.tolist() == [0.0] * 4


def test_an_implementation_taking_out_and_inplace_is_handed_them() -> None:
    """out= passes ``out``; an in-place overload passes ``out=self, inplace=True``."""
    calls: list[tuple[Any, Any]] = []

    def neg(x: Tensor, *, out: Tensor | None = None, inplace: bool = False) -> Tensor:
        calls.append((out, inplace))
        return torch.neg(x, out=out) if out is not None else torch.neg(x)

    decl = _decl(neg, "neg.default", out=("neg.out",), inplace=("neg_.default",))
    x = torch.tensor([1.0, 2.0])
    out = torch.empty(2)
    assert declare.bind(decl, "neg.out")(x, out=out) is out
    assert declare.bind(decl, "neg_.default")(x) is x
    assert calls == [(out, False), (x, True)]
    assert x.tolist() == [-1.0, -2.0]


def test_derived_inplace_copies_into_self_or_hands_back() -> None:
    """The in-place writer fills self; a result that cannot be cast, or has another shape,
    is handed back to torch with self untouched."""

    def add(x: Tensor, other: Tensor, *, alpha: Any = 1) -> Tensor:
        return torch.add(x, other, alpha=alpha)

    bound = declare.bind(_decl(add, inplace=("add_.Tensor",)), "add_.Tensor")
    x = torch.ones(3)
    assert bound(x, torch.full((3,), 2.0), alpha=2) is x
    assert x.tolist() == [5.0, 5.0, 5.0]
    ints = torch.ones(3, dtype=torch.int64)
    with pytest.raises(Unsupported, match="cannot be cast"):
        bound(ints, torch.full((3,), 0.5))
    assert ints.tolist() == [1, 1, 1]
    with pytest.raises(Unsupported, match="shape"):
        bound(torch.ones(3), torch.ones(2, 3))


def test_args_renames_or_drops_schema_arguments() -> None:
    """``args`` maps a schema name onto another parameter, or drops it with None."""

    def softmax(x: Tensor, axis: int) -> Tensor:
        return torch.softmax(x, axis)

    decl = _decl(softmax, "_softmax.default", args={"dim": "axis", "half_to_float": None})
    x = torch.randn(2, 3)
    torch.testing.assert_close(declare.bind(decl, "_softmax.default")(x, 1, False),
                               torch.softmax(x, 1))


def test_a_missing_parameter_is_named_with_the_fix() -> None:
    """A schema argument the function lacks fails at binding, naming both and the remedy."""
    with pytest.raises(DeclarationError, match=r"no parameter 'other'.*args="):
        declare.bind(_decl(_negate, "add.Tensor"), "add.Tensor")
    with pytest.raises(DeclarationError, match=r"no aten overload 'nosuchop\.default'"):
        declare.bind(_decl(_negate, "nosuchop.default"), "nosuchop.default")
    with pytest.raises(DeclarationError, match="has no out argument"):
        declare.bind(_decl(_negate, out=("neg.default",)), "neg.default")


def test_vendor_and_arch_declarations_win_only_where_they_apply() -> None:
    """A vendor override beats the portable declaration on that vendor, an arch override
    beats the vendor-wide one on that arch, and neither applies elsewhere."""

    def portable(x: Tensor) -> Tensor:
        return torch.neg(x)

    def vendor_wide(x: Tensor) -> Tensor:
        return torch.neg(x)

    def arch_only(x: Tensor) -> Tensor:
        return torch.neg(x)

    decls = [_decl(portable, "neg.default"),
             _decl(vendor_wide, "neg.default", vendor="acme"),
             _decl(arch_only, "neg.default", vendor="acme", arch="x2")]
    assert declare.table(decls, "other", "x2")["neg.default"][0].fn is portable
    assert declare.table(decls, "acme", "x1")["neg.default"][0].fn is vendor_wide
    assert declare.table(decls, "acme", "x2")["neg.default"][0].fn is arch_only


def test_two_declarations_of_one_overload_are_an_error_naming_both() -> None:
    """Equal-rank declarations of one overload cannot both be served."""

    def first(x: Tensor) -> Tensor:
        return x

    def second(x: Tensor) -> Tensor:
        return x

    with pytest.raises(DeclarationError, match=r"neg.default is declared twice.*first.*second"):
        declare.table([_decl(first, "neg.default"), _decl(second, "neg.default")], "cpu", "cpu")


def test_a_plugin_op_module_that_fails_to_import_is_an_error(monkeypatch: Any) -> None:
    """A broken plugin module is reported with its entry point, never skipped silently."""
    ep = importlib.metadata.EntryPoint("broken", "gemsops_no_such_plugin.ops",
                                       declare.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def entry_points(**kw: Any) -> Any:
        if kw.get("group") == declare.ENTRY_POINT_GROUP:
            return [ep]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(declare, "_LOADED", set())  # a first load in this process
    with pytest.raises(DeclarationError, match=r"'gemsops_no_such_plugin.ops'.*'broken'"):
        declare.load()
    assert "gemsops.ops" not in declare._LOADED  # a failed load is tried again next time


def test_load_walks_the_op_modules_once(monkeypatch: Any) -> None:
    """After the first load, later ones (every gemsops.<name> lookup asks) walk nothing."""
    declare.load()
    walked: list[str] = []
    monkeypatch.setattr(declare.pkgutil, "walk_packages",
                        lambda *a, **k: walked.append("walk") or iter(()))
    assert declare.load() == declare.declarations()
    assert walked == []


def test_every_served_overload_comes_from_a_declaration() -> None:
    """The registry's table is the declarations' table: each overload names the declared
    function it runs, and every public declaration is reachable as gemsops.<name>."""
    impls = registry.implementations()
    for overload in impls:
        assert registry.source(overload).startswith("gemsops."), overload
    public = [d for d in declare.declarations() if d.public]
    assert public
    for decl in public:
        assert getattr(gemsops, decl.name) is decl.fn
        assert decl.name in gemsops.__all__
