"""Tuning values are checked when a file is read, against what the kernels accept.

Tile sizes (meta-parameters named ``BLOCK*``, ``TILE*``, ``*BLOCK``, ``*_SIZE``) are
powers of two up to Triton's largest tensor, group counts (``GROUP*``) positive
integers, ``num_warps`` a power of two; a bad value is a ConfigError naming the file,
the op and the key, never a wrong answer or an error from inside a kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies_tune import size_keys, size_values, toml_dumps

import gemsops
from gemshal import tune, tune_values
from gemshal.errors import ConfigError
from gemshal.tune_format import TuneConfig, TuneSource, loads
from gemsops.testing.strategies import target_device
from gemsops.tuning import TUNE_DIR

DEV = target_device()

SOURCE = TuneSource(Path("/x/t.toml"), "default", "tests")

# The values the issue found accepted or failing late, and their neighbours.
BAD_TILES = [-64, 0, 100, 3, 2**21, "64", True, 64.0]
MAX_TILE = 2**20  # Triton's largest tensor: tune_values.MAX_TILE


@pytest.fixture
def user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A GEMS_TUNE_CONFIG file for the current device; the caches cleared around the test."""
    path = tmp_path / "mine.toml"
    monkeypatch.setenv(tune.ENV_USER_FILE, str(path))
    tune.clear_cache()
    try:
        yield path
    finally:
        monkeypatch.delenv(tune.ENV_USER_FILE)
        tune.clear_cache()


def _value(value: object) -> str:
    return toml_dumps({"v": value}).split(" = ", 1)[1].strip()


@pytest.mark.parametrize("value", BAD_TILES, ids=repr)
def test_bad_tile_size_in_user_file_is_refused_before_the_kernel_runs(
    user_file: Path, value: object
) -> None:
    """A pointwise op under a user file with a bad BLOCK raises ConfigError naming the
    file, the entry and the key, instead of returning garbage or failing in the kernel."""
    user_file.write_text(f"[ops.pointwise]\nconfigs = [{{ BLOCK = {_value(value)} }}]\n")
    with pytest.raises(ConfigError) as info:
        gemsops.add(torch.ones(300, device=DEV), torch.ones(300, device=DEV))
    message = str(info.value)
    assert str(user_file) in message
    assert "[ops.pointwise]" in message
    assert "'BLOCK'" in message
    assert "power of two" in message


def test_good_tile_size_in_user_file_is_used(user_file: Path) -> None:
    """A power-of-two BLOCK in the user file passes and the op computes the right answer."""
    user_file.write_text("[ops.pointwise]\nconfigs = [{ BLOCK = 64 }]\n")
    out = gemsops.add(torch.ones(300, device=DEV), torch.ones(300, device=DEV))
    torch.testing.assert_close(out.cpu(), torch.full((300,), 2.0))


@given(
    key=size_keys,
    value=st.one_of(
        st.integers(-(2**40), 2**40),
        st.booleans(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=4),
    ),
)
def test_tile_sizes_accept_exactly_powers_of_two_up_to_max_tile(key: str, value: object) -> None:
    """Property: a tile-size meta-parameter parses iff it is an int power of two <= MAX_TILE,
    and a refusal names the file, the op and the key."""
    text = toml_dumps({"ops": {"k": {"configs": [{key: value}]}}})
    valid = type(value) is int and 0 < value <= MAX_TILE and value & (value - 1) == 0
    if valid:
        assert loads(text, SOURCE).ops["k"].configs[0].meta == ((key, value),)
        return
    with pytest.raises(ConfigError) as info:
        loads(text, SOURCE)
    assert all(part in str(info.value) for part in ("/x/t.toml", "[ops.k]", repr(key)))


