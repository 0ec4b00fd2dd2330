"""Detection: every vendor's path through injected facts, conflicts and the trace."""

from __future__ import annotations

from typing import Any

import pytest

import gemshal
from gemshal import AmbiguousDeviceError, ConfigError, StaticFacts, UnknownVendorError
from gemshal.detect import detect

# Each row: vendor expected, and the facts a machine of that vendor shows in-process.
MACHINES = [
    # an H200: torch.cuda with an NVIDIA name, no HIP
    ("nvidia", StaticFacts(accel="cuda", backends={"cuda"}, names={"cuda": "NVIDIA H200"})),
    # an MI300X: a ROCm torch reports "cuda" but sets torch.version.hip
    ("amd", StaticFacts(hip="6.2.41133", accel="cuda", backends={"cuda"},
                        names={"cuda": "AMD Instinct MI300X"})),
    # a Hygon DCU: ROCm torch too, the name tells it apart from AMD
    ("hygon", StaticFacts(hip="5.7", accel="cuda", backends={"cuda"},
                          names={"cuda": "Hygon DCU K100_AI"})),
    ("metax", StaticFacts(accel="cuda", backends={"cuda"}, names={"cuda": "MetaX C500"})),
    ("iluvatar", StaticFacts(accel="cuda", backends={"cuda"}, names={"cuda": "Iluvatar BI-V150"})),
    ("kunlunxin", StaticFacts(accel="cuda", backends={"cuda"}, names={"cuda": "Kunlun P800"})),
    ("intel", StaticFacts(accel="xpu", backends={"xpu"},
                          names={"xpu": "Intel Data Center GPU Max 1550"})),
    ("ascend", StaticFacts(modules={"torch_npu"})),
    ("cambricon", StaticFacts(modules={"torch_mlu"})),
    ("mthreads", StaticFacts(modules={"torch_musa"})),
]  # fmt: skip


@pytest.mark.parametrize(("expected", "facts"), MACHINES, ids=[m[0] for m in MACHINES])
def test_in_process_probe_finds_each_vendor(expected: str, facts: StaticFacts) -> None:
    """Each built-in vendor is recognised from in-process facts alone, no subprocess."""
    found = detect(facts=facts, env={})
    assert found.vendor is gemshal.vendor(expected)
    assert found.stage == "probe"
    assert facts.ran == []
    chosen = [s for s in found.trace if s.verdict == "chosen"]
    assert len(chosen) == 1 and chosen[0].vendor == expected


def test_cuda_lookalikes_are_not_taken_for_nvidia() -> None:
    """NVIDIA declines a cuda device whose name belongs to a look-alike vendor."""
    for _, facts in MACHINES[1:6]:
        found = detect(facts=facts, env={})
        assert found.vendor.name != "nvidia"
        nvidia = [s for s in found.trace if s.vendor == "nvidia"]
        assert nvidia[0].verdict == "declined"


def test_two_claims_are_ambiguous_naming_both() -> None:
    """Two vendors claiming one machine raise AmbiguousDeviceError naming both."""
    facts = StaticFacts(modules={"torch_npu", "torch_mlu"})
    with pytest.raises(AmbiguousDeviceError) as caught:
        detect(facts=facts, env={})
    assert "ascend" in str(caught.value) and "cambricon" in str(caught.value)
    assert "GEMS_VENDOR" in str(caught.value)


def test_explicit_choice_settles_ambiguity() -> None:
    """An explicit choice wins even where probes would conflict."""
    facts = StaticFacts(modules={"torch_npu", "torch_mlu"})
    assert detect(facts=facts, env={}, explicit="cambricon").vendor.name == "cambricon"
    assert detect(facts=facts, env={"GEMS_VENDOR": "ascend"}).vendor.name == "ascend"


def test_explicit_beats_environment_beats_probes() -> None:
    """select() outranks GEMS_VENDOR, which outranks the probes."""
    facts = MACHINES[0][1]
    env = {"GEMS_VENDOR": "amd"}
    assert detect(facts=facts, env=env, explicit="intel").vendor.name == "intel"
    assert detect(facts=facts, env=env).vendor.name == "amd"
    assert detect(facts=facts, env={}).vendor.name == "nvidia"


