"""gemshal.kernel: one decorator per kernel, lazy resolution, pinning, the tables-first policy,
benchmarking on request, and the rules contract."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
import triton
from fake_kernels import FakeJit
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_tune import fresh_tune

from gemshal import tune
from gemshal.errors import ConfigError
from gemshal.kernel import decorator as at
from gemshal.kernel import kernel as declare
from gemshal.kernel import plan
from gemshal.tune_format import TableRow, TuneConfig

ROOT = Path(__file__).resolve().parent.parent
INTERP = tune.TuneContext(vendor="cpu", arch="x86_64", interpreter=True)
GPU = tune.TuneContext(vendor="nvidia", arch="sm90", interpreter=False)


@pytest.fixture(scope="module")
def kernels() -> Iterator[SimpleNamespace]:
    """The test kernels, defined with Triton's interpreter on (the knob restored afterwards)."""
    saved = triton.knobs.runtime.interpret
    triton.knobs.runtime.interpret = True
    try:
        import triton.language as tl

        @triton.jit
        def add(x, y, out, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            if EVEN:
                tl.store(out + offs, tl.load(x + offs) + tl.load(y + offs))
            else:
                mask = offs < n
                a = tl.load(x + offs, mask=mask)
                tl.store(out + offs, a + tl.load(y + offs, mask=mask), mask=mask)

        yield SimpleNamespace(add=add)
    finally:
        triton.knobs.runtime.interpret = saved


@pytest.fixture
def tune_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A registered tuning directory, and the interpreter context as the current one."""
    monkeypatch.setattr(tune, "current_context", lambda: INTERP)
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        yield tmp_path


ADD_FILE = """
[ops.add]
configs = [{ BLOCK = 256, num_warps = 4 }, { BLOCK = 512, num_warps = 8 }, { BLOCK = 1024 }]
interpreter = { BLOCK = 64 }

[ops.add.heuristics]
EVEN = { divisible = ["n", "BLOCK"] }
"""


def _launch(kernel: Any, n: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    blocks: list[int] = []

    def grid(meta: dict[str, Any]) -> tuple[int]:
        blocks.append(meta["BLOCK"])
        return (triton.cdiv(n, meta["BLOCK"]),)

    kernel[grid](x, y, out, n)
    return out, x + y, blocks


def test_interpreter_pins_interpreter_config_and_is_correct(
    kernels: SimpleNamespace, tune_dir: Path
) -> None:
    """Under the interpreter a kernel whose op lists several configs pins one and is correct."""
    (tune_dir / "default.toml").write_text(ADD_FILE)
    kernel = declare("add", key=["n"])(kernels.add)
    for n in (64 * 3, 1000):
        out, want, blocks = _launch(kernel, n)
        torch.testing.assert_close(out, want)
        assert set(blocks) == {64}
    assert kernel.configs_for_current_device() == (TuneConfig({"BLOCK": 64}),)


def test_interpreter_pins_first_config_without_interpreter_entry(
    kernels: SimpleNamespace, tune_dir: Path
) -> None:
    """Without an ``interpreter`` entry the first listed config is pinned."""
    (tune_dir / "default.toml").write_text("[ops.add.grid]\nBLOCK = [128, 256]\nEVEN = [false]\n")
    kernel = declare("add", key=["n"])(kernels.add)
    out, want, blocks = _launch(kernel, 300)
    torch.testing.assert_close(out, want)
    assert blocks == [128]


def test_heuristics_from_file_and_python(kernels: SimpleNamespace, tune_dir: Path) -> None:
    """File and Python rules both set keywords; a file rule replaces a Python one of its name."""
    (tune_dir / "default.toml").write_text(
        "[ops.add]\nconfigs = [{ EVEN = false }]\n"
        "[ops.add.heuristics]\nBLOCK = { min = [{ next_power_of_2 = 'n' }, 128] }\n"
    )
    seen: list[dict[str, Any]] = []
    python_block = lambda a: seen.append(dict(a)) or 4  # noqa: E731 - replaced by the file rule
    k = declare("add", key=["n"], rules={"BLOCK": python_block})(kernels.add)
    out, want, blocks = _launch(k, 100)
    torch.testing.assert_close(out, want)
    assert blocks == [128] and seen == []
    k2 = declare("add", key=["n"], rules={"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})(kernels.add)
    out, want, blocks = _launch(k2, 256)
    torch.testing.assert_close(out, want)
    assert blocks == [128]


def test_clear_cache_makes_kernels_resolve_again(kernels: SimpleNamespace, tune_dir: Path) -> None:
    """After clear_cache() the next launch reads the files again and uses the new entry."""
    path = tune_dir / "default.toml"
    path.write_text("[ops.add]\nconfigs = [{ BLOCK = 64, EVEN = false }]\n")
    k = declare("add", key=["n"])(kernels.add)
    assert _launch(k, 100)[2] == [64]
    path.write_text("[ops.add]\nconfigs = [{ BLOCK = 32, EVEN = false }]\n")
    assert _launch(k, 100)[2] == [64]
    tune.clear_cache()
    assert _launch(k, 100)[2] == [32]


def test_nothing_read_at_decoration(
    kernels: SimpleNamespace, tune_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decorating reads no file nor resolves the device; the first launch reads, later ones not."""
    reads: list[Path] = []
    real = tune._read
    monkeypatch.setattr(tune, "_read", lambda p: reads.append(p) or real(p))
    contexts: list[int] = []
    monkeypatch.setattr(tune, "current_context", lambda: contexts.append(1) or INTERP)
    (tune_dir / "default.toml").write_text(ADD_FILE)
    kernel = declare("add", key=["n"])(kernels.add)
    assert reads == [] and contexts == []
    _launch(kernel, 128)
    assert len(reads) == 3
    _launch(kernel, 128)
    assert len(reads) == 3


def test_nothing_read_at_import(tmp_path: Path) -> None:
    """Importing gemshal.tune and gemshal.kernel and decorating a kernel opens no tuning file."""
    (tmp_path / "default.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 16 }]\n")
    script = textwrap.dedent(
        f"""
        import sys
        opened = []
        def hook(event, args):
            if event == "open" and str(args[0]).startswith({str(tmp_path)!r}):
                opened.append(str(args[0]))
        sys.addaudithook(hook)
        import gemshal.tune as tune, gemshal.kernel as gk
        import triton, triton.language as tl
        tune.add_tune_dir({str(tmp_path)!r}, origin="t")

        @gk.kernel("k", key=["n"])
        @triton.jit
        def k(x, n, BLOCK: tl.constexpr):
            pass

        assert opened == [], opened
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --- the compiled path, with a stand-in for @triton.jit ---------------------------------------


@pytest.fixture
def gpu_dir(tune_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tuning directory, with a compiled-mode GPU context as the current one."""
    monkeypatch.setattr(tune, "current_context", lambda: GPU)
    monkeypatch.delenv("GEMS_AUTOTUNE", raising=False)
    return tune_dir


def test_single_config_launches_directly(gpu_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one config no autotuner is built: the kernel is launched with that config."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 128, num_warps = 8 }]\n")
    monkeypatch.setattr(triton, "autotune", None)
    fake = FakeJit()
    declare("k", key=["n"])(fake)[(1,)](torch.empty(4), 4)
    assert fake.launches == [triton.Config({"BLOCK": 128}, num_warps=8).all_kwargs()]


def _benching(monkeypatch: pytest.MonkeyPatch, fake: FakeJit, best: int) -> list[int]:
    """Make Triton's autotuner time each config by its distance from BLOCK=best; the
    benchmarked BLOCKs are appended to the returned list."""
    benched: list[int] = []

    def do_bench(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        block = fake.launches[-1]["BLOCK"]
        benched.append(block)
        return [float(abs(block - best))] * 3

    real = triton.autotune

    @functools.wraps(real)
    def spy(*args: Any, **kwargs: Any) -> Any:
        assert kwargs.get("cache_results") is True
        kwargs.pop("cache_results")  # no disk cache for the stand-in
        return real(*args, **kwargs, do_bench=do_bench)

    monkeypatch.setattr(triton, "autotune", spy)
    return benched


def test_autotune_all_benchmarks_once_per_bucket_then_launches_the_choice(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=all: the autotuner runs at each bucket's first launch; later launches
    in the bucket take the best config without it, and tuned() reports each bucket."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [64, 128, 256]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "all")
    fake = FakeJit()
    benched = _benching(monkeypatch, fake, 128)
    k = declare("k", key=["n"])(fake)
    x = torch.empty(4)
    k[(1,)](x, 4)
    assert benched == [64, 128, 256]
    fake.launches.clear()
    for _ in range(3):
        k[(1,)](x, 4)
    assert [launch["BLOCK"] for launch in fake.launches] == [128] * 3
    assert len(benched) == 3
    k[(1,)](x, 8)
    assert len(benched) == 6
    k[(1,)](x, 7)  # 7 shares 8's size bucket: no second benchmark
    assert len(benched) == 6
    mine = {(r["when"]["n"], r["dtype"], r["config"]["BLOCK"]) for r in at.tuned()
            if r["op"] == "k"}
    assert mine == {(4, "float32", 128), (8, "float32", 128)}
    assert k.configs_for_current_device() == tuple(
        TuneConfig({"BLOCK": b}, num_warps=4) for b in (64, 128, 256)
    )


TABLE_FILE = """
[ops.k]
configs = [{ BLOCK = 64, num_warps = 4 }, { BLOCK = 128, num_warps = 4 }, { BLOCK = 256 }]
table = [
    { n = 1024, dtype = "float32", config = { BLOCK = 256, num_warps = 8 } },
    { n = 16, dtype = "float32", config = { BLOCK = 128, num_warps = 4 } },
]
"""


def test_tables_launch_the_rows_config_and_benchmark_nothing(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a bucket a table row covers launches that row's config; a bucket no row
    covers takes the nearest row's (log scale); nothing is benchmarked."""
    (gpu_dir / "nvidia.toml").write_text(TABLE_FILE)
    monkeypatch.setattr(triton, "autotune", None)  # building an autotuner would fail
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    for n in (1000, 13, 2000, 200, 64, 9):
        k[(1,)](torch.empty(4), n)
    got = [(launch["BLOCK"], launch["num_warps"]) for launch in fake.launches]
    # 1000 -> 1024 (row), 13 -> 16 (row), 2000 -> 2048 (nearest: 1024), 200 -> 256 (1024 is
    # 2 octaves away, 16 is 4), 64 -> 64 (16 is 2 octaves away, 1024 is 4), 9 -> 12 (the
    # half octave below 16: nearest 16)
    assert got == [(256, 8), (128, 4), (256, 8), (256, 8), (128, 4), (128, 4)]
    hows = {(c["when"]["n"], c["how"]) for c in k.choices()}
    assert hows == {(1024, "table"), (16, "table"), (2048, "nearest"), (256, "nearest"),
                    (64, "nearest"), (12, "nearest")}


def test_first_policy_launches_the_first_config_at_every_bucket_rows_or_not(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=first: a bucket a table row covers, and one it does not, both launch
    the entry's first config (one compile per kernel, as the self-test wants); nothing
    is benchmarked, and each choice says where it came from."""
    (gpu_dir / "nvidia.toml").write_text(TABLE_FILE)
    monkeypatch.setenv("GEMS_AUTOTUNE", "first")
    monkeypatch.setattr(triton, "autotune", None)  # building an autotuner would fail
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    for n in (1000, 9, 2000):
        k[(1,)](torch.empty(4), n)
    assert [(launch["BLOCK"], launch["num_warps"]) for launch in fake.launches] == [(64, 4)] * 3
    assert {c["how"] for c in k.choices()} == {"first"}


class _FakeTemplate(FakeJit):
    """A template kernel taking its element function as an argument (as OP)."""

    arg_names: ClassVar[list[str]] = ["x", "n", "OP", "BLOCK"]


def _gelu_body() -> None: ...


def _add_body() -> None: ...


def test_a_row_naming_the_element_function_serves_it_alone(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template kernel keyed by its element function: the row naming that function's
    name launches its config for it, and the row leaving the function out serves every
    other function at the same bucket."""
    (gpu_dir / "nvidia.toml").write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 64 }, { BLOCK = 128 }, { BLOCK = 256 }]\ntable = [\n"
        '    { n = 1024, dtype = "float32", config = { BLOCK = 128 } },\n'
        '    { n = 1024, OP = "_gelu_body", dtype = "float32", config = { BLOCK = 256 } },\n]\n'
    )
    monkeypatch.setattr(triton, "autotune", None)  # building an autotuner would fail
    fake = _FakeTemplate()
    k = declare("k", key=["n", "OP"])(fake)
    for body in (_gelu_body, _add_body, _gelu_body):
        k[(1,)](torch.empty(4), 1000, body)
    assert [launch["BLOCK"] for launch in fake.launches] == [256, 128, 256]
    hows = {(c["when"]["OP"], c["how"]) for c in k.choices()}
    assert hows == {("_gelu_body", "table"), ("_add_body", "table")}


def test_autotune_1_benchmarks_only_the_buckets_no_row_covers(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=1: a covered bucket launches its row; an uncovered one is benchmarked."""
    (gpu_dir / "nvidia.toml").write_text(TABLE_FILE)
    monkeypatch.setenv("GEMS_AUTOTUNE", "1")
    fake = FakeJit()
    benched = _benching(monkeypatch, fake, 64)
    k = declare("k", key=["n"])(fake)
    k[(1,)](torch.empty(4), 1024)
    assert benched == [] and fake.launches[-1]["BLOCK"] == 256
    k[(1,)](torch.empty(4), 300)
    assert sorted(benched) == [64, 128, 256]
    fake.launches.clear()
    k[(1,)](torch.empty(4), 300)
    assert [launch["BLOCK"] for launch in fake.launches] == [64]


def test_table_rows_must_name_key_arguments(gpu_dir: Path) -> None:
    """A table row naming something other than the kernel's key is an error naming both."""
    (gpu_dir / "nvidia.toml").write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 64 }]\ntable = [{ m = 8, config = { BLOCK = 64 } }]\n"
    )
    with pytest.raises(ConfigError, match=r"row 0: 'm' is not in the kernel's key; its key is n"):
        declare("k", key=["n"])(FakeJit())[(1,)](torch.empty(4), 4)


KEYS = st.sampled_from(["M", "N", "K"])


@given(
    st.dictionaries(KEYS, st.integers(0, 20), min_size=1),
    st.lists(st.dictionaries(KEYS, st.integers(0, 20), min_size=1), max_size=6),
)
def test_nearest_row_is_exact_when_one_matches_and_else_closest(
    mine: dict[str, int], rows_exp: list[dict[str, int]]
) -> None:
    """Property: nearest_row returns an exact row (and says so) when one has the bucket
    at every key it names, the one naming the most keys first (a row leaving a key out
    covers every value of it); otherwise the first row of smallest log-distance among
    rows naming only our keys, or None when no row does."""
    when = {k: 1 << e for k, e in mine.items()}
    rows = [TableRow({k: 1 << e for k, e in r.items()}, None, TuneConfig({"BLOCK": 1 << i}))
            for i, r in enumerate(rows_exp)]
    row, exact = plan.nearest_row(rows, when, "float32")
    usable = [(sum(abs(e - mine[k]) for k, e in r.items()), i) for i, r in enumerate(rows_exp)
              if set(r) <= set(mine)]
    exact_rows = sorted((-len(rows_exp[i]), i) for d, i in usable if d == 0)
    if exact_rows:
        assert exact and row is rows[exact_rows[0][1]]
    elif not usable:
        assert row is None and not exact
    else:
        assert not exact and row is rows[min(usable)[1]]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 20),
    st.integers(0, 3),
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3)), min_size=1, max_size=6),
)
def test_a_category_key_serves_only_rows_of_its_value(
    size: int, split: int, rows_exp: list[tuple[int, int]]
) -> None:
    """Property: with SPLIT as a category, nearest_row picks, among the rows whose SPLIT
    is the call's, the first of least log-distance in M (None when no row has it);
    without categories SPLIT is a size like M and any row may serve."""
    when = {"M": 1 << size, "SPLIT": 1 << split}
    rows = [TableRow({"M": 1 << m, "SPLIT": 1 << s}, None, TuneConfig({"BLOCK": 1 << i}))
            for i, (m, s) in enumerate(rows_exp)]
    row, exact = plan.nearest_row(rows, when, "float32", ("SPLIT",))
    same = [(abs(m - size), i) for i, (m, s) in enumerate(rows_exp) if s == split]
    if not same:
        assert row is None and not exact
    else:
        best = min(same)
        assert row is rows[best[1]] and exact == (best[0] == 0)
    anywhere = min((abs(m - size) + abs(s - split), i) for i, (m, s) in enumerate(rows_exp))
    assert plan.nearest_row(rows, when, "float32")[0] is rows[anywhere[1]]


