"""The benchmark harness runs end to end in its tiny CPU mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gemshal
from gemsops import bench_model
from gemsops.cli import main


def test_bench_tiny_mode_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gemsops bench --tiny` times torch and gemsops per case and writes JSON rows."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--no-host", "--ops", "add,softmax", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "geometric mean vs torch" in printed
    result = json.loads(out.read_text())
    # add: the flat add and the broadcast row; softmax: forward, then forward + backward
    assert sorted(r["op"] for r in result["rows"]) == ["add", "add", "softmax", "softmax"]
    assert "model" not in result  # a run of selected ops leaves the model case out
    for row in result["rows"]:
        assert row["torch_ms"] > 0 and row["gemsops_ms"] > 0
        assert row["vs_torch"] == pytest.approx(row["torch_ms"] / row["gemsops_ms"])
    assert result["copy_gbs"] > 0


def test_bench_tiny_mode_runs_the_matmul_and_backward_kinds(tmp_path: Path) -> None:
    """The linear, transposed-bmm and forward + backward rows time on both sides."""
    out = tmp_path / "bench.json"
    ops = "linear,bmm,rms_norm"
    assert main(["bench", "--tiny", "--no-host", "--ops", ops, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == [
        "bmm 2x16x16x16 (b transposed)", "linear 4x16x16 +bias", "rms_norm fwd+bwd 4x64"]
    assert all(r["torch_ms"] > 0 and r["gemsops_ms"] > 0 for r in rows)
    assert rows[1]["torch_tflops"] > 0 and rows[2]["torch_gbs"] > 0


def test_bench_match_selects_cases_by_label(tmp_path: Path) -> None:
    """--match keeps the cases whose label matches the regex; a bad regex or one that
    matches nothing stops the run with a message naming it."""
    out = tmp_path / "bench.json"
    args = ["bench", "--tiny", "--no-host", "--match", "^(linear|bmm) ", "--json", str(out)]
    assert main(args) == 0
    labels = [r["case"] for r in json.loads(out.read_text())["rows"]]
    assert labels == ["bmm 2x16x16x16 (b transposed)", "linear 4x16x16 +bias"]
    with pytest.raises(SystemExit, match=r"--match '\(': not a regex"):
        main(["bench", "--tiny", "--no-host", "--match", "("])
    with pytest.raises(SystemExit, match="with a label matching 'nothing'"):
        main(["bench", "--tiny", "--no-host", "--match", "nothing"])


def test_bench_rejects_unknown_ops() -> None:
    """An unknown --ops name stops the run with a message listing the known ops."""
    with pytest.raises(SystemExit, match="known"):
        main(["bench", "--ops", "nonsense"])


def test_bench_table_renders_again_from_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--from-json` prints the same table from a saved run, without timing anything."""
    out = tmp_path / "bench.json"
    assert main(["bench", "--tiny", "--no-host", "--ops", "sum", "--json", str(out)]) == 0
    first = capsys.readouterr().out
    assert main(["bench", "--from-json", str(out)]) == 0
    again = capsys.readouterr().out
    table = first[first.index("copy bandwidth") :]
    assert table.strip() and table in again


def test_kernel_profile_names_each_side_and_its_busiest_ops(tmp_path: Path) -> None:
    """`--profile-kernels` writes, per case and side, the profiler's table of what ran."""
    out = tmp_path / "kernels.txt"
    args = ["bench", "--tiny", "--no-host", "--ops", "sum", "--profile-kernels", str(out)]
    assert main(args) == 0
    text = out.read_text()
    for side in ("torch", "gemsops"):
        assert f"== sum 4x64 (float32): {side}," in text
    assert text.count("aten::sum") >= 2  # torch's call, and the aten call gemsops served


