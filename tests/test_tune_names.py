"""Tuning entry and op names: unknown names are errors naming the file, the docs name
real entries, and entry-point directories rank in a fixed, documented order."""

from __future__ import annotations

import importlib.metadata
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies_tune import fresh_tune

import gemsops
from gemshal import tune
from gemshal.errors import ConfigError
from gemsops import registry
from gemsops.tuning import TUNE_DIR

ROOT = Path(__file__).resolve().parent.parent
CPU = dict(vendor="cpu", arch="x86_64", interpreter=True)


def _shipped_entries() -> set[str]:
    import tomllib

    out: set[str] = set()
    for path in TUNE_DIR.glob("*.toml"):
        out |= set(tomllib.loads(path.read_text())["ops"])
    return out


@pytest.fixture
def tune_dir(tmp_path: Path) -> Iterator[Path]:
    """A registered tuning directory on an otherwise empty search path."""
    with fresh_tune():
        (tmp_path / "lib").mkdir()
        tune.add_tune_dir(tmp_path / "lib", origin="lib")
        yield tmp_path / "lib"


# --- unknown entries in the user's file ------------------------------------------------


def test_unknown_user_entry_names_file_entry_and_close_matches(tmp_path: Path) -> None:
    """`[ops.softmax]` in GEMS_TUNE_CONFIG is an error naming the file, the entry and the
    entries it is close to, not an entry silently ignored."""
    user = tmp_path / "mine.toml"
    user.write_text("[ops.softmax]\nconfigs = [{ BLOCK_M = 1, TILE_N = 1024 }]\n")
    ctx = tune.TuneContext(**CPU, user_file=str(user))  # type: ignore[arg-type]
    tune.clear_cache()
    try:
        with pytest.raises(ConfigError) as info:
            tune.lookup("pointwise", context=ctx)
    finally:
        tune.clear_cache()
    message = str(info.value)
    assert str(user) in message and "'softmax'" in message
    assert "softmax_rows" in message and "softmax_mid" in message


def test_unknown_user_entry_without_close_match_lists_known_entries(tune_dir: Path) -> None:
    """With no close match the error lists every known entry."""
    (tune_dir / "default.toml").write_text("[ops.alpha]\nconfigs = [{ B = 1 }]\n")
    (tune_dir / "amd.toml").write_text("[ops.beta]\nconfigs = [{ B = 1 }]\n")
    user = tune_dir.parent / "mine.toml"
    user.write_text("[ops.zzzzzz]\nconfigs = [{ B = 2 }]\n")
    ctx = tune.TuneContext(**CPU, user_file=str(user))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"mine.toml: \[ops.zzzzzz\].*known entries: alpha, beta"):
        tune.list_ops(ctx)


def test_user_entries_known_to_any_vendor_file_are_accepted(tune_dir: Path) -> None:
    """An entry another vendor's file defines is known: a user file may carry it anywhere."""
    (tune_dir / "default.toml").write_text("[ops.alpha]\nconfigs = [{ B = 1 }]\n")
    (tune_dir / "nvidia-sm90.toml").write_text("[ops.beta]\nconfigs = [{ B = 1 }]\n")
    user = tune_dir.parent / "mine.toml"
    user.write_text("[ops.beta]\nconfigs = [{ B = 2 }]\n")
    ctx = tune.TuneContext(**CPU, user_file=str(user))  # type: ignore[arg-type]
    assert tune.lookup("beta", context=ctx).source.level == "user"


def test_user_entries_are_not_checked_without_library_files(tmp_path: Path) -> None:
    """With no op library's files on the path there is nothing to check against."""
    user = tmp_path / "mine.toml"
    user.write_text("[ops.anything]\nconfigs = [{ B = 2 }]\n")
    with fresh_tune():
        ctx = tune.TuneContext(**CPU, user_file=str(user))  # type: ignore[arg-type]
        assert tune.lookup("anything", context=ctx).source.level == "user"


# --- unused lists ----------------------------------------------------------------------