def test_a_category_row_of_another_value_is_never_launched(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel declaring SPLIT a category launches the row of its own SPLIT value even
    where a row of another value is nearer in size, and the first config where no row
    has its value; without the declaration the nearer row serves."""
    (gpu_dir / "nvidia.toml").write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 64 }, { BLOCK = 16 }]\ntable = [\n"
        '    { n = 256, SPLIT = 2, config = { BLOCK = 32 } },\n'
        '    { n = 8192, SPLIT = 1, config = { BLOCK = 128 } },\n]\n')
    monkeypatch.setattr(triton, "autotune", None)
    class SplitJit(FakeJit):
        arg_names: ClassVar[list[str]] = ["x", "n", "SPLIT", "BLOCK"]

    for categories, want in (((), [32, 32, 32]), (["SPLIT"], [128, 32, 64])):
        fake = SplitJit()
        k = declare("k", key=["n", "SPLIT"], categories=categories)(fake)
        for n, split in ((256, 1), (256, 2), (256, 4)):
            k[(1,)](torch.empty(4), n, SPLIT=split)
        assert [launch["BLOCK"] for launch in fake.launches] == want, categories


def test_bucket_rounds_positive_ints_up_to_a_half_octave() -> None:
    """bucket: up to the next power of two or three quarters of one (1, 2, 3, 4, 6, 8,
    12, ...: 768 -> 768, 769 -> 1024, 1025 -> 1536); 0, bools and others unchanged."""
    got = [plan.bucket(v) for v in (1, 2, 3, 4, 5, 7, 9, 197, 768, 769, 1024, 1025, 6304)]
    assert got == [1, 2, 3, 4, 6, 8, 12, 256, 768, 1024, 1024, 1536, 8192]
    assert plan.bucket(0) == 0 and plan.bucket(True) is True and plan.bucket("x") == "x"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 40))
def test_a_half_octave_bucket_is_nearest_to_its_power_of_two_bucket(value: int) -> None:
    """Property: a value's bucket is the smallest half octave >= it, and of the powers of
    two around it, the one >= the value is strictly nearer on a log scale, so a table
    keyed by powers of two serves it the row a power-of-two bucket named exactly."""
    b = plan.bucket(value)
    power = 1 << (value - 1).bit_length()
    assert value <= b <= power
    assert b == power or (4 * b == 3 * power and value > power // 2)
    if b != power:
        assert math.log2(power / b) < math.log2(b / (power // 2))


def test_the_half_octave_below_a_power_of_two_launches_its_own_row(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls at 768 and at 1024 (one power-of-two bucket, two half-octave buckets) launch
    their own rows, in either order and again from the launch memo: 700 shares 768's
    row, 1000 shares 1024's."""
    (gpu_dir / "nvidia.toml").write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 64 }, { BLOCK = 16 }]\ntable = [\n"
        '    { n = 768, dtype = "float32", config = { BLOCK = 32 } },\n'
        '    { n = 1024, dtype = "float32", config = { BLOCK = 128 } },\n]\n')
    monkeypatch.setattr(triton, "autotune", None)
    fake = FakeJit()
    k = declare("k", key=["n"])(fake)
    for n in (1024, 768, 1000, 700, 768, 1024, 769):
        k[(1,)](torch.empty(4), n)
    assert [launch["BLOCK"] for launch in fake.launches] == [128, 32, 128, 32, 32, 128, 128]


