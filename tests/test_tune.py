"""The tuning-file loader: format, lookup order, errors, caching and ``gemshal config``."""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies_tune import (
    documents,
    expressions,
    fresh_tune,
    grids,
    identity,
    names,
    op_tables,
    toml_dumps,
)

from gemshal import cli_config, tune
from gemshal.errors import ConfigError
from gemshal.tune_format import TuneConfig, TuneSource, loads
from gemshal.tune_values import LAUNCH_KEYS

CTX = tune.TuneContext(vendor="nvidia", arch="sm90", interpreter=False)
LEVEL_FILES = {
    "vendor-arch": "nvidia-sm90.toml",
    "vendor": "nvidia.toml",
    "default": "default.toml",
}


@pytest.fixture
def tune_dir(tmp_path: Path) -> Iterator[Path]:
    """A registered, empty tuning directory on an otherwise empty search path."""
    with fresh_tune():
        tune.add_tune_dir(tmp_path, origin="tests")
        yield tmp_path


def _source(name: str = "t.toml") -> TuneSource:
    return TuneSource(Path("/x") / name, "default", "tests")


def _one_config(mark: str) -> str:
    return f'configs = [{{ MARK = "{mark}" }}]'


# --- format --------------------------------------------------------------------------


def test_schema_example_parses() -> None:
    """The example file in docs/tuning.md parses into the expected records."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "tuning.md").read_text()
    text = doc.split("## File format", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    parsed = loads(text, _source())
    assert parsed.unused == {"mm", "add.Tensor"}
    rows = parsed.ops["softmax_rows"]
    assert rows.configs[0] == TuneConfig({"BLOCK_M": 1, "TILE_N": 4096}, num_warps=8, num_stages=1)
    assert rows.pinned == TuneConfig({"BLOCK_M": 4, "TILE_N": 64})
    block_n, one_tile = rows.heuristics
    assert block_n({"N": 1000, "TILE_N": 4096}) == 1024
    assert one_tile.name == "ONE_TILE" and one_tile({"N": 5000, "TILE_N": 4096}) is False
    assert len(parsed.ops["pointwise"].configs) == 6
    assert not parsed.ops["mm"].heuristics


@given(grids())
def test_grid_expands_to_product_without_duplicates(grid: dict[str, list[object]]) -> None:
    """Property: a grid expands to exactly the product of its lists, each combination once."""
    op = loads(toml_dumps({"ops": {"g": {"grid": grid}}}), _source()).ops["g"]
    assert len(op.configs) == math.prod(len(v) for v in grid.values())
    seen = {identity(c.as_dict()) for c in op.configs}
    assert len(seen) == len(op.configs)
    for config in op.configs:
        for key, value in config.as_dict().items():
            assert any(type(v) is type(value) and v == value for v in grid[key])


@given(documents())
def test_valid_tables_round_trip_through_toml(doc: dict[str, object]) -> None:
    """Property: any valid file survives records -> TOML -> records unchanged."""
    first = loads(toml_dumps(doc), _source())
    again_doc = {
        "unused": sorted(first.unused),
        "ops": {k: v.as_dict() for k, v in first.ops.items()},
    }
    second = loads(toml_dumps(again_doc), _source())
    assert first.unused == second.unused
    assert dict(first.ops) == dict(second.ops)


@given(op_tables())
def test_configs_keep_values_and_types(table: dict[str, object]) -> None:
    """Property: parsed configs give back exactly the keys, values and types written."""
    op = loads(toml_dumps({"ops": {"o": table}}), _source()).ops["o"]
    assert [identity(c.as_dict()) for c in op.configs] == [identity(c) for c in table["configs"]]  # type: ignore[union-attr]


def test_extra_launch_keys_reach_triton_config() -> None:
    """A vendor's extra launch keyword is accepted and passed to triton.Config's kwargs."""
    text = "[ops.mm]\nconfigs = [{ BLOCK_M = 64, waves_per_eu = 2, num_warps = 8 }]\n"
    with pytest.raises(ConfigError, match="waves_per_eu"):
        loads(text, _source())
    config = loads(text, _source(), extra_launch_keys=("waves_per_eu",)).ops["mm"].configs[0]
    triton_config = config.to_triton()
    assert triton_config.kwargs == {"BLOCK_M": 64, "waves_per_eu": 2}
    assert triton_config.num_warps == 8


def test_unset_launch_keys_take_triton_defaults() -> None:
    """A config that sets no launch keywords gets triton.Config's defaults, not None."""
    import triton

    assert TuneConfig({"B": 1}).to_triton().all_kwargs() == triton.Config({"B": 1}).all_kwargs()