def test_model_case_matches_torch_and_reports_graph_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model --tiny` trains the tiny Llama step on both sides: same loss and gradients as
    torch, gemsops serving its ops, timings per side; graph replay timed on a device with
    graphs, skipped with the reason on the interpreter."""
    # torch against gemsops only: a peer's kernels would add their compile time here.
    monkeypatch.setattr(bench_model, "flag_gems", lambda: None)
    out = tmp_path / "model.json"
    assert main(["bench", "--model", "--tiny", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["rows"] == [] and "host_us" not in result  # the model case alone
    model = result["model"]
    assert model["config"]["layers"] == 1 and model["config"]["dtype"] == "float32"
    for entry in (model["eager_step"], model["eager_forward"]):
        assert entry["torch_ms"] > 0 and entry["gemsops_ms"] > 0
        assert entry["gemsops_over_torch"] == pytest.approx(entry["gemsops_ms"] / entry["torch_ms"])
    assert model["loss"]["gemsops"] == pytest.approx(model["loss"]["torch"], abs=1e-5)
    assert model["loss_diff"]["gemsops"] < 1e-5
    assert model["max_grad"] > 0 and model["max_grad_diff"]["gemsops"] < 1e-5
    for op in ("mm.default", "bmm.default", "_softmax.default", "_fused_rms_norm.default",
               "silu.default", "cross_entropy_loss.default", "embedding.default"):  # fmt: skip
        assert op in model["gemsops_served"], op
    assert model["gemsops_fallbacks"] == {}
    assert "model eager step: torch " in printed
    if gemshal.current_device().interpreter:
        assert "interpreter" in model["graph_forward"]["skipped"]
        assert not any(k.endswith("_ms") for k in model["graph_forward"])
        assert "model graph forward: skipped (the Triton interpreter" in printed
    else:
        graph = model["graph_forward"]
        assert graph["torch_ms"] > 0 and graph["gemsops_ms"] > 0, graph


def test_model_lines_render_from_saved_json_with_graph_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--from-json` prints a saved model case: times, ratios to torch, graph replay, checks."""
    timing = {"torch_ms": 2.0, "gemsops_ms": 2.5, "gemsops_over_torch": 1.25}
    model = {
        "config": {"batch": 4, "seq": 512, "dim": 1024, "layers": 4, "heads": 8,
                   "hidden": 2816, "vocab": 32000, "dtype": "bfloat16", "warmup": 3,
                   "steps": 10},
        "eager_step": {"torch_ms": 18.1, "gemsops_ms": 20.3, "gemsops_over_torch": 20.3 / 18.1},
        "eager_forward": timing,
        "graph_forward": {"skipped": None, "torch_ms": 1.5, "gemsops_ms": 1.2,
                          "gemsops_over_torch": 0.8, "gemsops_loss_diff": 0.001,
                          "torch_loss_diff": 0.0},
        "loss": {"torch": 10.5, "gemsops": 10.501},
        "loss_diff": {"gemsops": 0.001},
        "gemsops_served": ["mm.default"],
        "gemsops_fallbacks": {},
        "max_grad": 0.5,
        "max_grad_diff": {"gemsops": 0.002},
    }  # fmt: skip
    saved = {"device": {"name": "H200"}, "torch": "t", "triton": "t", "flag_gems": None,
             "copy_gbs": 0.0, "rows": [], "model": model}  # fmt: skip
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(saved))
    assert main(["bench", "--from-json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "model eager step: torch 18.1 ms, gemsops 20.3 ms (1.12x torch's time)" in printed
    assert "model graph forward: torch 1.5 ms, gemsops 1.2 ms (0.80x torch's time)" in printed
    assert "gemsops |loss diff| 0.001, max |grad diff| 0.002" in printed
    assert "against eager torch: gemsops 0.001, torch 0" in printed
    assert "copy bandwidth" not in printed  # no rows: no table


def test_bench_from_json_missing_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """`--from-json` of a file that does not exist exits with one line naming the file and
    the problem, no traceback."""
    missing = tmp_path / "nope.json"
    with pytest.raises(SystemExit, match=r"--from-json .*nope\.json: cannot read it: No such file"):
        main(["bench", "--from-json", str(missing)])


def test_bench_from_json_malformed_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """`--from-json` of a file that is not JSON, or not a saved run, names the file and what
    is wrong with it."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=r"bad\.json: not valid JSON"):
        main(["bench", "--from-json", str(bad)])
    other = tmp_path / "other.json"
    other.write_text('{"rows": 3}')
    with pytest.raises(SystemExit, match=r"other\.json: not a saved gemsops bench run.*rows"):
        main(["bench", "--from-json", str(other)])


def test_bench_rejects_unknown_dtypes_listing_the_valid_ones() -> None:
    """An unknown --dtypes name stops the run naming it and listing the valid dtypes."""
    with pytest.raises(SystemExit, match=r"unknown dtype\(s\) \['bogus'\]; known: \[.*'float32'"):
        main(["bench", "--tiny", "--no-host", "--dtypes", "bogus"])


def test_bench_errors_when_the_filters_select_nothing() -> None:
    """--ops and --dtypes that are each valid but match no case together are an error,
    not an empty run that exits 0."""
    import argparse

    import torch

    from gemsops import bench

    all_cases = bench.cases(tiny=False)
    op = next(c.op for c in all_cases if c.dtype == torch.float32)
    others = {str(c.dtype)[6:] for c in all_cases if c.op != op} - {
        str(c.dtype)[6:] for c in all_cases if c.op == op
    }
    assert others  # the full suite has an op in one dtype only
    args = argparse.Namespace(ops=op, dtypes=sorted(others)[0], match=None)
    with pytest.raises(SystemExit, match="no case has"):
        list(bench._filtered(all_cases, args))


