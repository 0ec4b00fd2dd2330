"""gemsops' native replay (gemsops.native) on the CPU: the library is built with the
host compiler, launches are stubbed and the C++ kernel logs what it would launch
(GEMS_NATIVE=1 forces it on where the vendor names no native launch).

A replayed call never enters Python, so each test shows the replay through the log:
the pointers a replay passes are the new call's own tensors and the output it returns,
the constants are the new call's numbers, and a call of another structure is not
replayed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import gemsops
from gemshal import tune
from gemshal.kernel import stub_launches
from gemsops import native
from gemsops.testing.strategies import target_device


@pytest.fixture
def native_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("GEMS_NATIVE", "1")
    assert native.load(), native._WHY
    with stub_launches(), gemsops.use_gems():
        ops = torch.ops.gemsops_native
        ops.take_log()
        yield ops
    torch.ops.gemsops_native.take_log()


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(target_device())


def _launches(log: list[int]) -> list[list[int]]:
    """The log as one list per launch: [function, gx, gy, gz, threads, shared, *params]."""
    out, i = [], 0
    while i < len(log):
        n = log[i + 6]
        out.append([*log[i : i + 6], *log[i + 7 : i + 7 + n]])
        i += 7 + n
    return out


def _until_native(fn: Any, overload: str, tries: int = 6) -> None:
    """Call ``fn`` until the native kernel of ``overload`` has replayed it once."""
    for _ in range(tries):
        fn()
        if native.stats()[overload]["hits"]:
            return
    raise AssertionError(f"{overload} never replayed natively: {native.stats()[overload]}")


def test_the_setting_names_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMS_NATIVE takes auto (unset), 1 or 0; anything else is an error naming them.
    auto is on for a vendor record naming a native launch (NVIDIA's), off for one that
    names none (AMD's) and for the CPU interpreter; 1 and 0 decide for every vendor."""
    from gemshal.platforms import amd, cpu, nvidia

    monkeypatch.setenv("GEMS_NATIVE", "yes")
    with pytest.raises(ValueError, match=r"GEMS_NATIVE='yes'.*auto.*1 \(on\).*0 \(off\)"):
        native.wanted()
    monkeypatch.delenv("GEMS_NATIVE")
    assert native.wanted(nvidia.VENDOR) is True
    assert native.wanted(amd.VENDOR) is False
    assert native.wanted(cpu.VENDOR) is False
    for vendor in (nvidia.VENDOR, amd.VENDOR, cpu.VENDOR):
        monkeypatch.setenv("GEMS_NATIVE", "1")
        assert native.wanted(vendor) is True
        monkeypatch.setenv("GEMS_NATIVE", "0")
        assert native.wanted(vendor) is False


def test_a_seen_structure_replays_with_the_new_calls_tensors(native_on: Any) -> None:
    """Once add has been recorded for a structure, a call with new tensors of that
    structure is replayed: one launch whose pointers are the new inputs and the output
    it returns, and an output of torch's shape, strides and dtype."""
    x, y = _t(64, 32), _t(64, 32)
    _until_native(lambda: x + y, "add.Tensor")
    a, b = _t(64, 32), _t(64, 32)
    native_on.take_log()
    hits = native.stats()["add.Tensor"]["hits"]
    out = a + b
    assert native.stats()["add.Tensor"]["hits"] == hits + 1
    (launch,) = _launches(list(native_on.take_log()))
    params = launch[6:]
    assert {a.data_ptr(), b.data_ptr(), out.data_ptr()} <= set(params)
    assert out.data_ptr() not in (a.data_ptr(), b.data_ptr())
    assert (out.shape, out.stride(), out.dtype) == ((64, 32), (32, 1), torch.float32)


def test_another_structure_is_recorded_not_replayed(native_on: Any) -> None:
    """A call whose tensors differ in strides from every recorded one is a miss (the
    Python path runs it), not a replay of another structure's recipe."""
    x, y = _t(64, 32), _t(64, 32)
    _until_native(lambda: x + y, "add.Tensor")
    before = native.stats()["add.Tensor"]
    native_on.take_log()
    xt = _t(32, 64).t()
    out = xt + y
    after = native.stats()["add.Tensor"]
    assert after["hits"] == before["hits"]
    assert after["misses"] == before["misses"] + 1
    assert list(native_on.take_log()) == []
    assert out.shape == (64, 32)


