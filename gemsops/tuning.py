"""Where gemsops keeps its tuning data: ``gemsops/tune/*.toml``.

Registering the directory with gemshal only records the path; the files are read on
the first kernel launch that needs them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TUNE_DIR", "register"]

TUNE_DIR = Path(__file__).resolve().parent / "tune"
_registered = False


def register() -> None:
    """Make gemshal's tune loader search ``gemsops/tune`` (idempotent, reads no file)."""
    global _registered
    if not _registered:
        from gemshal import tune

        tune.add_tune_dir(TUNE_DIR, origin="gemsops")
        _registered = True
