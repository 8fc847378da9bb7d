"""How operator commands print: aligned tables with cells cut to ``MAX_CELL``, CSV, indented JSON (the
HTTP API's documents), the "more" and window lines of a report page, ages and key-conflict diffs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from .. import documents

MAX_CELL = 72


def cell(value: Any) -> str:
    # Rows straight from the ledger hold datetimes and Decimals, which json.dumps refuses.
    value = documents.jsonable(value)
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\n", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def print_table(out: TextIO, rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Rows as an aligned text table with the given (header, field) columns."""
    cells = [[h for h, _ in columns]] + [[cell(r.get(f)) for _, f in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


def print_csv(out: TextIO, rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> None:
    """Rows as CSV with a header; nested values as compact JSON."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow(
            [
                ""
                if row.get(f) is None
                else row[f]
                if isinstance(row.get(f), str | int | float)
                else json.dumps(row[f], separators=(",", ":"))
                for f in fields
            ]
        )
    out.write(buffer.getvalue())


def print_json(out: TextIO, document: Any) -> None:
    print(json.dumps(documents.jsonable(document), indent=2, ensure_ascii=False), file=out)


def print_more(out: TextIO, document: dict[str, Any]) -> None:
    if document.get("next_cursor"):
        print(f"\nmore: add --cursor {document['next_cursor']}", file=out)


def print_window(out: TextIO, document: dict[str, Any]) -> None:
    print(f"window: {document.get('since') or '…'} to {document.get('until') or 'now'}\n", file=out)


def age(value: str | None, now: datetime) -> str:
    if not value:
        return ""
    seconds = max(0, int((now - datetime.fromisoformat(value)).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def diff_summary(diff: Sequence[dict[str, Any]], truncated: bool) -> str:
    parts = []
    for entry in diff:
        if entry["change"] == "changed":
            parts.append(f"{entry['path'] or '/'}: {cell(entry['held'])} → {cell(entry['rejected'])}")
        else:
            parts.append(f"{entry['path']}: {entry['change']}")
    return "; ".join(parts) + (" …" if truncated else "")