def test_numbers_are_keyed_by_value(native_on: Any) -> None:
    """x * 2.0 and x * 3.0 are two structures: each replay passes its own number (as the
    float32 the kernel reads), never the other's."""
    x = _t(256)
    for value in (2.0, 3.0):
        _until_native(lambda v=value: x * v, "mul.Tensor")
    bits = {v: struct.unpack("<I", struct.pack("<f", v))[0] for v in (2.0, 3.0)}
    for value in (2.0, 3.0):
        native_on.take_log()
        hits = native.stats()["mul.Tensor"]["hits"]
        x * value
        assert native.stats()["mul.Tensor"]["hits"] == hits + 1
        (launch,) = _launches(list(native_on.take_log()))
        assert bits[value] in launch[6:]
        assert bits[5.0 - value] not in launch[6:]


def test_an_in_place_replay_returns_self(native_on: Any) -> None:
    """add_ replayed natively writes through self's pointer and hands self back."""
    y = _t(128)
    x = _t(128)
    _until_native(lambda: x.add_(y), "add_.Tensor")
    z = _t(128)
    native_on.take_log()
    got = z.add_(y)
    assert got is z
    (launch,) = _launches(list(native_on.take_log()))
    assert z.data_ptr() in launch[6:] and y.data_ptr() in launch[6:]


def test_record_counts_calls_served_natively(native_on: Any) -> None:
    """gemsops.record() counts a natively replayed call as served, like a Python one."""
    x, y = _t(16, 8), _t(16, 8)
    _until_native(lambda: x + y, "add.Tensor")
    with gemsops.record() as rec:
        for _ in range(3):
            x + y
    assert rec.served["add.Tensor"] == 3


def test_a_tuning_change_drops_every_recipe(native_on: Any) -> None:
    """The launches a recipe holds come from the tuning of their time: a change of the
    tuning generation (tune.clear_cache) sends the next call back to Python."""
    x, y = _t(16, 8), _t(16, 8)
    _until_native(lambda: x + y, "add.Tensor")
    before = native.stats()["add.Tensor"]
    tune.clear_cache()
    x + y
    after = native.stats()["add.Tensor"]
    assert after["misses"] == before["misses"] + 1
    assert after["hits"] == before["hits"]


def test_the_autograd_key_leaves_recorded_calls_to_python(native_on: Any) -> None:
    """cross_entropy is served at the autograd key: a call autograd must record (grad
    mode on, logits requiring grad) goes to the Python kernel, which builds the graph;
    the C++ kernel keys only calls with nothing to record: it replays them, or refuses
    them where the targets are on the CPU (their range is checked by value)."""
    from torch.nn import functional as F

    name = "cross_entropy_loss.default"
    x = _t(8, 16).requires_grad_()
    # Targets from a list: launches are stubbed here, so a served randint draws nothing.
    t = torch.tensor([(5 * i + 3) % 16 for i in range(8)]).to(x.device)
    before = native.stats()[name]
    loss = F.cross_entropy(x, t)
    assert loss.grad_fn is not None
    after = native.stats()[name]
    assert after["unkeyed"] == before["unkeyed"] + 1
    assert after["misses"] == before["misses"]
    with torch.no_grad():
        if t.is_cpu:
            for _ in range(2):
                assert F.cross_entropy(x, t).grad_fn is None
        else:
            # The grad-free forward is its own kernel variant (no row statistics): its
            # first launch is checked before a recipe is made, so one or two misses.
            _until_native(lambda: F.cross_entropy(x, t), name)
            assert F.cross_entropy(x, t).grad_fn is None
    last = native.stats()[name]
    if t.is_cpu:
        assert last["misses"] == after["misses"] + 1
        assert (last["refused"], last["hits"]) == (after["refused"] + 1, after["hits"])
    else:
        assert after["misses"] + 1 <= last["misses"] <= after["misses"] + 2
        assert (last["refused"], last["hits"]) == (after["refused"], after["hits"] + 2)


