"""Vendor launch options: what a VendorInfo may declare, how tuning files are checked
against it, and that the values reach Triton's launch."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
import triton
from fake_kernels import FakeJit
from strategies_tune import fresh_tune

import gemshal
from gemshal import tune
from gemshal.errors import ConfigError
from gemshal.kernel import kernel
from gemshal.tune_format import TuneSource, loads
from gemshal.tune_values import LAUNCH_KEYS, LAUNCH_OPTIONS
from gemshal.vendor import VendorInfo

AMD = tune.TuneContext(
    vendor="amd",
    arch="gfx942",
    interpreter=False,
    extra_launch_keys=("waves_per_eu", "matrix_instr_nonkdim", "kpack"),
)
MM = "[ops.mm]\nconfigs = [{ BLOCK_M = 64, waves_per_eu = 2, num_warps = 8 }]\n"


def _record(**fields: Any) -> VendorInfo:
    return VendorInfo(
        name="acme",
        display_name="Acme",
        device_type="cpu",
        dispatch_key="CPU",
        triton_backends=("acme",),
        **fields,
    )


# --- what a vendor may declare -----------------------------------------------------------


def test_amd_declares_the_options_of_tritons_hip_backend() -> None:
    """The built-in AMD record declares waves_per_eu, matrix_instr_nonkdim and kpack, each
    a field of Triton's HIPOptions (so the HIP backend takes it as a compile option); the
    other built-ins declare none."""
    from triton.backends.amd.compiler import HIPOptions

    amd = gemshal.vendor("amd")
    assert set(amd.launch_options) == {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
    assert set(amd.launch_options) <= set(HIPOptions.__dataclass_fields__)
    for option in amd.launch_options:
        assert "hip" in LAUNCH_OPTIONS[option].backends
    from gemshal.platforms import BUILTIN

    assert all(not v.launch_options for v in BUILTIN if v.name != "amd")


def test_known_options_are_compile_options_of_their_backends() -> None:
    """Every option gemshal knows for the cuda or hip backend is a field of that backend's
    options dataclass, where Triton's JITFunction.run sends the extra launch keywords."""
    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions

    fields = {"hip": HIPOptions.__dataclass_fields__, "cuda": CUDAOptions.__dataclass_fields__}
    for option in LAUNCH_OPTIONS.values():
        for backend in set(option.backends) & set(fields):
            assert option.name in fields[backend], (option.name, backend)


def test_unknown_launch_option_is_an_error_naming_it_and_the_valid_ones() -> None:
    """A record declaring a launch key gemshal's kernels cannot pass to Triton fails when
    it is made, naming the vendor, the key and every valid key."""
    with pytest.raises(ConfigError) as caught:
        _record(launch_options=("waves_per_eu", "wave_per_simd"))
    message = str(caught.value)
    assert "vendor 'acme'" in message and "'wave_per_simd'" in message
    for name in (*LAUNCH_OPTIONS, *LAUNCH_KEYS):
        assert name in message


def test_close_misspelling_gets_a_suggestion() -> None:
    """A near miss is named with the option it was probably meant to be."""
    with pytest.raises(ConfigError, match=r"'wave_per_eu' \(did you mean 'waves_per_eu'\?\)"):
        _record(launch_options=("wave_per_eu",))


@pytest.mark.parametrize("bad", [("num_warps",), ("kpack", "kpack")])
def test_standard_or_repeated_keys_are_refused(bad: tuple[str, ...]) -> None:
    """num_warps (accepted everywhere) and a repeated name are errors naming the key."""
    with pytest.raises(ConfigError, match=repr(bad[0])):
        _record(launch_options=bad)


