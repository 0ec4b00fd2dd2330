"""The autotune and heuristics decorators: lazy resolution, pinning, and the fast launch path."""

from __future__ import annotations

import functools
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
from hypothesis import given
from hypothesis import strategies as st
from strategies_tune import fresh_tune

from gemshal import autotune as at
from gemshal import tune
from gemshal.errors import ConfigError
from gemshal.tune_format import TuneConfig

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
    kernel = at.autotune("add", key=["n"])(at.heuristics("add")(kernels.add))
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
    kernel = at.autotune("add", key=["n"])(kernels.add)
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
    kernel = at.autotune("add")(at.heuristics("add", BLOCK=python_block)(kernels.add))
    out, want, blocks = _launch(kernel, 100)
    torch.testing.assert_close(out, want)
    assert blocks == [128] and seen == []
    kernel2 = at.heuristics("add", EVEN=lambda a: a["n"] % a["BLOCK"] == 0)(kernels.add)
    out, want, blocks = _launch(at.autotune("add")(kernel2), 256)
    torch.testing.assert_close(out, want)
    assert blocks == [128]


def test_clear_cache_makes_kernels_resolve_again(kernels: SimpleNamespace, tune_dir: Path) -> None:
    """After clear_cache() the next launch reads the files again and uses the new entry."""
    path = tune_dir / "default.toml"
    path.write_text("[ops.add]\nconfigs = [{ BLOCK = 64, EVEN = false }]\n")
    kernel = at.autotune("add", key=["n"])(kernels.add)
    assert _launch(kernel, 100)[2] == [64]
    path.write_text("[ops.add]\nconfigs = [{ BLOCK = 32, EVEN = false }]\n")
    assert _launch(kernel, 100)[2] == [64]
    tune.clear_cache()
    assert _launch(kernel, 100)[2] == [32]


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
    kernel = at.autotune("add", key=["n"])(at.heuristics("add")(kernels.add))
    assert reads == [] and contexts == []
    _launch(kernel, 128)
    assert len(reads) == 3
    _launch(kernel, 128)
    assert len(reads) == 3