def test_a_norm_backward_replays_per_output_mask(native_on: Any) -> None:
    """rms_norm's backward takes a list of booleans (which gradients to make): it is
    keyed by value, so a replay of one mask never answers a call with another (that
    call is recorded anew, and gives None for the gradient it was not asked for)."""
    name = "_fused_rms_norm_backward.default"
    x, w, dy = _t(16, 64), _t(64), _t(16, 64)
    rstd = torch.ops.aten._fused_rms_norm(x, [64], w, 1e-6)[1]
    backward = torch.ops.aten._fused_rms_norm_backward
    _until_native(lambda: backward(dy, x, [64], rstd, w, [True, True]), name)
    before = native.stats()[name]
    dx, dw = backward(dy, x, [64], rstd, w, [True, False])
    assert dx is not None and dw is None
    assert native.stats()[name]["misses"] == before["misses"] + 1


def test_cross_entropy_replays_only_calls_of_structure_alone() -> None:
    """The replay memo takes a cross_entropy call only where its host code decides from
    structure: no graph to build, [C] or [N, C] logits, device targets, a contiguous
    weight."""
    from gemsops.ops.loss.cross_entropy import _forward_only

    x = torch.empty(4, 10, device="meta")
    t = torch.empty(4, dtype=torch.int64, device="meta")
    assert _forward_only(x, t)
    assert _forward_only(x[0], t[0])
    assert not _forward_only(x, torch.zeros(4, dtype=torch.int64))
    assert not _forward_only(torch.empty(4, 10, 3, device="meta"), t.view(4))
    assert not _forward_only(x, t, torch.empty(20, device="meta")[::2])
    assert _forward_only(x, t, torch.empty(10, device="meta"), 1, -100, 0.1)
    grad = x.clone().requires_grad_()
    assert not _forward_only(grad, t)
    with torch.no_grad():
        assert _forward_only(grad, t)


def test_out_overloads_and_unvouched_ops_stay_in_python() -> None:
    """A replay would not resize an out= tensor, and an op outside the pointwise
    modules that no memo vouches for may decide on values: neither is eligible."""
    from gemsops import registry

    assert native.eligible("add.Tensor", registry.source("add.Tensor"))
    assert not native.eligible("add.out", registry.source("add.out"))
    assert native.eligible("mm.default", registry.source("mm.default"))
    assert not native.eligible("nll_loss_forward.default",
                               registry.source("nll_loss_forward.default"))


def test_torch_serves_after_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the block the native kernel replays add; once it closes, no native kernel
    is registered and torch's own add answers (launches no longer stubbed)."""
    monkeypatch.setenv("GEMS_NATIVE", "1")
    with stub_launches(), gemsops.use_gems():
        x, y = _t(8), _t(8)
        _until_native(lambda: x + y, "add.Tensor")
        assert native.stats()["add.Tensor"]["hits"] >= 1
    assert native.stats() == {}
    assert torch.equal(x + y, torch.add(x.double(), y.double()).float())


def _schema(overload: str) -> Any:
    from gemsops import registry

    return registry.aten_overload(overload)._schema


def test_results_map_outputs_inputs_and_constants() -> None:
    """A recipe's results: a new tensor owning its storage is an output, an input handed
    back is that input (in-place), None for a Tensor return an undefined tensor."""
    from gemsops.native import recipe

    x, y = torch.randn(4), torch.randn(4)
    new = torch.empty(4)
    outs: list[torch.Tensor] = []
    assert recipe._results(_schema("add.Tensor"), new, [x, y], outs) == [recipe._R_OUTPUT, 0]
    assert outs == [new]
    assert recipe._results(_schema("add_.Tensor"), x, [x, y], []) == [recipe._R_INPUT, 0]
    got = recipe._results(_schema("_fused_rms_norm_backward.default"), (None, new), [x], [])
    assert got == [recipe._R_UNDEFINED, 0, recipe._R_OUTPUT, 0]


def test_results_refuse_views_and_shared_outputs() -> None:
    """A result that is a view of an input, a window of a bigger buffer, or one tensor
    returned twice cannot be allocated afresh by a replay: the key is refused."""
    from gemsops.native import recipe

    x = torch.randn(8)
    schema = _schema("add.Tensor")
    assert recipe._results(schema, x[2:6].clone()[1:], [x], []) is None  # offset window
    assert recipe._results(schema, x.view(2, 4), [x], []) is None  # a view of an input
    two = _schema("_fused_rms_norm.default")
    t = torch.empty(3)
    assert recipe._results(two, (t, t), [x], []) is None