def test_a_function_key_value_is_its_name() -> None:
    """bucket: a function (a JIT element function passed as a constexpr) stands for its
    __name__, the string a table row names it by."""

    def _gelu() -> None: ...

    assert plan.bucket(_gelu) == "_gelu"


def test_a_row_naming_a_flag_beats_the_row_that_leaves_it_out() -> None:
    """Property: of two exact rows at one bucket, the one naming the element function
    serves that function and the one leaving it out serves every other; the dtype-named
    row beats the dtype-free one at equal keys."""
    generic = TableRow({"SIZE_CLASS": 32}, "bfloat16", TuneConfig({"BLOCK": 1024}))
    gelu = TableRow({"SIZE_CLASS": 32, "OP": "_gelu"}, "bfloat16", TuneConfig({"BLOCK": 2048}))
    rows = [generic, gelu]
    assert plan.nearest_row(rows, {"SIZE_CLASS": 32, "OP": "_gelu"}, "bfloat16") == (gelu, True)
    assert plan.nearest_row(rows, {"SIZE_CLASS": 32, "OP": "add"}, "bfloat16") == (generic, True)
    # another dtype: no exact row; the nearest is a same-flag row of any dtype
    assert plan.nearest_row(rows, {"SIZE_CLASS": 32, "OP": "add"}, "float32") == (generic, False)
    anydtype = TableRow({"SIZE_CLASS": 32}, None, TuneConfig({"BLOCK": 512}))
    assert plan.nearest_row([anydtype, generic], {"SIZE_CLASS": 32}, "bfloat16") == (
        generic, True)