def test_unknown_unused_name_in_user_file_names_the_file_at_enable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`unused = ["softmax"]` in GEMS_TUNE_CONFIG makes enable() raise ConfigError naming
    that file and the ops gemsops does implement close to it."""
    user = tmp_path / "mine.toml"
    user.write_text('unused = ["softmax"]\n')
    gemsops.disable()
    monkeypatch.setenv(tune.ENV_USER_FILE, str(user))
    tune.clear_cache()
    try:
        with pytest.raises(ConfigError) as info:
            gemsops.enable()
    finally:
        monkeypatch.delenv(tune.ENV_USER_FILE)
        tune.clear_cache()
        gemsops.disable()
    message = str(info.value)
    assert str(user) in message and "'unused'" in message and "'softmax'" in message
    assert "_softmax" in message


def test_unused_names_are_vetted_by_registered_checks(tune_dir: Path) -> None:
    """A name every registered check refuses is an error naming the library file listing it;
    a name one check accepts passes; with no check registered nothing is vetted."""
    (tune_dir / "default.toml").write_text('unused = ["mm", "nope"]\n')
    ctx = tune.TuneContext(**CPU)  # type: ignore[arg-type]
    assert tune.unused_ops(ctx) == {"mm", "nope"}
    tune.add_unused_check(lambda n: None if n == "mm" else f"lib has no {n!r}", origin="lib")
    with pytest.raises(ConfigError, match=rf"{tune_dir / 'default.toml'}: key 'unused'.*'nope'"):
        tune.unused_ops(ctx)
    tune.add_unused_check(lambda n: None, origin="other")
    assert tune.unused_ops(ctx) == {"mm", "nope"}
    with pytest.raises(ValueError, match="origin"):
        tune.add_unused_check(lambda n: None, origin="")


def test_gemsops_vets_unused_names_against_its_ops() -> None:
    """gemsops registers a check accepting its op and overload names and refusing others."""
    from gemsops.tuning import unused_problem

    assert unused_problem("_softmax") is None and unused_problem("add.Tensor") is None
    assert "_softmax" in (unused_problem("softmax") or "")


# --- entry-point directories -----------------------------------------------------------


def _entry_points(root: Path, names: list[str]) -> list[importlib.metadata.EntryPoint]:
    module = f"fake_tune_{root.name}"  # one module per directory: imports are cached
    (root / f"{module}.py").write_text("".join(f"{n} = {str(root / n)!r}\n" for n in names))
    group = tune.TUNE_DIRS_GROUP
    return [importlib.metadata.EntryPoint(n, f"{module}:{n}", group) for n in names]


@given(st.permutations(["zeta", "alpha", "gemsops", "mid"]), st.booleans())
def test_entry_point_dirs_rank_by_name_whatever_the_import_order(
    order: list[str], registered_first: bool
) -> None:
    """Property: entry-point directories rank by entry-point name, ahead of directories
    registered in code, whatever order the metadata lists them in and whichever package
    registered its directory first."""
    with tempfile.TemporaryDirectory() as tmp, fresh_tune(), pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        eps = _entry_points(root, order)
        mp.syspath_prepend(str(root))
        mp.setattr(importlib.metadata, "entry_points", lambda group: eps)
        tune._ENTRY_POINTS_LOADED = False
        if registered_first:
            tune.add_tune_dir(root / order[0], origin="imported first")
        tune.add_tune_dir(root / "code", origin="code")
        ctx = tune.TuneContext(**CPU)  # type: ignore[arg-type]
        defaults = [s for s in tune.search_path(ctx) if s.level == "default"]
        assert [s.path.parent.name for s in defaults] == [*sorted(order), "code"]


def test_broken_entry_point_is_an_error_at_every_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry point that fails to load, or yields no path, raises ConfigError naming it
    at every lookup, not once and then silently skipped."""
    (tmp_path / "fake_broken_tune.py").write_text(
        "NONE = None\ndef boom():\n    raise OSError('x')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    group = tune.TUNE_DIRS_GROUP
    for value, pattern in (("NONE", "gave None"), ("boom", "failed to load")):
        ep = importlib.metadata.EntryPoint("broken", f"fake_broken_tune:{value}", group)
        with fresh_tune():
            monkeypatch.setattr(importlib.metadata, "entry_points", lambda group, ep=ep: [ep])
            tune._ENTRY_POINTS_LOADED = False
            for _ in range(2):
                with pytest.raises(ConfigError, match=rf"'broken'.*{pattern}"):
                    tune.search_path(tune.TuneContext(**CPU))  # type: ignore[arg-type]


# --- the docs name real entries --------------------------------------------------------


def test_docs_name_real_tuning_entries_and_ops() -> None:
    """docs/tuning.md's example entries and `gemshal config OP` commands name entries the
    shipped files define, and the op names docs/gemsops.md passes to include= exist."""
    entries = _shipped_entries()
    tuning = (ROOT / "docs" / "tuning.md").read_text()
    named = set(re.findall(r"^\[ops\.([A-Za-z_][A-Za-z0-9_]*)", tuning, re.M))
    named |= set(re.findall(r"gemshal config ([a-z_][a-z0-9_]*)", tuning))
    assert named and named <= entries, sorted(named - entries)
    ops_doc = (ROOT / "docs" / "gemsops.md").read_text()
    for group in re.findall(r"include=\[([^\]]*)\]", ops_doc):
        names = re.findall(r'"([^"]+)"', group)
        assert names
        registry.resolve_names(names)
