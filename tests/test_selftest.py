"""`gemsops selftest`: outcomes per op and dtype, the JSON rows and the exit status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gemsops import registry
from gemsops.cli import main
from gemsops.errors import Unsupported

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _selftest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ops: str, dtype: str, examples: int
) -> tuple[int, str, Path]:
    """Run `gemsops selftest` with --json; return its exit code, output and JSON path."""
    out_json = tmp_path / "rows.json"
    code = main(
        ["selftest", "--ops", ops, "--dtypes", dtype, "--examples", str(examples),
         "--json", str(out_json)]
    )  # fmt: skip
    return code, capsys.readouterr().out, out_json


def _rows(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = json.loads(path.read_text())
    return {(row["op"], row["dtype"]): row for row in result["rows"]}


def test_passing_ops_are_reported_passed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ops that match torch print a passed row per dtype, a summary, and exit 0."""
    code, out, out_json = _selftest(tmp_path, capsys, "neg,sum", "float32", 3)
    assert code == 0
    assert "neg            float32   passed" in out
    assert "sum            float32   passed" in out
    assert "2 passed, 0 failed, 0 handed back, 0 not implemented" in out
    result = json.loads(out_json.read_text())
    assert result["summary"] == {
        "passed": 2, "failed": 0, "handed back": 0, "not implemented": 0
    }  # fmt: skip
    assert result["examples"] == 3
    assert result["device"]["vendor"]
    rows = _rows(out_json)
    assert set(rows) == {("neg", "float32"), ("sum", "float32")}
    assert rows["neg", "float32"]["outcome"] == "passed"
    assert rows["neg", "float32"]["examples"] >= 1


def test_wrong_values_are_failed_with_the_smallest_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An implementation returning wrong values is failed, with an example, and exits 1."""

    def off_by_one(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.neg.default(x) + 1

    monkeypatch.setitem(registry.implementations(), "neg.default", off_by_one)
    code, out, out_json = _selftest(tmp_path, capsys, "neg", "float32", 3)
    assert code == 1
    assert "neg            float32   failed" in out
    assert "smallest example: tensor(" in out
    row = _rows(out_json)["neg", "float32"]
    assert row["outcome"] == "failed"
    assert row["example"].startswith("tensor(")
    assert "float32" in row["example"]
    assert "not close" in row["detail"]


def test_handed_back_ops_are_reported_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An op gemsops hands back to torch on every call is reported so, with the reason."""

    def refuse(x: torch.Tensor) -> torch.Tensor:
        raise Unsupported("not on this test vendor")

    monkeypatch.setitem(registry.implementations(), "neg.default", refuse)
    code, out, out_json = _selftest(tmp_path, capsys, "neg", "float16", 2)
    assert code == 0
    assert "handed back" in out and "not on this test vendor" in out
    row = _rows(out_json)["neg", "float16"]
    assert row["outcome"] == "handed back"
    assert row["detail"] == "not on this test vendor"


