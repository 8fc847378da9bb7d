"""How a dashboard page is drawn: the Jinja2 environment and its filters, the page frame (navigation,
headers, the form token), table cells and filter forms from a report's spec, and the stylesheet.

Templates are Jinja2, shipped as package data (``templates/``), with escaping on by default. The
Content-Security-Policy allows no script and no inline style; the one stylesheet is served from
``/ui/static/dashboard.css``. ``?refresh=30`` (or 60, 300) reloads a page by ``<meta http-equiv>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from effectgate.ledger.reports import AUTH_FAILURES, DUPLICATES, JOBS, KEY_CONFLICTS, REPORTS
from effectgate.ledger.reports.spec import Column, ColumnType, FilterType, ReportSpec

from ...config.operator import OperatorToken
from .. import documents, reporting
from ..params import BadParameter
from ..sessions import SignedIn

CSP = "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
NAV = [
    ("/ui/", "Overview"),
    ("/ui/duplicates", "Duplicates"),
    ("/ui/rejects", "Rejects"),
    ("/ui/jobs", "Jobs"),
]
# Reports shown by the pages above; every other report is linked in the header by its own name.
_IN_NAV = {DUPLICATES.name, KEY_CONFLICTS.name, AUTH_FAILURES.name, JOBS.name}
RANGES = [("1h", "1h"), ("6h", "6h"), ("24h", "24h"), ("7d", "7d"), ("30d", "30d")]
REFRESH = [("off", None), ("30 s", "30"), ("1 min", "60"), ("5 min", "300")]
# Page parameters that are not a report's.
_PAGE_PARAMETERS = ("refresh", "done", "refused")


def _when(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def duration(seconds: float) -> str:
    """A short human duration: ``42 s``, ``3 min``, ``2 h 5 min``, ``3 d 4 h``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 >= 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 >= 3600 else f"{s // 86400} d"


def ago(value: str | datetime | None, now: datetime | None = None) -> str:
    """``3 min ago`` (or ``in 3 min`` for a time to come)."""
    if not value:
        return ""
    seconds = ((now or datetime.now(UTC)) - _when(value)).total_seconds()
    if abs(seconds) < 1:
        return "just now"
    return f"{duration(seconds)} ago" if seconds > 0 else f"in {duration(seconds)}"


def short_time(value: str | datetime | None) -> str:
    """``2025-03-04 11:00:00`` in UTC, the zone the whole dashboard shows."""
    if not value:
        return ""
    return _when(value).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _compact_json(value: Any) -> str:
    return value if isinstance(value, str) else documents.dumps(value)


def _with_params(query: Mapping[str, str], **changes: str | None) -> str:
    merged = {**query, **changes}
    return urlencode({k: v for k, v in merged.items() if v is not None and k not in ("done", "refused")})


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("effectgate.gateway.operator", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(
    ago=ago,
    short_time=short_time,
    urlpart=lambda value: quote(str(value), safe=""),
    compact_json=_compact_json,
    pretty_json=lambda value: json.dumps(documents.jsonable(value), indent=2, ensure_ascii=False),
    percent=lambda value: f"{100 * float(value):.1f} %",
    with_params=_with_params,
)


def _stylesheet_text() -> str:
    return files("effectgate.gateway.operator").joinpath("templates", "dashboard.css").read_text("utf-8")


STYLESHEET = _stylesheet_text()


def render(
    template: str,
    title: str,
    operator: OperatorToken | None,
    *,
    status: int = 200,
    refresh: str | None = None,
    **context: Any,
) -> HTMLResponse:
    """A whole dashboard page from ``template``."""
    extra = [("/ui/" + reporting.slug(s), s.title) for s in REPORTS if s.name not in _IN_NAV]
    html = ENV.get_template(template).render(
        title=title,
        operator=operator,
        nav=[*NAV, *extra],
        refresh=refresh,
        operate=operator is not None and operator.allows("operate"),
        csrf=csrf_of(operator) if operator is not None else "",
        **context,
    )
    return HTMLResponse(
        html,
        status_code=status,
        headers={"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Cache-Control": "no-store"},
    )


def message(
    title: str, text: str, operator: OperatorToken | None, *, status: int, kind: str = "error"
) -> Response:
    """A page that says one thing."""
    return render("message.html", title, operator, status=status, message=text, kind=kind)


@dataclass(frozen=True, slots=True)
class Cell:
    """A table column: its header, the row field it shows, and how (``kind``, see macros.html)."""

    title: str
    field: str
    kind: str = "text"


_KINDS = {
    ColumnType.TIME: "time",
    ColumnType.STATE: "state",
    ColumnType.DIFF: "diff",
    ColumnType.INTEGER: "num",
    ColumnType.NUMBER: "num",
    ColumnType.JSON: "json",
}


def cell(column: Column, spec: ReportSpec | None = None) -> Cell:
    """How a report column is shown: a key links to its lineage, a job id to its job, a fingerprint is
    shortened, a rate has a bar, a time says how long ago."""
    kind = _KINDS.get(column.type, "text")
    if column.name == "effect_key":
        kind = "key"
    elif column.name == "job_id" or (spec is JOBS and column.name == "id"):
        kind = "job"
    elif column.name.endswith("fingerprint"):
        kind = "fingerprint"
    elif column.name.endswith("_rate"):
        kind = "rate"
    return Cell(column.title, column.name, kind)


def cells(columns: Sequence[Column], spec: ReportSpec | None = None) -> list[Cell]:
    return [cell(c, spec) for c in columns]


@dataclass(frozen=True, slots=True)
class FormField:
    """One input of a report's filter form."""

    name: str
    label: str
    help: str
    placeholder: str = ""
    choices: tuple[str, ...] = ()


def form_fields(spec: ReportSpec, names: Sequence[str] | None = None) -> list[FormField]:
    """The filter form of a report: its filters, its sort when it has a choice, and the window."""
    fields = []
    for name in names or [n for n in reporting.parameters(spec) if n not in ("limit", "cursor")]:
        help = reporting.describe(spec, name)
        label = name.replace("_", " ")
        if name == "sort":
            default = f"default ({spec.sorts[0].name})"
            fields.append(FormField(name, label, help, default, tuple(s.name for s in spec.sorts)))
        elif name in ("since", "until"):
            open_end = "any" if spec.window is None else None
            fields.append(FormField(name, label, help, open_end or ("24h" if name == "since" else "now")))
        else:
            states = any(f.name == name and f.type is FilterType.STATES for f in spec.filters)
            fields.append(FormField(name, label, help, "failed,parked" if states else "any"))
    return fields


def csrf_of(operator: OperatorToken) -> str:
    """The form token a page carries for ``operator`` (empty for a bearer token, which has no session)."""
    return operator.csrf if isinstance(operator, SignedIn) else ""


def refresh_of(query: Mapping[str, str]) -> str | None:
    """The page's ``?refresh=`` in seconds, one of ``REFRESH``; anything else is a bad parameter."""
    value = query.get("refresh")
    if value is not None and value not in {v for _, v in REFRESH}:
        raise BadParameter("refresh", f"expected one of {', '.join(v for _, v in REFRESH if v)} seconds")
    return value


async def stylesheet(request: Request) -> Response:
    """The dashboard's stylesheet (the CSP allows no inline style)."""
    return Response(STYLESHEET, media_type="text/css", headers={"Cache-Control": "max-age=300"})


def toolbar(path: str, query: Mapping[str, str]) -> dict[str, Any]:
    """The template context of a page's toolbar: its time ranges and refresh choices."""
    return {"path": path, "query": query, "ranges": RANGES, "refresh_choices": REFRESH}
