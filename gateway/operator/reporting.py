"""What every face does with a ``ReportSpec``: the parameters it takes, reading them from text into the
ledger's typed ``ReportQuery``, running it, and the JSON document of a page.

The API (``api.py``), the CLI (``cli/``), the OpenAPI document (``openapi.py``) and the
dashboard (``dashboard/``) each render any spec with one generic function over these; none of them
names a report's filters, sorts or columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from effectgate.ledger import db
from effectgate.ledger.reports.spec import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    FilterType,
    Page,
    ReportQuery,
    ReportSpec,
    run,
)

from . import documents
from .params import (
    TIME_HELP,
    BadParameter,
    decode_cursor,
    encode_cursor,
    parse_limit,
    parse_name,
    parse_states,
    parse_window,
)

WINDOW_PARAMETERS = ("since", "until", "limit", "cursor")
# Where a report lives under /api/ when not at /api/<name-with-dashes> (the paths these had first).
_API_PATHS = {"key_conflicts": "/rejects/conflicts", "auth_failures": "/rejects/auth"}


def api_path(spec: ReportSpec) -> str:
    """The report's path under ``/api``."""
    return _API_PATHS.get(spec.name, "/" + spec.name.replace("_", "-"))


def slug(spec: ReportSpec) -> str:
    """The report's name on the command line and in the dashboard's paths."""
    return spec.name.replace("_", "-")


def has_sorts(spec: ReportSpec) -> bool:
    """Whether the report offers a choice of order (and so takes ``sort`` and names it in its document)."""
    return len(spec.sorts) > 1


def parameters(spec: ReportSpec) -> tuple[str, ...]:
    """Every parameter the report takes, in the order the faces list them."""
    return (*(f.name for f in spec.filters), *(("sort",) if has_sorts(spec) else ()), *WINDOW_PARAMETERS)


def describe(spec: ReportSpec, name: str) -> str:
    """One sentence on a parameter, for a flag's help, an OpenAPI parameter and a form's hint."""
    for f in spec.filters:
        if f.name == name:
            return f.help
    default = ""
    if spec.window is not None:
        default = f" Default: {int(spec.window.total_seconds() // 3600)} hours before until."
    return {
        "since": f"Start of the window (inclusive): {TIME_HELP}.{default}",
        "until": f"End of the window (exclusive), the same forms; default now{'' if spec.window else ' (open)'}.",
        "sort": "Order; a leading '-' is descending: "
        + ", ".join(f"{s.name} ({s.help})" for s in spec.sorts)
        + f". Default {spec.sorts[0].name}.",
        "limit": f"Page size, 1..{MAX_LIMIT} (default {DEFAULT_LIMIT}).",
        "cursor": "The next_cursor of the previous page, unchanged.",
    }[name]


def cursor_tag(spec: ReportSpec, sort_name: str) -> str:
    return f"{spec.name}:{sort_name}"


def parse(spec: ReportSpec, raw: Mapping[str, str | None], *, now: datetime | None = None) -> ReportQuery:
    """The typed query for parameters given as text; ``BadParameter`` names the first bad one."""
    unknown = sorted(set(raw) - set(parameters(spec)))
    if unknown:
        raise BadParameter(
            unknown[0][:100],
            f"unknown parameter; this report takes {', '.join(parameters(spec))}",
            code="unknown_parameter",
        )
    now = now if now is not None else datetime.now(UTC)
    since, until = parse_window(raw.get("since"), raw.get("until"), now=now, default=spec.window)
    filters: dict[str, str | tuple[str, ...]] = {}
    for f in spec.filters:
        text = raw.get(f.name)
        value = parse_states(text, f.name) if f.type is FilterType.STATES else parse_name(text, f.name)
        if value is not None:
            filters[f.name] = value
    sort_name = raw.get("sort") or spec.sorts[0].name
    sort = next((s for s in spec.sorts if s.name == sort_name), None)
    if sort is None:
        raise BadParameter(
            "sort", f"expected one of {', '.join(s.name for s in spec.sorts)}, got {raw.get('sort')!r}"
        )
    limit = parse_limit(raw.get("limit"), DEFAULT_LIMIT)
    kinds = [spec.column(field).type for field in sort.fields]
    after = decode_cursor(raw.get("cursor"), cursor_tag(spec, sort.name), kinds)
    return ReportQuery(since, until, filters, sort.name, limit, after)


async def fetch(
    conn: db.Conn, spec: ReportSpec, raw: Mapping[str, str | None], *, now: datetime | None = None
) -> Page:
    """Read the parameters, then run the report."""
    return await run(conn, spec, parse(spec, raw, now=now))


def next_cursor(page: Page) -> str | None:
    if page.next_after is None:
        return None
    return encode_cursor(cursor_tag(page.spec, page.sort.name), page.next_after)


def document(page: Page) -> dict[str, Any]:
    """The JSON document of a page: what ``/api/…`` answers and ``--format json`` prints."""
    spec = page.spec
    doc: dict[str, Any] = {
        "since": documents.timestamp(page.since) if page.since else None,
        "until": documents.timestamp(page.until) if page.until else None,
    }
    if has_sorts(spec):
        doc["sort"] = page.sort.name
    doc[spec.items_key] = [documents.pick(r, [c.name for c in spec.columns]) for r in page.items]
    doc["next_cursor"] = next_cursor(page)
    if spec.summary is not None:
        doc[spec.summary.key] = [
            documents.pick(r, [c.name for c in spec.summary.columns]) for r in page.summary
        ]
    return doc


async def report_document(
    conn: db.Conn, spec: ReportSpec, raw: Mapping[str, str | None], *, now: datetime | None = None
) -> dict[str, Any]:
    """Read the parameters, run the report, and return its document."""
    return document(await fetch(conn, spec, raw, now=now))