def test_python_rules_may_read_only_key_arguments(gpu_dir: Path) -> None:
    """A Python rule reading an argument outside the key is an error naming it (its value
    is not part of the launch key, so a cached launch could be wrong); one reading a key
    argument sees its exact value, not its bucket."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 64 }]\n")
    k = declare("k", key=["n"], rules={"BLOCK": lambda a: a["x"].numel()})(FakeJit())
    with pytest.raises(ConfigError, match=r"rule 'BLOCK'.*reads 'x'.*key="):
        k[(1,)](torch.empty(4), 4)
    fake = FakeJit()
    k2 = declare("k", key=["n"], rules={"BLOCK": lambda a: a["n"] * 2})(fake)
    k2[(1,)](torch.empty(4), 8)
    k2[(1,)](torch.empty(4), 7)  # the same bucket as 8, another value
    assert [launch["BLOCK"] for launch in fake.launches] == [16, 14]


def test_policy_values_and_errors() -> None:
    """GEMS_AUTOTUNE: unset and 0 mean tables, 1 uncovered buckets, all every bucket,
    first the first config everywhere; anything else is an error listing the valid
    values."""
    assert plan.policy({}) == plan.policy({"GEMS_AUTOTUNE": "0"}) == "tables"
    assert plan.policy({"GEMS_AUTOTUNE": "1"}) == "uncovered"
    assert plan.policy({"GEMS_AUTOTUNE": "all"}) == "all"
    assert plan.policy({"GEMS_AUTOTUNE": "first"}) == "first"
    with pytest.raises(ConfigError, match=r"0 or unset.*1.*all.*first.*'yes'"):
        plan.policy({"GEMS_AUTOTUNE": "yes"})


def test_autotune_off_launches_first_config_without_benchmarking(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=0 and no table: each bucket launches the entry's first config;
    nothing is benchmarked."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")
    benched: list[object] = []
    real = triton.autotune
    no_bench = lambda *b, **c: benched.append(1)  # noqa: E731
    monkeypatch.setattr(triton, "autotune", lambda *a, **k: real(*a, **k, do_bench=no_bench))
    fake = FakeJit()
    kernel = declare("k", key=["n"])(fake)
    for n in (4, 100, 4):
        kernel[(1,)](torch.empty(4), n)
    assert benched == []
    assert [launch["BLOCK"] for launch in fake.launches] == [256] * 3


def test_autotune_env_rejects_other_values(gpu_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMS_AUTOTUNE value other than 0, 1 or all is an error naming it."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "fast")
    with pytest.raises(ConfigError, match=r"GEMS_AUTOTUNE.*'fast'"):
        declare("k", key=["n"])(FakeJit())[(1,)](torch.empty(4), 4)


@pytest.mark.parametrize("value", ["2", "yes", "-1"])
@pytest.mark.parametrize("entry", ["configs = [{ BLOCK = 64 }]", "grid = { BLOCK = [64, 128] }"])
def test_autotune_env_is_checked_under_the_interpreter_too(
    kernels: SimpleNamespace,
    tune_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    entry: str,
) -> None:
    """An invalid GEMS_AUTOTUNE raises ConfigError on the interpreter, with one config or
    several, though the interpreter never benchmarks: a setting is never accepted and ignored."""
    (tune_dir / "default.toml").write_text(
        f"[ops.add]\n{entry}\n[ops.add.heuristics]\nEVEN = false\n"
    )
    monkeypatch.setenv("GEMS_AUTOTUNE", value)
    kernel = declare("add", key=["n"])(kernels.add)
    with pytest.raises(ConfigError, match=rf"GEMS_AUTOTUNE.*{value!r}"):
        _launch(kernel, 100)
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")
    out, want, _blocks = _launch(kernel, 100)
    torch.testing.assert_close(out, want)


# --- errors -----------------------------------------------------------------------------------


def test_decoration_errors_name_the_bad_value() -> None:
    """Mistakes visible at decoration raise at once, naming the bad value and the valid ones."""
    with pytest.raises(TypeError, match="not a str"):
        declare("k", key="n")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'m'.*x, n, BLOCK"):
        declare("k", key=["m"])(FakeJit())
    with pytest.raises(ValueError, match="reset_to_zero"):
        declare("k", reset_to_zero=["y"])(FakeJit())
    with pytest.raises(TypeError, match=r"@triton\.jit"):
        declare("k")(lambda x: x)
    with pytest.raises(ValueError, match="op"):
        declare("")
    with pytest.raises(ValueError, match="top_kk"):
        declare("k", prune={"top_kk": 1})
    with pytest.raises(TypeError, match="callable"):
        declare("k", rules={"BLOCK": 4})(FakeJit())  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="'Z'"):
        declare("k", rules={"Z": lambda a: 1})(FakeJit())
    with pytest.raises(ValueError, match=r"categories names 'x', not in the kernel's key \(n\)"):
        declare("k", key=["n"], categories=["x"])(FakeJit())
    with pytest.raises(TypeError, match="categories must be a list"):
        declare("k", key=["n"], categories="n")  # type: ignore[arg-type]


def test_launch_errors_name_file_op_and_key(gpu_dir: Path) -> None:
    """Entries unusable for the kernel raise ConfigError at first launch naming file, op and key."""
    path = gpu_dir / "default.toml"
    path.write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 1, BLOKC = 2 }]\n"
        "[ops.h.heuristics]\nBLOCK = 4\n"
        "[ops.r]\nconfigs = [{ BLOCK = 1 }]\n[ops.r.heuristics]\nBLOCK = { min = ['m', 4] }\n"
    )
    x = torch.empty(1)
    with pytest.raises(ConfigError, match=rf"{path}.*\[ops.k\].*'BLOKC'"):
        declare("k")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match=rf"{path}.*\[ops.h\].*no configs"):
        declare("h")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match=r"\[ops.r\] heuristics key 'BLOCK': 'm'"):
        declare("r")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match="'missing'"):
        declare("missing")(FakeJit())[(1,)](x, 1)


def test_autotune_off_skips_configs_the_device_cannot_run(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=0: a config that runs out of shared memory gives way to the next one."""
    from triton.runtime.errors import OutOfResources

    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")

    class Small(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            if kwargs["BLOCK"] > 64:
                raise OutOfResources(kwargs["BLOCK"] * 1024, 228 * 1024, "shared memory")
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    tried: list[int] = []

    class Counting(Small):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            tried.append(kwargs["BLOCK"])
            super().run(*args, grid=grid, warmup=warmup, **kwargs)

    fake = Counting()
    kernel = declare("k", key=["n"])(fake)
    kernel[(1,)](torch.empty(4), 4)
    kernel[(1,)](torch.empty(4), 4)
    kernel[(1,)](torch.empty(4), 100)  # a new size does not try the config that failed
    assert [launch["BLOCK"] for launch in fake.launches] == [64, 64, 64]
    assert tried == [256, 64, 64, 64]


def test_shipped_tune_files_name_gemsops_kernels_and_their_arguments() -> None:
    """Every entry of every file in gemsops/tune names an op some gemsops kernel tunes
    under, every config sets only that kernel's arguments, and every table row names
    only keys of that kernel's key (a row naming an argument outside it, such as a flag
    dropped from the key, would be refused on the device): a typo in a vendor file (read
    only on that vendor's machines) fails here, on any machine."""
    from pathlib import Path

    import gemsops.ops
    from gemshal.kernel.decorator import _KERNELS
    from gemshal.tune_format import TuneSource, loads
    from gemsops import declare

    declare.load()  # imports every op module, subpackages included
    kernels: dict[str, set[str]] = {}
    keys: dict[str, set[str]] = {}
    for kernel in list(_KERNELS):
        kernels.setdefault(kernel.op, set()).update(kernel.arg_names)
        keys.setdefault(kernel.op, set()).update(kernel.keys)
    tune_dir = Path(gemsops.ops.__path__[0]).parent / "tune"
    files = sorted(tune_dir.glob("*.toml"))
    assert {f.name for f in files} >= {"default.toml", "nvidia.toml", "nvidia-sm90.toml"}
    for path in files:
        source = TuneSource(path, "default", "gemsops")
        parsed = loads(path.read_text(), source)
        for op, entry in parsed.ops.items():
            assert op in kernels, f"{path.name}: [ops.{op}] tunes no gemsops kernel"
            rows = (row.config for row in entry.table)
            for config in (*entry.configs, *([entry.interpreter] if entry.interpreter else []),
                           *rows):
                unknown = {k for k, _ in config.meta} - kernels[op]
                assert not unknown, f"{path.name}: [ops.{op}] sets {unknown}"
            for i, row in enumerate(entry.table):
                outside = {k for k, _ in row.when} - keys[op]
                assert not outside, f"{path.name}: [ops.{op}] row {i} names {outside}"


class _OnDeviceOne(torch.Tensor):
    """A CPU tensor that says it lives on device 1 (the wing reads get_device())."""

    def get_device(self) -> int:  # type: ignore[override]
        return 1


def test_a_tensor_on_another_device_is_launched_under_its_guard(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With device 0 current, a launch whose first tensor is on device 1 enters
    device_guard for it, launches inside, and leaves the current device as it was; a
    tensor on the current device launches without a guard."""
    import contextlib

    from gemshal import device as device_mod

    (gpu_dir / "nvidia.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 64 }]\n")
    current = [0]
    guarded: list[int] = []

    @contextlib.contextmanager
    def guard(_device: Any) -> Iterator[None]:
        before = current[0]
        current[0] = 1
        guarded.append(current[0])
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(device_mod, "device_guard", guard)
    monkeypatch.setattr(device_mod, "device_module",
                        lambda: SimpleNamespace(current_device=lambda: current[0]))

    class Recording(FakeJit):
        def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            self.launches.append({"device": current[0], **kwargs})

    fake = Recording()
    k = declare("k", key=["n"])(fake)
    k[(1,)](torch.empty(4).as_subclass(_OnDeviceOne), 4)
    assert guarded == [1] and fake.launches[-1]["device"] == 1 and current == [0]

    class OnZero(torch.Tensor):
        def get_device(self) -> int:  # type: ignore[override]
            return 0

    k[(1,)](torch.empty(4).as_subclass(OnZero), 4)
    assert guarded == [1] and fake.launches[-1]["device"] == 0

    class ParameterOnOne(torch.nn.Parameter):
        def get_device(self) -> int:  # type: ignore[override]
            return 1

    # A Tensor subclass (a parameter) on device 1 is guarded too.
    k[(1,)](ParameterOnOne(torch.empty(4)), 4)
    assert guarded == [1, 1] and fake.launches[-1]["device"] == 1 and current == [0]


def test_direct_launches_check_the_device_too(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the direct path (here the stubbed launcher), a launch whose entry is made and
    checked still goes under the guard when its first tensor is on another device."""
    import contextlib

    from gemshal import device as device_mod
    from gemshal.kernel import launcher as launcher_mod

    (gpu_dir / "nvidia.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 64 }]\n")
    current = [0]
    fired: list[int] = []

    @contextlib.contextmanager
    def guard(_device: Any) -> Iterator[None]:
        before, current[0] = current[0], 1
        try:
            yield
        finally:
            current[0] = before

    def body(x: Any, n: Any, BLOCK: tl.constexpr) -> None:  # noqa: F821
        return None

    class WithConstexpr(FakeJit):
        def __init__(self) -> None:
            super().__init__()
            self.fn = body

    class Runtime(launcher_mod._StubRuntime):
        @staticmethod
        def get_device() -> int:
            return current[0]

    monkeypatch.setattr(device_mod, "device_guard", guard)
    monkeypatch.setattr(launcher_mod, "_StubRuntime", Runtime)
    monkeypatch.setattr(launcher_mod._StubKernel, "run",
                        staticmethod(lambda *a: fired.append(current[0])))
    monkeypatch.setattr(launcher_mod, "_STUBBED", [True])
    tune.clear_cache()
    k = declare("k", key=["n"])(WithConstexpr())
    for _ in range(3):  # make the entry, check it, then launch it directly on device 0
        k[(1,)](torch.empty(4), 4)
    assert fired == [0]
    there = torch.empty(4).as_subclass(_OnDeviceOne)
    for _ in range(3):  # device 0's entry is ready, but this tensor is on device 1
        k[(1,)](there, 4)
    stub = launcher_mod._STUBS[id(k.fn)]
    assert stub.counts["direct"] == 2 and stub.disabled is None
    assert fired == [0, 1] and current == [0]
