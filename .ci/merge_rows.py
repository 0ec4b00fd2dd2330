"""Fill the buckets the shipped sm90 tables do not name from a `gemsops tune` file.

For every table row of TUNED whose bucket has no exact row in the shipped tables (the
call would launch its nearest row's config), or whose exact row names fewer keys and
launches another config (TUNED's row is then the narrower bucket), the row is inserted
at the end of that op's `table` in gemsops/tune/nvidia-sm90.toml, after one comment
naming TUNED. Rows the
shipped tables name exactly are left as they are (a dedicated sweep may have chosen
them), and so are ops without an sm90 table. --dry-run prints what would be added.
--replace also replaces, in place, each shipped row that names TUNED's bucket exactly but
launches another config (the row line is matched by its parsed value), for issue 23's
3% rule where a fresh runtime tune beats a row. --out writes the result to another file
(a candidate table to measure with `.ci/tables_ab.py --a`), not the shipped one.

    python .ci/merge_rows.py docs/gpu/s19/h100-d-tuned.toml --skip attention_fwd --note "..."
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gemsops  # noqa: F401  (registers gemsops' tuning directories)
from gemshal import registry, tune
from gemshal.kernel.plan import nearest_row
from gemshal.tune_format import TableRow, TuneSource, loads
from gemsops.tune_run import _toml_value

SM90 = Path(__file__).resolve().parent.parent / "gemsops" / "tune" / "nvidia-sm90.toml"


def _pairs(tuned_path: Path, skip: set[str]
           ) -> Iterator[tuple[str, TableRow, TableRow | None, bool]]:
    """(op, TUNED's row, the shipped sm90 row that bucket takes, exact) for every table row
    of TUNED whose op has an sm90 table (ops in ``skip`` and ops the shipped files do
    not know are left out)."""
    ctx = tune.context_for(registry.vendor("nvidia"), "sm90", interpreter=False)
    tuned = loads(tuned_path.read_text(), TuneSource(path=tuned_path, level="user", origin="tuned"))
    for op, entry in tuned.ops.items():
        if op in skip:
            continue
        try:
            shipped = tune.lookup(op, context=ctx)
        except Exception:  # an op the shipped files do not know: skip it
            continue
        if shipped.source.path != SM90 or not shipped.table:
            continue
        for row in entry.table:
            found, exact = nearest_row(shipped.table, dict(row.when), row.dtype)
            yield op, row, found, exact


def _line(row: TableRow) -> str:
    return f"    {_toml_value(row.as_dict())},"


def missing_rows(tuned_path: Path, skip: set[str]) -> dict[str, list[str]]:
    """Per op, the TOML lines of TUNED's rows at buckets the shipped tables lack."""
    out: dict[str, list[str]] = {}
    for op, row, found, exact in _pairs(tuned_path, skip):
        # A row naming more keys than the exact shipped one is a narrower bucket (the
        # attention kernels' DROPOUT flag): added where its config differs.
        narrower = (exact and found is not None
                    and set(dict(found.when)) < set(dict(row.when))
                    and found.config.identity() != row.config.identity())
        if not exact or narrower:
            out.setdefault(op, []).append(_line(row))
    return out


def replaced_rows(tuned_path: Path, skip: set[str]) -> dict[str, list[tuple[Any, str]]]:
    """Per op, (the shipped row's value, TUNED's row line) where the shipped tables name
    TUNED's bucket exactly, with the same keys, and another config (a shipped row naming
    more keys than TUNED's serves a narrower bucket TUNED did not measure alone)."""
    out: dict[str, list[tuple[Any, str]]] = {}
    for op, row, found, exact in _pairs(tuned_path, skip):
        if (exact and found is not None
                and found.config.identity() != row.config.identity()
                and set(dict(found.when)) == set(dict(row.when))):
            out.setdefault(op, []).append((found.as_dict(), _line(row)))
    return out


def _table_span(lines: list[str], op: str) -> tuple[int, int]:
    """The line numbers of op's ``table = [`` and of its closing ``]``."""
    start = lines.index(f"[ops.{op}]")
    table = next(i for i in range(start, len(lines)) if lines[i] == "table = [")
    return table, next(i for i in range(table, len(lines)) if lines[i] == "]")


def _parsed(line: str) -> Any:
    body = line.strip().rstrip(",")
    if not body.startswith("{"):
        return None
    try:
        return tomllib.loads(f"x = {body}")["x"]
    except tomllib.TOMLDecodeError:
        return None


def replace(text: str, rows: dict[str, list[tuple[Any, str]]], note: str) -> tuple[str, int]:
    lines = text.splitlines()
    done = 0
    for op, pairs in rows.items():
        table, end = _table_span(lines, op)
        for old, new in pairs:
            for i in range(table + 1, end):
                if _parsed(lines[i]) == old:
                    lines[i] = f"{new}  # {note}"
                    done += 1
                    break
    return "\n".join(lines) + "\n", done


def insert(text: str, rows: dict[str, list[str]], note: str) -> str:
    lines = text.splitlines()
    for op, new in rows.items():
        _, end = _table_span(lines, op)
        lines[end:end] = [f"    # {note}", *new]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tuned", type=Path)
    p.add_argument("--skip", default="", help="comma-separated ops to leave alone")
    p.add_argument("--note", required=True, help="the comment put above each op's new rows")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--replace", action="store_true",
                   help="also replace exact rows whose config differs from TUNED's")
    p.add_argument("--out", type=Path, default=SM90, help="where to write (default: in place)")
    args = p.parse_args()
    skip = {s for s in args.skip.split(",") if s}
    rows = missing_rows(args.tuned, skip)
    for op, new in rows.items():
        print(f"{op}: {len(new)} rows added")
        if args.dry_run:
            print("\n".join(new))
    text = insert(SM90.read_text(), rows, args.note)
    if args.replace:
        swaps = replaced_rows(args.tuned, skip)
        text, done = replace(text, swaps, args.note)
        for op, pairs in swaps.items():
            print(f"{op}: {len(pairs)} rows replaced")
            if args.dry_run:
                print("\n".join(f"    was {old}\n{new}" for old, new in pairs))
        print(f"{done} of {sum(len(v) for v in swaps.values())} replaced rows found by value")
    if not args.dry_run:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
