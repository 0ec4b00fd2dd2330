"""Fill the buckets the shipped sm90 tables do not name from a `gemsops tune` file.

For every table row of TUNED whose bucket has no exact row in the shipped tables (the
call would launch its nearest row's config), the row is inserted at the end of that op's
`table` in gemsops/tune/nvidia-sm90.toml, after one comment naming TUNED. Rows the
shipped tables name exactly are left as they are (a dedicated sweep may have chosen
them), and so are ops without an sm90 table. --dry-run prints what would be added.

    python .ci/merge_rows.py docs/gpu/s19/h100-d-tuned.toml --skip attention_fwd --note "..."
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gemsops  # noqa: F401  (registers gemsops' tuning directories)
from gemshal import registry, tune
from gemshal.kernel.plan import nearest_row
from gemshal.tune_format import TuneSource, loads
from gemsops.tune_run import _toml_value

SM90 = Path(__file__).resolve().parent.parent / "gemsops" / "tune" / "nvidia-sm90.toml"


def missing_rows(tuned_path: Path, skip: set[str]) -> dict[str, list[str]]:
    """Per op, the TOML lines of TUNED's rows at buckets the shipped tables lack."""
    ctx = tune.context_for(registry.vendor("nvidia"), "sm90", interpreter=False)
    tuned = loads(tuned_path.read_text(), TuneSource(path=tuned_path, level="user", origin="tuned"))
    out: dict[str, list[str]] = {}
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
            _, exact = nearest_row(shipped.table, dict(row.when), row.dtype)
            if not exact:
                out.setdefault(op, []).append(f"    {_toml_value(row.as_dict())},")
    return out


def insert(text: str, rows: dict[str, list[str]], note: str) -> str:
    lines = text.splitlines()
    for op, new in rows.items():
        start = lines.index(f"[ops.{op}]")
        table = next(i for i in range(start, len(lines)) if lines[i] == "table = [")
        end = next(i for i in range(table, len(lines)) if lines[i] == "]")
        lines[end:end] = [f"    # {note}", *new]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tuned", type=Path)
    p.add_argument("--skip", default="", help="comma-separated ops to leave alone")
    p.add_argument("--note", required=True, help="the comment put above each op's new rows")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    rows = missing_rows(args.tuned, {s for s in args.skip.split(",") if s})
    for op, new in rows.items():
        print(f"{op}: {len(new)} rows")
        if args.dry_run:
            print("\n".join(new))
    if not args.dry_run:
        SM90.write_text(insert(SM90.read_text(), rows, args.note))


if __name__ == "__main__":
    main()