def test_next_power_of_2_matches_triton() -> None:
    """The rule language's next_power_of_2 agrees with triton.next_power_of_2."""
    import triton

    from gemshal.tune_rules import HeuristicRule, parse_rules

    (rule,) = parse_rules("x", {"B": {"next_power_of_2": "n"}})
    assert isinstance(rule, HeuristicRule)
    for n in [*range(0, 70), 1000, 4096, 4097, 2**31 - 1]:
        assert rule({"n": n}) == triton.next_power_of_2(n)


def test_rule_functions() -> None:
    """Every rule function computes what docs/tuning.md says it does."""
    from gemshal.tune_rules import parse_rules

    table = {
        "A": {"cdiv": ["n", 32]},
        "B": {"min": [{"next_power_of_2": "n"}, 64]},
        "C": {"max": ["n", 8, 2]},
        "D": {"if": [{"ge": ["n", 50]}, 8, 4]},
        "E": {"lt": ["n", 2]},
        "F": {"le": ["n", 100]},
        "G": {"gt": ["n", 100]},
        "H": 7,
        "I": "n",
    }
    got = {r.name: r({"n": 100}) for r in parse_rules("x", table)}
    assert got == dict(A=4, B=64, C=100, D=8, E=False, F=True, G=False, H=7, I=100)


def _outcome(fn: Any, args: dict[str, int]) -> object:
    try:
        return ("value", fn(args))
    except Exception as exc:  # the outcome compared is the exception's type
        return ("raised", type(exc))


@given(expressions, st.dictionaries(names, st.integers(-50, 50), max_size=4))
def test_compiled_rules_agree_with_evaluation(expr: object, args: dict[str, int]) -> None:
    """Property: a compiled rule gives the same value (or error) as evaluating it directly."""
    from gemshal.tune_rules import parse_rules

    (rule,) = parse_rules("x", {"R": expr})
    assert _outcome(rule.compile(), args) == _outcome(rule, args)


_ADD = "[ops.add]\nconfigs = [{ BLOCK = 1 }]\n"
MALFORMED = [
    ("[ops.add\nconfigs = 1\n", "line 1"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1, num_wraps = 4 }]\n", "num_wraps"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1, num_warps = '4' }]\n", "num_warps"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1, num_warps = true }]\n", "num_warps"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1, num_stages = 0 }]\n", "num_stages"),
    ("[ops.add]\nconfigs = [{ BLOCK = [1] }]\n", "BLOCK"),
    ("[ops.add]\nconfigs = [{ BLOCK = nan }]\n", "BLOCK"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }, { BLOCK = 2 }, { BLOCK = 1 }]\n", "configs"),
    ("[ops.add]\nconfigs = []\n", "configs"),
    ("[ops.add]\nconfigs = [{}]\n", "configs[0]"),
    ("[ops.add.grid]\n", "grid"),
    ("[ops.add.grid]\nBLOCK = []\n", "BLOCK"),
    ("[ops.add.grid]\nBLOCK = 4\n", "BLOCK"),
    ("[ops.add.grid]\nBLOCK = [1, 1]\n", "BLOCK"),
    ("[ops.add.grid]\nnum_warps = [4, false]\n", "num_warps"),
    ("[ops.add]\nconfig = [{ BLOCK = 1 }]\n", "config"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }]\ngrid = { B = [1] }\n", "grid"),
    ("[ops.add]\ninterpreter = { BLOCK = 1 }\n", "interpreter"),
    ("[ops.add.heuristics]\nEVEN = { foo = 1 }\n", "EVEN"),
    ("[ops.add.heuristics]\nEVEN = { divisible = ['K'] }\n", "EVEN"),
    ("[ops.add.heuristics]\nEVEN = { divisible = ['K', 'not a name'] }\n", "EVEN"),
    ("op = 1\n", "'op'"),
    ("unused = [1]\n", "unused"),
    ("version = 2\n", "version"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }]\ntable = { N = 4 }\n", "table"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }]\ntable = [{ N = 4 }]\n", "'config'"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }]\ntable = [{ config = { BLOCK = 1 } }]\n", "key value"),
    (f"{_ADD}table = [{{ N = 4, dtype = 3, config = {{ BLOCK = 1 }} }}]\n", "dtype"),
    (f"{_ADD}table = [{{ N = 1.5, config = {{ BLOCK = 1 }} }}]\n", "'N'"),
    (f"{_ADD}table = [{{ N = 4, config = {{ BLOCK = 3 }} }}]\n", "BLOCK"),
    ("[ops.add]\nconfigs = [{ BLOCK = 1 }]\ntable = [{ N = 4, config = { BLOCK = 1 } }, "
     "{ N = 4, config = { BLOCK = 2 } }]\n", "repeats the bucket of row 0"),
    ("[ops.add.heuristics]\nEVEN = false\n[ops.add]\ntable = [{ N = 4, config = { BLOCK = 1 } }]"
     "\n",
     "'table' needs 'configs'"),
]