def test_misspelt_gems_vendor_is_an_error() -> None:
    """An unknown GEMS_VENDOR is never ignored: the error names it and the valid vendors."""
    with pytest.raises(UnknownVendorError) as caught:
        detect(facts=StaticFacts(), env={"GEMS_VENDOR": "nvidai"})
    assert "GEMS_VENDOR" in str(caught.value) and "nvidia" in str(caught.value)


def test_triton_target_decides_when_probes_decline() -> None:
    """With no in-process sign, the active Triton driver's backend picks the vendor."""
    found = detect(facts=StaticFacts(triton="hip"), env={})
    assert (found.vendor.name, found.stage) == ("amd", "triton")


def test_command_probes_run_only_when_asked() -> None:
    """Vendor tools run only with GEMS_PROBE_COMMANDS=1, and then decide."""
    quiet = StaticFacts(commands={"npu-smi": "NPU 910B OK"})
    found = detect(facts=quiet, env={})
    assert found.vendor.name == "cpu" and quiet.ran == []
    asked = StaticFacts(commands={"npu-smi": "NPU 910B OK"})
    found = detect(facts=asked, env={"GEMS_PROBE_COMMANDS": "1"})
    assert (found.vendor.name, found.stage) == ("ascend", "command")
    assert ("npu-smi", "info") in asked.ran


def test_probe_commands_flag_rejects_other_values() -> None:
    """GEMS_PROBE_COMMANDS=yes is an error naming the valid values, not silently off."""
    with pytest.raises(ConfigError, match="0 or 1"):
        detect(facts=StaticFacts(), env={"GEMS_PROBE_COMMANDS": "yes"})


def test_nothing_found_falls_back_to_cpu_with_a_full_trace() -> None:
    """An empty machine falls back to the cpu vendor; the trace shows every stage."""
    found = detect(facts=StaticFacts(), env={})
    assert found.vendor.name == "cpu" and found.fell_back
    stages = [s.stage for s in found.trace]
    for stage in ("env", "probe", "triton", "command", "fallback"):
        assert stage in stages
    assert all(str(step).startswith("[") for step in found.trace)


def _probing(name: str, probe: Any) -> gemshal.VendorInfo:
    """A stand-in vendor whose only way to be found is ``probe``."""
    return gemshal.VendorInfo(name=name, display_name=name, device_type="meta",
                              dispatch_key="Meta", triton_backends=(name,), probe=probe)


def test_a_probe_that_raises_is_reported_not_fatal() -> None:
    """A probe raising an exception shows as an error line; detection goes on."""

    def bad_probe(facts: gemshal.Facts) -> gemshal.Claim | None:
        raise RuntimeError("driver exploded")

    bad = _probing("badprobe", bad_probe)
    found = detect(facts=StaticFacts(), env={}, candidates=(bad, gemshal.vendor("cpu")))
    assert found.vendor.name == "cpu"
    assert any(s.verdict == "error" and "driver exploded" in s.detail for s in found.trace)


def test_a_slow_probe_is_named_on_stderr_while_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An in-process probe running past PROBE_WARN_S gets a line on stderr naming its vendor
    and function and how to skip detection; the trace records how long it took; a quick
    probe prints nothing."""
    import time

    from gemshal import detect as detect_module

    monkeypatch.setattr(detect_module, "PROBE_WARN_S", 0.05)

    def slow_probe(facts: gemshal.Facts) -> gemshal.Claim | None:
        time.sleep(0.3)
        return None

    slow = _probing("slowprobe", slow_probe)
    found = detect(facts=StaticFacts(), env={}, candidates=(slow, gemshal.vendor("cpu")))
    assert found.vendor.name == "cpu"
    err = capsys.readouterr().err
    assert "vendor 'slowprobe'" in err and "slow_probe" in err and "GEMS_VENDOR" in err
    assert any(s.verdict == "slow" and s.vendor == "slowprobe" for s in found.trace)
    detect(facts=StaticFacts(), env={}, candidates=(gemshal.vendor("cpu"),))
    assert capsys.readouterr().err == ""