def test_nothing_read_at_import(tmp_path: Path) -> None:
    """Importing gemshal.tune and gemshal.autotune and decorating a kernel opens no tuning file."""
    (tmp_path / "default.toml").write_text("[ops.k]\nconfigs = [{ BLOCK = 16 }]\n")
    script = textwrap.dedent(
        f"""
        import sys
        opened = []
        def hook(event, args):
            if event == "open" and str(args[0]).startswith({str(tmp_path)!r}):
                opened.append(str(args[0]))
        sys.addaudithook(hook)
        import gemshal.tune as tune, gemshal.autotune as at
        import triton, triton.language as tl
        tune.add_tune_dir({str(tmp_path)!r}, origin="t")

        @at.autotune("k", key=["n"])
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
    at.autotune("k", key=["n"])(fake)[(1,)](torch.empty(4), 4)
    assert fake.launches == [triton.Config({"BLOCK": 128}, num_warps=8).all_kwargs()]


def test_several_configs_tune_once_per_key_then_launch_directly(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autotuner runs at each key's first launch; later launches skip it for the best config."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [64, 128, 256]\nnum_warps = [4]\n")
    fake = FakeJit()
    benched: list[int] = []

    def do_bench(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        block = fake.launches[-1]["BLOCK"]
        benched.append(block)
        return [float(abs(block - 128))] * 3

    real = triton.autotune
    asked: dict[str, Any] = {}

    @functools.wraps(real)
    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.update(kwargs)
        return real(*args, **kwargs, do_bench=do_bench)

    monkeypatch.setattr(triton, "autotune", spy)
    kernel = at.autotune("k", key=["n"])(fake)
    x = torch.empty(4)
    kernel[(1,)](x, 4)
    assert benched == [64, 128, 256]
    assert asked["cache_results"] is True
    tuner = kernel._plan.tuner  # type: ignore[union-attr]
    tuner_runs = 0
    real_run = tuner.run

    def counting_run(*args: Any, **kwargs: Any) -> Any:
        nonlocal tuner_runs
        tuner_runs += 1
        return real_run(*args, **kwargs)

    tuner.run = counting_run
    fake.launches.clear()
    for _ in range(3):
        kernel[(1,)](x, 4)
    assert tuner_runs == 0
    assert [launch["BLOCK"] for launch in fake.launches] == [128] * 3
    kernel[(1,)](x, 8)
    assert tuner_runs == 1 and len(benched) == 6
    kernel[(1,)](x, n=8)
    assert tuner_runs == 1
    kernel[(1,)](x, 7)  # 7 shares 8's size bucket: no second benchmark
    assert tuner_runs == 1 and len(benched) == 6
    mine = {(r["key"], r["config"]["BLOCK"]) for r in at.tuned() if r["op"] == "k"}
    # The kernel is named by the first function down its .fn links (the fake's own has none).
    assert {r["kernel"] for r in at.tuned() if r["op"] == "k"} == {"<lambda>"}
    assert {("4, torch.float32", 128), ("8, torch.float32", 128)} <= mine
    assert not any(key.startswith("7,") for key, _ in mine)  # 7 is in 8's bucket
    assert kernel.configs_for_current_device() == tuple(
        TuneConfig({"BLOCK": b}, num_warps=4) for b in (64, 128, 256)
    )


def _triton_key(
    arg_names: list[str], keys: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    # Copied from triton.runtime.autotuner.Autotuner.run (Triton 3.9).
    nargs = dict(zip(arg_names, args))  # noqa: B905 - verbatim
    all_args = {**nargs, **kwargs}
    _args = {k: v for (k, v) in all_args.items() if k in arg_names}
    key = [_args[key] for key in keys if key in _args]
    for _, arg in _args.items():
        if hasattr(arg, "dtype"):
            key.append(str(arg.dtype))
    return tuple(key)


DTYPES = st.sampled_from([torch.float32, torch.float16, torch.int64])


@given(
    st.lists(
        st.one_of(st.integers(0, 3), DTYPES.map(lambda d: torch.empty(0, dtype=d))),
        min_size=4,
        max_size=4,
    ),
    st.integers(0, 4),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True),
)
def test_fast_path_key_is_tritons_key(values: list[Any], split: int, keys: list[str]) -> None:
    """Property: the fast-path key is Triton's autotuner key with dtype objects for their names
    and integers rounded up to a power of two (their size bucket)."""

    class Four(FakeJit):
        arg_names: ClassVar[list[str]] = ["a", "b", "c", "d"]

    kernel = at.autotune("k", key=keys)(Four())
    names = Four.arg_names
    args, kwargs = tuple(values[:split]), dict(zip(names[split:], values[split:], strict=True))
    ours = kernel._key(args, kwargs)
    bucket = {0: 0, 1: 1, 2: 2, 3: 4}
    assert tuple(str(p) if isinstance(p, torch.dtype) else p for p in ours) == tuple(
        bucket[p] if isinstance(p, int) else p for p in _triton_key(names, keys, args, kwargs)
    )


def test_autotune_off_launches_first_config_without_benchmarking(
    gpu_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=0: each key launches the entry's first config; nothing is benchmarked."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")
    benched: list[object] = []
    real = triton.autotune
    no_bench = lambda *b, **c: benched.append(1)  # noqa: E731
    monkeypatch.setattr(triton, "autotune", lambda *a, **k: real(*a, **k, do_bench=no_bench))
    fake = FakeJit()
    kernel = at.autotune("k", key=["n"])(fake)
    for n in (4, 100, 4):
        kernel[(1,)](torch.empty(4), n)
    assert benched == []
    assert [launch["BLOCK"] for launch in fake.launches] == [256] * 3


def test_autotune_env_rejects_other_values(gpu_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMS_AUTOTUNE value other than 0 or 1 is an error naming it."""
    (gpu_dir / "nvidia.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nnum_warps = [4]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "fast")
    with pytest.raises(ConfigError, match=r"GEMS_AUTOTUNE.*'fast'"):
        at.autotune("k", key=["n"])(FakeJit())[(1,)](torch.empty(4), 4)


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
    kernel = at.autotune("add", key=["n"])(at.heuristics("add")(kernels.add))
    with pytest.raises(ConfigError, match=rf"GEMS_AUTOTUNE.*{value!r}"):
        _launch(kernel, 100)
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")
    out, want, _blocks = _launch(kernel, 100)
    torch.testing.assert_close(out, want)


# --- errors -----------------------------------------------------------------------------------


def test_decoration_errors_name_the_bad_value() -> None:
    """Mistakes visible at decoration raise at once, naming the bad value and the valid ones."""
    with pytest.raises(TypeError, match="not a str"):
        at.autotune("k", key="n")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'m'.*x, n, BLOCK"):
        at.autotune("k", key=["m"])(FakeJit())
    with pytest.raises(ValueError, match="reset_to_zero"):
        at.autotune("k", reset_to_zero=["y"])(FakeJit())
    with pytest.raises(TypeError, match=r"@triton\.jit"):
        at.autotune("k")(lambda x: x)
    with pytest.raises(ValueError, match="op"):
        at.autotune("")
    with pytest.raises(ValueError, match="top_kk"):
        at.autotune("k", prune={"top_kk": 1})
    with pytest.raises(TypeError, match="callable"):
        at.heuristics("k", BLOCK=4)(FakeJit())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'Z'"):
        at.heuristics("k", Z=lambda a: 1)(FakeJit())


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
        at.autotune("k")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match=rf"{path}.*\[ops.h\].*no configs"):
        at.autotune("h")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match=r"\[ops.r\] heuristics key 'BLOCK': 'm'"):
        at.heuristics("r")(FakeJit())[(1,)](x, 1)
    with pytest.raises(ConfigError, match="'missing'"):
        at.autotune("missing")(FakeJit())[(1,)](x, 1)


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
    kernel = at.autotune("k", key=["n"])(fake)
    kernel[(1,)](torch.empty(4), 4)
    kernel[(1,)](torch.empty(4), 4)
    kernel[(1,)](torch.empty(4), 100)  # a new size does not try the config that failed
    assert [launch["BLOCK"] for launch in fake.launches] == [64, 64, 64]
    assert tried == [256, 64, 64, 64]