@pytest.mark.parametrize(("text", "key"), MALFORMED)
def test_malformed_file_raises_config_error_naming_file_and_key(
    tune_dir: Path, text: str, key: str
) -> None:
    """A malformed file raises ConfigError whose message names the file and the key."""
    path = tune_dir / "default.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        tune.lookup("add", context=CTX)
    assert str(path) in str(info.value)
    assert key in str(info.value)


def test_table_rows_parse_and_round_trip(tune_dir: Path) -> None:
    """A table row keeps its bucket (sorted by name), dtype and config, and as_dict() gives
    the TOML table back."""
    (tune_dir / "default.toml").write_text(
        "[ops.add]\nconfigs = [{ BLOCK = 1 }]\n"
        "table = [{ N = 4, M = 2, dtype = 'bfloat16', config = { BLOCK = 8, num_warps = 2 } }]\n"
    )
    (row,) = tune.lookup("add", context=CTX).table
    assert row.when == (("M", 2), ("N", 4)) and row.dtype == "bfloat16"
    assert row.config == TuneConfig({"BLOCK": 8}, num_warps=2)
    assert row.as_dict() == {"M": 2, "N": 4, "dtype": "bfloat16",
                             "config": {"BLOCK": 8, "num_warps": 2}}


def test_grid_too_large_is_refused() -> None:
    """A grid expanding past MAX_GRID configs raises ConfigError instead of hanging."""
    grid = {f"K{i}": list(range(10)) for i in range(5)}
    with pytest.raises(ConfigError, match="expands to 100000"):
        loads(toml_dumps({"ops": {"g": {"grid": grid}}}), _source())