def test_a_launch_pointer_maps_to_its_source_with_an_offset() -> None:
    """A pointer argument is the call's own tensor, an output, or a view of either at a
    fixed byte offset; a tensor made for the call is a workspace only when the op
    vouches for it, else the key is refused."""
    from gemsops.native import recipe

    x, out = torch.randn(16), torch.empty(16)
    work: list[torch.Tensor] = []
    assert recipe._pointer(x, [x], [out], work, False) == (recipe._INPUT, 0, 0)
    assert recipe._pointer(out, [x], [out], work, False) == (recipe._OUTPUT, 0, 0)
    assert recipe._pointer(x[4:], [x], [out], work, False) == (recipe._INPUT, 0, 16)
    temp = torch.empty(16)
    assert recipe._pointer(temp, [x], [out], work, False) is None
    assert recipe._pointer(temp, [x], [out], work, True) == (recipe._WORK, 0, 0)
    assert work == [temp]


def test_constants_take_the_width_triton_compiled() -> None:
    """An integer parameter is passed in its signature's width (two's complement), a
    float32 one as its float32 bits; a type the replay cannot pass refuses."""
    from gemsops.native import recipe

    assert recipe._param("i32", -1) == (1 << 32) - 1
    assert recipe._param("i64", -1) == -1
    assert recipe._param("i1", True) == 1
    assert recipe._param("fp32", 0.5) == struct.unpack("<I", struct.pack("<f", 0.5))[0]
    assert recipe._param("fp16", 0.5) is None
    assert recipe._param("*fp32", 3) is None


def test_the_command_reports_the_setting_and_the_library(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``gemsops native --build`` names the setting, the vendor's native launch, whether
    calls are served natively and the library's path (built); a bad setting is an error
    naming the valid values, with exit status 2."""
    from gemsops.cli import main
    from gemsops.native import build

    monkeypatch.setenv("GEMS_NATIVE", "0")
    assert main(["native", "--build"]) == 0
    out = capsys.readouterr().out
    assert "GEMS_NATIVE=0" in out
    assert "serves       no" in out
    assert f"{build.library_path()} (built)" in out
    monkeypatch.setenv("GEMS_NATIVE", "sometimes")
    assert main(["native"]) == 2
    assert "expected auto or unset" in capsys.readouterr().err


def test_a_background_build_swaps_the_native_kernels_in(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Where the library is not built yet (a fresh install) and the replay is not forced
    on, registering does not wait for the compiler: the Python path serves, and once
    the build is done the native kernels take over inside the same open block."""
    import threading

    from gemsops.native import build

    built = build.build(quiet=True)
    gate = threading.Event()
    missing = tmp_path / built.name

    def slow_build(*, quiet: bool = False) -> Any:
        assert gate.wait(30)
        return built

    monkeypatch.setattr(build, "library_path", lambda: missing)
    monkeypatch.setattr(build, "build", slow_build)
    monkeypatch.setattr(native, "_LOADED", [])
    monkeypatch.setattr(native, "_BUILDER", [])
    monkeypatch.setattr(native, "wanted", lambda vendor=None: True)
    monkeypatch.delenv("GEMS_NATIVE", raising=False)
    escaped: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    x, y = _t(16, 8), _t(16, 8)
    with stub_launches(), gemsops.use_gems():
        with gemsops.record() as rec:
            x + y
        assert rec.served["add.Tensor"] == 1
        assert native.building()
        assert "add.Tensor" not in native.stats()
        monkeypatch.setenv("GEMS_NATIVE", "1")  # stubbed launches replay only when forced
        gate.set()
        native._BUILDER[0].join(30)
        assert not native.building()
        assert escaped == []  # the swap raised nothing on the build's thread
        _until_native(lambda: x + y, "add.Tensor")
    assert native.stats() == {}


def test_serving_prints_no_override_message() -> None:
    """A process that turns the native replay on prints nothing about overriding torch's
    kernels (torch reports that once per process on stderr, outside Python's warnings);
    the op still runs natively and gives torch's answer."""
    import subprocess
    import sys

    code = (
        "import torch, gemsops\n"
        "from gemsops import native\n"
        "assert native.load(), native._WHY\n"
        "x = torch.arange(6.0)\n"
        "with gemsops.use_gems():\n"
        "    y = x + x\n"
        "assert torch.equal(y, torch.arange(6.0) * 2)\n"
        "print('ran')\n"
    )
    env = {**os.environ, "GEMS_NATIVE": "1"}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran" in done.stdout
    assert "Overriding a previously registered kernel" not in done.stderr