def test_ops_the_vendor_leaves_to_torch_are_not_implemented(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An op in the vendor's unused list is reported not implemented, without running it."""
    monkeypatch.setattr(registry, "_vendor_unused", lambda: frozenset({"exp"}))
    code = main(["selftest", "--ops", "exp", "--dtypes", "float32", "--examples", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "exp            float32   not implemented" in out
    assert "left to torch on this vendor" in out


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [("--ops", "add,nope", "'nope'"), ("--dtypes", "float8", "'float8'")],
)
def test_unknown_ops_and_dtypes_exit_with_one_line(
    flag: str, value: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown --ops or --dtypes value exits 1 with one line naming it and the valid ones."""
    with pytest.raises(SystemExit) as exc:
        main(["selftest", flag, value])
    message = str(exc.value.code)
    assert message.startswith("gemsops selftest: unknown")
    assert named in message and "known:" in message
    assert "\n" not in message
    assert "float32" in message or "softmax" in message
    assert capsys.readouterr().out == ""


# The attention ops torch picks on other devices: the attention cases reach the one it
# picks here (``_scaled_dot_product_flash_attention_for_cpu`` on the CPU).
_ATTENTION_VARIANTS = frozenset(
    f"_scaled_dot_product_{kind}{suffix}"
    for kind in ("flash_attention", "efficient_attention", "cudnn_attention",
                 "flash_attention_for_cpu")
    for suffix in ("", "_backward")
)


def _served_ops() -> set[str]:
    """The op names `gemsops ops` lists, from the registry's declarations."""
    return {registry.base_name(overload) for overload in registry.implementations()}


def test_every_served_op_has_a_case_or_a_reason() -> None:
    """Every op gemsops serves is checked by a selftest case or named in UNCHECKED with
    its reason: a newly added op without a case fails here, by name."""
    from gemsops import selftest

    ops = _served_ops()
    covered = {name for case in selftest.CASES for name in case.aten}
    missing = sorted(ops - covered - set(selftest.UNCHECKED))
    assert missing == [], (
        f"ops served by gemsops with no case in gemsops/selftest/cases.py CASES (add one, or "
        f"name the op in UNCHECKED with the reason): {', '.join(missing)}"
    )
    stale = sorted((covered | set(selftest.UNCHECKED)) - ops)
    assert stale == [], f"names in selftest CASES or UNCHECKED that gemsops does not serve: {stale}"
    both = sorted(covered & set(selftest.UNCHECKED))
    assert both == [], f"ops both checked by a case and listed in UNCHECKED: {both}"
    assert all(reason.strip() for reason in selftest.UNCHECKED.values())


def test_every_case_passes_here_and_is_served() -> None:
    """Every op the conformance command checks passes on this device (in float32, or its
    first dtype for integer ops) and is served by gemsops: each case reaches at least one
    of the ops it names, and every op is reached by some case (but the attention kernels
    torch picks on other devices). A case whose op gemsops stopped serving, or whose
    inputs torch refuses, would show as not implemented or failed here first."""
    from gemsops import selftest

    rows = []
    for case in selftest.CASES:
        dtype = torch.float32 if torch.float32 in case.dtypes else case.dtypes[0]
        rows += selftest.run([case], [dtype], examples=2)
    assert len(rows) == len(selftest.CASES)
    bad = [(r.op, r.outcome, r.detail, r.example) for r in rows if r.outcome != "passed"]
    assert bad == []
    assert len({case.op for case in selftest.CASES}) == len(selftest.CASES)
    unreached = [
        (case.op, case.aten, row.served)
        for case, row in zip(selftest.CASES, rows, strict=True)
        if not set(case.aten) & set(row.served)
    ]
    assert unreached == [], "cases that reach none of the ops they name"
    reached = {name for row in rows for name in row.served}
    never = sorted(_served_ops() - reached - set(selftest.UNCHECKED) - _ATTENTION_VARIANTS)
    assert never == [], f"ops no case reaches on this device: {never}"


def test_new_case_names_are_accepted_by_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--ops` takes the names of the second pass's cases (backward, foreach, fused
    optimizer, random and integer ops) and runs them in their own dtypes."""
    code = main(["selftest", "--ops", "gelu_backward,_foreach_add,fused_adamw,bernoulli,"
                 "__lshift__", "--examples", "1", "--dtypes", "float32,int32"])
    out = capsys.readouterr().out
    assert code == 0
    for name, dtype in [("gelu_backward", "float32"), ("_foreach_add", "float32"),
                        ("fused_adamw", "float32"), ("bernoulli", "float32"),
                        ("__lshift__", "int32")]:
        assert any(line.split()[:3] == [name, dtype, "passed"] for line in out.splitlines())
    assert "5 passed, 0 failed" in out


def test_a_biased_random_stream_fails_the_random_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The random ops are checked by properties of any good stream: a bernoulli_ that
    ignores p (all ones) fails them, with the smallest example."""

    def all_ones(self: torch.Tensor, p: float = 0.5, *, generator: Any = None) -> torch.Tensor:
        with registry.running():
            return self.fill_(1.0)

    monkeypatch.setitem(registry.implementations(), "bernoulli_.float", all_ones)
    code, out, out_json = _selftest(tmp_path, capsys, "bernoulli", "float32", 5)
    assert code == 1
    assert "bernoulli      float32   failed" in out
    row = _rows(out_json)["bernoulli", "float32"]
    assert row["outcome"] == "failed"
    assert row["example"].startswith("tensor(")


def test_prepare_queues_the_checks_compiles_and_leaves_them_passing() -> None:
    """prepare() runs each check with its examples and first launches deferred (the pool
    held, as a device's compiles would be): every case queues at least one compile and
    its calls go to torch meanwhile; once the pool has run, the checks pass, served by
    gemsops. On the interpreter without a held pool it runs nothing."""
    import gemshal
    from gemshal import tune
    from gemshal.kernel import compile as _compile
    from gemsops.selftest.cases import CASES
    from gemsops.selftest.runner import prepare, run

    cases = [c for c in CASES if c.op in ("neg", "softmax", "mm")]
    assert len(cases) == 3
    if gemshal.current_device().interpreter:
        assert prepare(cases, [torch.float32]) == 0  # nothing to compile
    tune.clear_cache()  # a new tuning generation: what earlier tests launched is forgotten
    with _compile.hold() as release:
        before = _compile.submitted()
        started = prepare(cases, [torch.float32], examples=3)
        assert started >= len(cases)
        assert _compile.submitted() - before == started
        release()
        assert _compile.wait_compiles(60)
    rows = run(cases, [torch.float32], examples=3)
    assert [(r.op, r.outcome) for r in rows] == [(c.op, "passed") for c in cases]
    assert all(r.served for r in rows)


def test_a_light_check_calls_the_op_on_the_inputs_a_full_check_draws() -> None:
    """check(light=True), prepare()'s warm-up, draws the same inputs as the full check
    that follows it (so it meets the same kernels), calling the op on each and computing
    no reference (the full check's float64 reference calls are left out here)."""
    import attrs

    from gemsops.selftest.cases import CASES
    from gemsops.selftest.runner import check

    case = next(c for c in CASES if c.op == "softmax")
    seen: list[list[Any]] = [[], []]

    def recording(slot: int) -> Any:
        def call(*args: Any) -> Any:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if all(t.dtype == torch.float32 for t in tensors):  # not the float64 reference
                seen[slot].append([(tuple(t.shape), tuple(t.stride())) for t in tensors])
            return case.call(*args)
        return call

    check(attrs.evolve(case, call=recording(0)), torch.float32, examples=4, light=True)
    row = check(attrs.evolve(case, call=recording(1)), torch.float32, examples=4)
    assert row.outcome == "passed"
    assert seen[0] and seen[0] == seen[1][:len(seen[0])]
