"""`gemsops trace`: a workload's aten calls, by who served them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemsops.cli import main

SCRIPT = """
import sys
import torch
import gemshal
dev = gemshal.current_device().torch_device
x = torch.randn(8, 8, device=dev)
y = (x + 1).softmax(-1)
z = torch.linalg.inv(x @ x.t() + 8 * torch.eye(8, device=dev))
c = torch.tensor([1j, 2.0], device=dev) * torch.tensor([3.0, 1j], device=dev)
with torch.autograd.profiler.record_function("marker"):
    pass
print("script ran with", sys.argv[1:])
"""


def test_trace_lists_served_handed_back_and_missing_ops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script whose softmax gemsops serves, whose complex product it hands back, and
    whose matrix inverse it does not implement: each lands in its section, with its
    count and the reason, on stdout and in the JSON; randn, a composite, is listed as one,
    its normal_ served; a profiler marker is listed as not aten, not as a gap; the script
    gets its arguments."""
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    out = tmp_path / "trace.json"
    assert main(["trace", "--script", str(script), "--json", str(out), "--", "--flag"]) == 0
    printed = capsys.readouterr().out
    assert "script ran with ['--flag']" in printed
    assert "  _softmax.default x1" in printed
    assert "mul.Tensor x1: dtype torch.complex64" in printed
    assert "  linalg_inv_ex.default x1" in printed
    report = json.loads(out.read_text())
    assert report["served"]["_softmax.default"] == 1
    assert {"overload": "mul.Tensor", "reason": "dtype torch.complex64",
            "calls": 1} in report["handed_back"]
    assert report["not_implemented"]["linalg_inv_ex.default"] == 1
    assert report["served"]["normal_.default"] >= 1  # inside randn, a composite
    assert "randn.default" in report["composite"]
    assert not set(report["not_implemented"]) & set(report["served"])
    assert not any("record_function" in op for op in report["not_implemented"])
    assert report["other"]["profiler::_record_function_enter_new.default"] == 1
    assert "not aten (gemsops serves aten ops only): profiler::" in printed


def test_trace_refuses_a_missing_script_and_a_bad_json_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script that does not exist, or a --json path in a missing folder, is one line on
    stderr and exit 2, before anything runs."""
    assert main(["trace", "--script", str(tmp_path / "none.py")]) == 2
    assert "no script" in capsys.readouterr().err
    assert main(["trace", "--json", str(tmp_path / "no" / "t.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_implicit_composite_under_inference_mode_counts_as_its_parts() -> None:
    """Under inference_mode a composite overload (softmax.int) reaches the op log before
    torch decomposes it; the trace reports it as composite, its served part (_softmax)
    as served, and nothing as unimplemented (HF generate runs this way)."""
    import torch

    import gemshal
    from gemsops.trace import trace

    x = torch.randn(4, 8, device=gemshal.current_device().torch_device)

    def workload() -> None:
        with torch.inference_mode():
            torch.softmax(x, -1)

    report = trace(workload)
    assert report.composite.get("softmax.int") == 1, report.composite
    assert report.served.get("_softmax.default") == 1, report.served
    assert "softmax.int" not in report.not_implemented, report.not_implemented
