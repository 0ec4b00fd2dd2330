"""Where gemsops keeps its tuning data: ``gemsops/tune/*.toml``.

Registering the directory with gemshal only records the path; the files are read on
the first kernel launch that needs them. Registering also gives gemshal gemsops's op
names to vet the files' ``unused`` lists with, so a name gemsops does not implement is
an error naming the file that lists it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TUNE_DIR", "register", "unused_problem"]

TUNE_DIR = Path(__file__).resolve().parent / "tune"
_registered = False


def unused_problem(name: str) -> str | None:
    """None if gemsops implements op or overload ``name``, else why not (with close matches)."""
    from gemsops import registry
    from gemsops.errors import UnknownOpError

    try:
        registry.resolve_names([name])
    except UnknownOpError as exc:
        return str(exc)
    return None


def register() -> None:
    """Make gemshal's tune loader search ``gemsops/tune`` and vet ``unused`` names
    against gemsops's ops (idempotent, reads no file)."""
    global _registered
    if not _registered:
        from gemshal import tune

        tune.add_tune_dir(TUNE_DIR, origin="gemsops")
        tune.add_unused_check(unused_problem, origin="gemsops")
        _registered = True