def test_records_validate_themselves() -> None:
    """TuneConfig refuses a bad launch value or meta name even when built in code."""
    with pytest.raises(ConfigError, match="num_warps"):
        TuneConfig({"B": 1}, num_warps=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block"):
        TuneConfig({"block": 1})
    with pytest.raises(ValueError, match="extra launch keys"):
        tune.TuneContext(vendor="amd", arch="gfx942", extra_launch_keys=("num_warps",))


# --- lookup order ----------------------------------------------------------------------

SOURCES = ["user", *(f"{lvl}/{d}" for lvl in LEVEL_FILES for d in (0, 1))]


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.sets(st.sampled_from(SOURCES), min_size=1),
        min_size=1,
    )
)
def test_override_order_holds_for_any_assignment(assign: dict[str, set[str]]) -> None:
    """Property: for any ops-to-sources assignment the highest-ranked defining source wins."""
    with tempfile.TemporaryDirectory() as tmp, fresh_tune():
        root = Path(tmp)
        dirs = [root / "d0", root / "d1"]
        for i, d in enumerate(dirs):
            d.mkdir()
            tune.add_tune_dir(d, origin=f"dir{i}")
        # The op library's own entries, ranked last, so the user's entries name known ops.
        (root / "lib").mkdir()
        (root / "lib" / "default.toml").write_text(
            "".join(f"[ops.{op}]\n{_one_config('lib')}\n" for op in assign)
        )
        tune.add_tune_dir(root / "lib", origin="lib")
        contents: dict[Path, list[str]] = {}
        for op, sources in assign.items():
            for src in sources:
                if src == "user":
                    path = root / "user.toml"
                else:
                    level, d = src.split("/")
                    path = dirs[int(d)] / LEVEL_FILES[level]
                contents.setdefault(path, []).append(f"[ops.{op}]\n{_one_config(src)}\n")
        for path, tables in contents.items():
            path.write_text("".join(tables))
        user = str(root / "user.toml") if (root / "user.toml").exists() else None
        ctx = tune.TuneContext(vendor="nvidia", arch="sm90", user_file=user)
        listed = tune.list_ops(ctx)
        for op, sources in assign.items():
            winner = min(sources, key=SOURCES.index)
            tuning = tune.lookup(op, context=ctx)
            assert dict(tuning.configs[0].meta) == {"MARK": winner}
            assert listed[op] == tuning.source