def test_bench_cold_times_fresh_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemsops bench --cold` runs the model case's first step in fresh processes (torch,
    gemsops with an empty Triton cache, gemsops with that cache, gemsops cold compiling
    every kernel before its launch) and reports each; the background-compile runs also
    when their compiles were done and the step after."""
    out = tmp_path / "cold.json"
    assert main(["bench", "--cold", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "first step of the model case in a fresh process" in printed
    assert "its compiles done after" in printed
    result = json.loads(out.read_text())
    assert set(result) == {"torch", "gemsops cold", "gemsops warm", "gemsops cold, wait"}
    for side, row in result.items():
        assert "error" not in row, (side, row)
        assert row["step_s"] > 0 and row["import_s"] > 0
    for side in ("gemsops cold", "gemsops warm"):
        row = result[side]
        assert row["compiled_s"] >= row["step_s"] and row["next_step_s"] > 0


@pytest.mark.parametrize("command", ["bench", "selftest"])
def test_unwritable_json_paths_fail_before_the_run(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --json path in a missing folder, or a folder, is a one-line error before anything
    runs (not a traceback after the whole run)."""
    for path, why in ((tmp_path / "no" / "x.json", "does not exist"), (tmp_path, "directory")):
        with pytest.raises(SystemExit) as info:
            main([command, "--json", str(path)])
        assert why in str(info.value) and str(path) in str(info.value)
    assert capsys.readouterr().out == ""  # nothing ran


def test_models_suite_times_each_side_eagerly_on_the_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemsops bench --suite models` times every selected case on each side (eager; the
    interpreter has no device graph, and the table says so), writes JSON rows as it goes,
    and its filters select by op and label as the kernel rows' do."""
    out = tmp_path / "suite.json"
    args = ["bench", "--suite", "models", "--ops", "rms_norm,attention", "--match", "tiny-llama",
            "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    labels = [r["case"] for r in result["rows"]]
    assert labels == [
        "tiny-llama rms_norm 16x64", "tiny-llama rms_norm fwd+bwd 16x64",
        "tiny-llama sdpa causal 1x2/1x16x16x32", "tiny-llama sdpa causal fwd+bwd 1x2/1x16x16x32",
        "tiny-llama decode rms_norm 1x64", "tiny-llama decode sdpa 1x2/1x1x32x32",
        "tiny-llama decode rms_norm 2x64", "tiny-llama decode sdpa 2x2/1x1x32x32"]
    for row in result["rows"]:
        assert row["torch_eager_ms"] > 0 and row["gemsops_eager_ms"] > 0
        assert row["eager_vs_torch"] == pytest.approx(
            row["torch_eager_ms"] / row["gemsops_eager_ms"])
        assert "gemsops_kernel_ms" not in row
    assert "kernel time: not measured (the Triton interpreter" in printed
    assert "eager time: geomean" in printed


def test_models_suite_shapes_are_the_public_configs() -> None:
    """The suite's GPU cases sit at the configs' published sizes: Llama 3.1 8B's fused
    q/k/v projection is 4096 -> 4096 + 2 * 8 * 128, its decode head 4096 -> 128256, GPT-2's
    MLP 768 -> 3072 at 8 x 1024 tokens, GPT-2's and BERT's training heads to their
    vocabularies (50257 and 30522), ViT-B/16's 32 images of 197 tokens (and no head)."""
    from gemsops.bench_suite import suite_cases

    labels = {c.label for c in suite_cases(tiny=False)}
    assert "llama-8b linear qkv 4096x6144x4096" in labels
    assert "llama-8b linear decode head 16x128256x4096" in labels
    assert "gpt2 linear up 8192x3072x768" in labels
    assert "vit-b16 layer_norm fwd+bwd 6304x768" in labels
    assert "llama-1b sdpa causal fwd+bwd 4x32/8x2048x2048x64" in labels
    assert "llama-8b decode sdpa 16x32/8x1x4096x128" in labels
    assert "gpt2 linear head 8192x50257x768 fwd+bwd" in labels
    assert "bert-base linear head 8192x30522x768 fwd+bwd" in labels
    assert not any(label.startswith("vit-b16 linear head") for label in labels)
    assert len(labels) == len(suite_cases(tiny=False))  # no two cases share a label


def test_suite_warm_up_compiles_gemsops_kernels_on_the_calling_thread() -> None:
    """The suite's first call of a gemsops side runs with every compile on the calling
    thread (``waiting()``), so an op whose kernels compile in rounds (a forward, then a
    reduction, then a backward) is not timed while torch serves it; torch's side warms
    up as torch runs, with no such scope."""
    import torch

    from gemshal.kernel import compile as kc
    from gemsops.bench_cases import BenchCase
    from gemsops.bench_suite import measure_suite

    modes: list[tuple[bool, str]] = []

    def make(dev: torch.device) -> object:
        x = torch.ones(4, device=dev)

        def fn() -> object:
            modes.append((gemsops_on(), kc.mode({})))
            return x + 1

        return fn

    from gemsops import registry

    def gemsops_on() -> bool:
        return bool(registry.registered_ops())

    case = BenchCase("add", "warm probe 4", torch.float32, make)
    rows = measure_suite([case], dev=torch.device("cpu"), interpreter=True)
    assert rows[0]["torch_eager_ms"] > 0 and rows[0]["gemsops_eager_ms"] > 0
    torch_modes = [m for on, m in modes if not on]
    gems_modes = [m for on, m in modes if on]
    assert torch_modes and set(torch_modes) == {"background"}
    assert gems_modes[0] == "wait"  # the first (warm-up) call compiles here
    assert gems_modes[-1] == "background"  # the timed calls run as a user's would