@given(key=size_keys, value=size_values)
def test_grids_of_tile_sizes_take_powers_of_two(key: str, value: int) -> None:
    """Property: a grid of power-of-two tile sizes parses; adding a non-power refuses it."""
    assert loads(toml_dumps({"ops": {"k": {"grid": {key: [value]}}}}), SOURCE).ops["k"].configs
    with pytest.raises(ConfigError, match=rf"\[ops.k\] grid.*{key!r}"):
        loads(toml_dumps({"ops": {"k": {"grid": {key: [value, 3 * value]}}}}), SOURCE)


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("configs = [{ GROUP_M = 0 }]", "GROUP_M"),
        ("configs = [{ GROUP_M = -8 }]", "GROUP_M"),
        ("configs = [{ GROUP_M = 2.0 }]", "GROUP_M"),
        ("configs = [{ BLOCK = 64, num_warps = 3 }]", "num_warps"),
        ("configs = [{ BLOCK = 64, num_warps = 0 }]", "num_warps"),
        ("configs = [{ BLOCK = 64, num_stages = -1 }]", "num_stages"),
        ("configs = [{ TILE_N = 48 }]", "TILE_N"),
        ("configs = [{ XBLOCK = 6 }]", "XBLOCK"),
        ("configs = [{ VEC_SIZE = 0 }]", "VEC_SIZE"),
        ("configs = [{ BLOCK = 64 }]\ninterpreter = { BLOCK = -64 }", "BLOCK"),
        ("heuristics = { BLOCK = -4 }", "BLOCK"),
        ("heuristics = { num_warps = 6 }", "num_warps"),
    ],
)
def test_bad_counts_warps_and_sizes_name_file_op_and_key(table: str, key: str) -> None:
    """Group counts, num_warps, other size names, interpreter configs and constant
    heuristics are held to the same rules, the error naming file, op and key."""
    with pytest.raises(ConfigError) as info:
        loads(f"[ops.k]\n{table}\n", SOURCE)
    assert all(part in str(info.value) for part in ("/x/t.toml", "[ops.k]", repr(key)))


def test_other_meta_parameters_keep_any_scalar() -> None:
    """Meta-parameters the rules do not name by kind (flags, modes, BLOKC) keep any scalar."""
    text = '[ops.k]\nconfigs = [{ EVEN = true, MODE = "fast", SCALE = -0.5, BLOKC = 3 }]\n'
    assert dict(loads(text, SOURCE).ops["k"].configs[0].meta)["BLOKC"] == 3
    assert loads("[ops.k.heuristics]\nBLOCK = { min = ['n', 4] }\n", SOURCE).ops["k"].heuristics


def test_records_built_in_code_refuse_bad_sizes() -> None:
    """TuneConfig checks tile sizes and num_warps itself, as value_problem reports them."""
    with pytest.raises(ConfigError, match="'BLOCK_N'"):
        TuneConfig({"BLOCK_N": -64})
    with pytest.raises(ConfigError, match="num_warps"):
        TuneConfig({"BLOCK_N": 64}, num_warps=12)
    assert tune_values.value_problem("BLOCK_N", 64) is None
    assert tune_values.value_problem("num_stages", 3) is None
    assert "power of two" in (tune_values.value_problem("TILE_N", 96) or "")
    assert tune_values.MAX_TILE == MAX_TILE


def test_shipped_files_hold_only_valid_values() -> None:
    """Every shipped gemsops tuning file parses under the value rules."""
    files = sorted(TUNE_DIR.glob("*.toml"))
    assert files
    for path in files:
        loads(path.read_text(), TuneSource(path, "default", "gemsops"))


def test_sm90_reduce_rows_never_launches_wide_tiles_on_narrow_lines() -> None:
    """The shipped sm90 table gives reduce_rows a tile at most 16 wide for lines of 16
    elements or fewer, at any row count and float dtype (the nearest row of a narrow
    bfloat16 bucket was once an 8192-wide tile: a million programs reading 2 elements
    each, 4.7 ms on an H100)."""
    import tomllib
    from collections import namedtuple
    from pathlib import Path

    from gemshal.kernel.plan import bucket, nearest_row

    row = namedtuple("row", "when dtype config")
    path = Path(__file__).parents[1] / "gemsops" / "tune" / "nvidia-sm90.toml"
    table = tomllib.loads(path.read_text())["ops"]["reduce_rows"]["table"]
    rows = []
    for r in table:
        r = dict(r)
        config, dtype = r.pop("config"), r.pop("dtype", None)
        rows.append(row(tuple(sorted(r.items())), dtype, config))
    for dtype in ("float32", "bfloat16", "float16"):
        for m in (1, 7, 2048, 1 << 20):
            for n in (1, 2, 3, 8, 16):
                chosen, _ = nearest_row(rows, {"M": bucket(m), "N": bucket(n)}, dtype)
                assert chosen is not None and chosen.config["BLOCK_N"] <= 16, (dtype, m, n)