def test_vendor_dirs_rank_before_registered_dirs(
    tune_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Within a level the vendor's own directory outranks directories registered by libraries."""
    vendor_dir = tmp_path_factory.mktemp("vendor")
    (tune_dir / "nvidia.toml").write_text(f"[ops.x]\n{_one_config('library')}\n")
    (vendor_dir / "nvidia.toml").write_text(f"[ops.x]\n{_one_config('vendor')}\n")
    ctx = tune.TuneContext(vendor="nvidia", arch="sm90", vendor_dirs=(str(vendor_dir),))
    tuning = tune.lookup("x", context=ctx)
    assert dict(tuning.configs[0].meta) == {"MARK": "vendor"}
    assert tuning.source.origin == "vendor nvidia"


def test_entries_are_not_merged(tune_dir: Path) -> None:
    """The winning file's entry is used whole: lower files' configs and heuristics are dropped."""
    (tune_dir / "default.toml").write_text(
        "[ops.x]\nconfigs = [{ B = 1 }, { B = 2 }]\n[ops.x.heuristics]\nE = true\n"
    )
    (tune_dir / "nvidia.toml").write_text("[ops.x]\nconfigs = [{ B = 3 }]\n")
    tuning = tune.lookup("x", context=CTX)
    assert [dict(c.meta) for c in tuning.configs] == [{"B": 3}]
    assert tuning.heuristics == ()


def test_missing_op_names_op_and_every_file(tune_dir: Path) -> None:
    """A missing op raises ConfigError naming it and every file searched, marking missing files."""
    (tune_dir / "default.toml").write_text(f"[ops.other]\n{_one_config('d')}\n")
    with pytest.raises(ConfigError) as info:
        tune.lookup("softmax", context=CTX)
    message = str(info.value)
    assert "'softmax'" in message
    assert f"{tune_dir / 'nvidia-sm90.toml'} (vendor-arch, tests; does not exist)" in message
    assert f"{tune_dir / 'nvidia.toml'} (vendor, tests; does not exist)" in message
    assert f"{tune_dir / 'default.toml'} (default, tests)" in message


def test_missing_user_file_is_an_error(tune_dir: Path) -> None:
    """A GEMS_TUNE_CONFIG naming a missing file raises ConfigError naming the path."""
    missing = tune_dir / "nope.toml"
    ctx = tune.TuneContext(vendor="nvidia", arch="sm90", user_file=str(missing))
    with pytest.raises(ConfigError, match=str(missing)):
        tune.lookup("x", context=ctx)


def test_current_context_reads_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """current_context takes the vendor and arch from the device and the user file from the env."""
    import gemshal

    monkeypatch.setenv(tune.ENV_USER_FILE, "/some/file.toml")
    ctx = tune.current_context()
    dev = gemshal.current_device()
    assert (ctx.vendor, ctx.arch, ctx.interpreter) == (
        dev.vendor.name,
        dev.arch.tag,
        dev.interpreter,
    )
    assert ctx.user_file == "/some/file.toml"


def test_unused_combines_across_sources(
    tune_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """unused_ops is the union of the unused lists of every file, the user's included."""
    user = tmp_path_factory.mktemp("user") / "mine.toml"
    user.write_text('unused = ["u"]\n')
    (tune_dir / "default.toml").write_text('unused = ["d", "shared"]\n')
    (tune_dir / "nvidia.toml").write_text('unused = ["v", "shared"]\n')
    (tune_dir / "nvidia-sm90.toml").write_text('unused = ["va"]\n')
    ctx = tune.TuneContext(vendor="nvidia", arch="sm90", user_file=str(user))
    assert tune.unused_ops(ctx) == {"u", "d", "v", "va", "shared"}


def test_files_read_once_and_again_after_clear(
    tune_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file is read once per process until clear_cache(); registering reads nothing."""
    reads: list[Path] = []
    real = tune._read
    monkeypatch.setattr(tune, "_read", lambda p: reads.append(p) or real(p))
    (tune_dir / "default.toml").write_text(f"[ops.x]\n{_one_config('d')}\n")
    tune.add_tune_dir(tune_dir / "more", origin="more")
    assert reads == []
    tune.lookup("x", context=CTX)
    first = len(reads)
    tune.lookup("x", context=CTX)
    tune.unused_ops(CTX)
    assert len(reads) == first == 6
    tune.clear_cache()
    tune.lookup("x", context=CTX)
    assert len(reads) == 2 * first


def test_add_tune_dir_is_idempotent_and_checks_origin(tune_dir: Path) -> None:
    """Registering a directory twice keeps one entry; an empty origin is refused."""
    tune.add_tune_dir(tune_dir, origin="again")
    assert [s.origin for s in tune.search_path(CTX)] == ["tests"] * 3
    with pytest.raises(ValueError, match="origin"):
        tune.add_tune_dir(tune_dir, origin="")


# --- gemshal config --------------------------------------------------------------------


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gemshal")
    cli_config.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["config", *argv])
    code: int = args.run(args)
    return code


def test_cli_shows_op_with_source(tune_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gemshal config OP --json` prints the winning entry with the file it came from."""
    (tune_dir / "nvidia.toml").write_text(
        "[ops.x]\nconfigs = [{ B = 1, num_warps = 4 }]\ninterpreter = { B = 2 }\n"
    )
    assert _cli("x", "--vendor", "nvidia", "--arch", "SM90", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == {
        "path": str(tune_dir / "nvidia.toml"),
        "level": "vendor",
        "origin": "tests",
    }
    assert out["configs"] == [{"B": 1, "num_warps": 4}]
    assert out["pinned"] is None
    assert _cli("x", "--vendor", "nvidia", "--arch", "sm90") == 0
    assert "nvidia.toml" in capsys.readouterr().out


def test_cli_lists_ops_sources_and_unused(
    tune_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gemshal config --list` shows the search path, each op's source and the unused ops."""
    (tune_dir / "default.toml").write_text(f'unused = ["z"]\n[ops.x]\n{_one_config("d")}\n')
    assert _cli("--list", "--vendor", "cpu", "--arch", "x86_64", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ops"] == {
        "x": {"path": str(tune_dir / "default.toml"), "level": "default", "origin": "tests"}
    }
    assert out["unused"] == ["z"]
    assert [s["exists"] for s in out["search_path"]] == [False, False, True]
    assert _cli("--list", "--vendor", "cpu", "--arch", "x86_64") == 0
    assert "does not exist" in capsys.readouterr().out


def test_cli_rejects_contradicting_arguments(tune_dir: Path) -> None:
    """`gemshal config` needs exactly one of OP and --list, and --vendor with --arch."""
    for argv in ((), ("x", "--list"), ("x", "--vendor", "nvidia")):
        with pytest.raises(SystemExit) as info:
            _cli(*argv)
        assert info.value.code == 2


def test_launch_keys_constant() -> None:
    """The recognised launch keywords are the four Triton takes on every backend."""
    assert LAUNCH_KEYS == ("num_warps", "num_stages", "num_ctas", "maxnreg")