def test_plugin_declaring_an_unknown_option_fails_to_load_with_that_error(
    isolated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin whose record declares an unknown key is a recorded load failure; asking
    for it raises PluginLoadError carrying the message that names the key."""
    import importlib.metadata
    import sys
    import types

    from gemshal import registry
    from gemshal.errors import PluginLoadError

    module = types.ModuleType("acme_vendor")
    module.make = lambda: _record(launch_options=("turbo",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "acme_vendor", module)
    ep = importlib.metadata.EntryPoint("acme", "acme_vendor:make", registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def entry_points(**kwargs: Any) -> Any:
        found = list(real(**kwargs))
        return [*found, ep] if kwargs.get("group") == registry.ENTRY_POINT_GROUP else found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with pytest.raises(PluginLoadError, match=r"unknown launch option 'turbo'.*waves_per_eu"):
        gemshal.vendor("acme")


# --- tuning files are checked against the vendor ------------------------------------------


def _source() -> TuneSource:
    return TuneSource("/tune/nvidia.toml", "vendor", "tests")


def test_option_the_vendor_does_not_declare_names_key_file_and_accepted_keys() -> None:
    """A tuning entry using a launch option its vendor does not declare is an error naming
    the key, the file, the vendor and the launch keys that vendor accepts."""
    with pytest.raises(ConfigError) as caught:
        loads(MM, _source(), vendor="nvidia")
    message = str(caught.value)
    assert message.startswith("/tune/nvidia.toml: [ops.mm] configs[0]: ")
    assert "'waves_per_eu' is not accepted on vendor 'nvidia'" in message
    assert "declares none" in message and "num_warps, num_stages, num_ctas, maxnreg" in message
    assert "hip" in message


def test_option_declared_by_the_vendor_is_accepted_and_its_value_checked() -> None:
    """On a vendor declaring it the key is a launch keyword; a bad value is named."""
    keys = AMD.extra_launch_keys
    config = loads(MM, _source(), vendor="amd", extra_launch_keys=keys).ops["mm"].configs[0]
    assert dict(config.launch) == {"waves_per_eu": 2}
    bad = MM.replace("waves_per_eu = 2", "kpack = 3")
    with pytest.raises(ConfigError, match=r"'kpack' must be one of 1, 2; got integer 3"):
        loads(bad, _source(), vendor="amd", extra_launch_keys=keys)
    with pytest.raises(ConfigError, match=r"'waves_per_eu' must be a non-negative integer"):
        loads(MM.replace("= 2", "= true"), _source(), vendor="amd", extra_launch_keys=keys)


def test_unknown_lower_case_key_lists_the_vendors_launch_keys() -> None:
    """A lower-case key that is no launch option at all lists the keys accepted here."""
    text = MM.replace("waves_per_eu", "wavez")
    with pytest.raises(ConfigError, match=r"unknown key 'wavez'.*maxnreg, waves_per_eu"):
        loads(text, _source(), vendor="amd", extra_launch_keys=("waves_per_eu",))


def test_heuristic_constant_for_an_undeclared_option_is_an_error() -> None:
    """A constant heuristic rule setting an option the vendor lacks is refused too."""
    text = "[ops.k.heuristics]\nwaves_per_eu = 2\n"
    with pytest.raises(ConfigError, match=r"heuristics: launch option 'waves_per_eu'"):
        loads(text, _source(), vendor="nvidia")
    assert loads(text, _source(), vendor="amd", extra_launch_keys=("waves_per_eu",))


def test_context_carries_the_vendors_launch_options() -> None:
    """tune.context_for (and so current_context and `gemshal config --vendor`) takes the
    vendor's launch options from its record."""
    ctx = tune.context_for(gemshal.vendor("amd"), "gfx942")
    assert ctx.extra_launch_keys == gemshal.vendor("amd").launch_options
    assert not ctx.interpreter
    assert tune.context_for(gemshal.vendor("nvidia"), "sm90").extra_launch_keys == ()
    with pytest.raises(ValueError, match="unknown launch option 'turbo'"):
        tune.TuneContext(vendor="x", arch="y", extra_launch_keys=("turbo",))


def test_lookup_on_a_vendor_without_the_option_names_the_file(tmp_path: Path) -> None:
    """Through the search path: amd.toml may use waves_per_eu; the same entry in
    nvidia.toml fails at lookup naming nvidia.toml."""
    (tmp_path / "amd.toml").write_text(MM)
    (tmp_path / "nvidia.toml").write_text(MM)
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        assert tune.lookup("mm", context=AMD).configs[0].launch == (("waves_per_eu", 2),)
        nvidia = attrs.evolve(AMD, vendor="nvidia", arch="sm90", extra_launch_keys=())
        with pytest.raises(ConfigError, match=r"nvidia\.toml: \[ops\.mm\].*'waves_per_eu'"):
            tune.lookup("mm", context=nvidia)


# --- the values reach the launch ----------------------------------------------------------


@pytest.fixture
def amd_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tuning directory, with a compiled-mode AMD context as the current one."""
    monkeypatch.setattr(tune, "current_context", lambda: AMD)
    monkeypatch.delenv("GEMS_AUTOTUNE", raising=False)
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        yield tmp_path


def test_single_config_launch_carries_the_options(amd_dir: Path) -> None:
    """One config: the kernel is launched with its launch options beside num_warps."""
    (amd_dir / "amd.toml").write_text(
        "[ops.k]\nconfigs = [{ BLOCK = 128, num_warps = 8, waves_per_eu = 2, kpack = 2 }]\n"
    )
    fake = FakeJit()
    kernel("k", key=["n"])(fake)[(1,)](torch.empty(4), 4)
    (launch,) = fake.launches
    assert launch["waves_per_eu"] == 2 and launch["kpack"] == 2 and launch["num_warps"] == 8


def test_autotuner_launches_carry_each_configs_options(
    amd_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several configs: Triton's autotuner launches each with its own options, and the
    chosen config's options stay on the later direct launches."""
    (amd_dir / "amd.toml").write_text(
        "[ops.k.grid]\nBLOCK = [64, 128]\nwaves_per_eu = [1, 2]\nmatrix_instr_nonkdim = [16]\n"
    )
    monkeypatch.setenv("GEMS_AUTOTUNE", "all")
    fake = FakeJit()

    def do_bench(kernel_call: Any, quantiles: Any) -> list[float]:
        kernel_call()
        last = fake.launches[-1]
        return [float(last["BLOCK"] + 10 * last["waves_per_eu"])] * 3  # 64/1 wins

    real = triton.autotune

    @functools.wraps(real)
    def spy(*args: Any, **kwargs: Any) -> Any:
        # No disk cache: Triton 3.6 looks for the JITFunction under the stand-in there.
        kwargs.pop("cache_results", None)
        return real(*args, **kwargs, do_bench=do_bench)

    monkeypatch.setattr(triton, "autotune", spy)
    k = kernel("k", key=["n"])(fake)
    k[(1,)](torch.empty(4), 4)
    tried = {(launch["BLOCK"], launch["waves_per_eu"]) for launch in fake.launches}
    assert tried == {(64, 1), (64, 2), (128, 1), (128, 2)}
    assert all(launch["matrix_instr_nonkdim"] == 16 for launch in fake.launches)
    fake.launches.clear()
    k[(1,)](torch.empty(4), 4)
    assert [(x["BLOCK"], x["waves_per_eu"]) for x in fake.launches] == [(64, 1)]


def test_first_config_launch_without_tuning_carries_the_options(
    amd_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GEMS_AUTOTUNE=0 and no table: the first config is launched, its options with it."""
    (amd_dir / "amd.toml").write_text("[ops.k.grid]\nBLOCK = [256, 64]\nwaves_per_eu = [3]\n")
    monkeypatch.setenv("GEMS_AUTOTUNE", "0")
    fake = FakeJit()
    kernel("k", key=["n"])(fake)[(1,)](torch.empty(4), 4)
    assert [(x["BLOCK"], x["waves_per_eu"]) for x in fake.launches] == [(256, 3)]