def test_shipped_tune_files_name_gemsops_kernels_and_their_arguments() -> None:
    """Every entry of every file in gemsops/tune names an op some gemsops kernel tunes
    under, and every config sets only that kernel's arguments: a typo in a vendor file
    (read only on that vendor's machines) fails here, on any machine."""
    from pathlib import Path

    import gemsops.ops
    from gemshal.autotune import _KERNELS
    from gemshal.tune_format import TuneSource, loads
    from gemsops import declare

    declare.load()  # imports every op module, subpackages included
    kernels: dict[str, set[str]] = {}
    for kernel in list(_KERNELS):
        kernels.setdefault(kernel.op, set()).update(kernel.arg_names)
    tune_dir = Path(gemsops.ops.__path__[0]).parent / "tune"
    files = sorted(tune_dir.glob("*.toml"))
    assert {f.name for f in files} >= {"default.toml", "nvidia.toml", "nvidia-sm90.toml"}
    for path in files:
        source = TuneSource(path, "default", "gemsops")
        parsed = loads(path.read_text(), source)
        for op, entry in parsed.ops.items():
            assert op in kernels, f"{path.name}: [ops.{op}] tunes no gemsops kernel"
            for config in (*entry.configs, *([entry.interpreter] if entry.interpreter else [])):
                unknown = {k for k, _ in config.meta} - kernels[op]
                assert not unknown, f"{path.name}: [ops.{op}] sets {unknown}"
