"""The dashboard under ``/ui/``: server-rendered HTML with inline SVG charts — no build step, no script.

Pages: an overview for the on-call engineer (failed and parked jobs and the oldest due job up front;
duplicate and reject rates per source; duplicates, key conflicts and authentication failures over
time; the latest of each), a page for every report (its filter form, rows and summary come from its
spec), the rejects, effect lineage, and jobs with redrive, cancel and resolve-by-hand buttons for ``operate`` tokens, and
a bulk form (``/ui/jobs/bulk``: redrive or cancel every job a filter matches, dry run first).
Every page reads ``ledger.reports``, the code path of the API and the CLI.

Templates are Jinja2, shipped as package data (``templates/``), with escaping on by default. The
Content-Security-Policy allows no script and no inline style; the one stylesheet is served from
``/ui/static/dashboard.css``. ``?refresh=30`` (or 60, 300) reloads a page by ``<meta http-equiv>``.

A browser cannot send a bearer header by itself, so ``/ui/login`` takes the operator token once and
keeps it in an ``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/ui``; each request checks it like
the API checks its header. Forms that act (redrive, cancel, resolve) also carry a token derived from the
operator's token hash, which a page of another site can neither read nor compute.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from effectgate.handlers import bulk as bulk_actions
from effectgate.handlers import control
from effectgate.ledger import db, reports, resolutions
from effectgate.ledger import jobs as ledger_jobs
from effectgate.ledger.errors import LedgerError, LedgerUnavailable
from effectgate.ledger.report_spec import Column, ColumnType, FilterType, ReportSpec
from effectgate.ledger.reports import (
    AUTH_FAILURES,
    DELIVERY_OUTCOMES,
    DUPLICATES,
    JOBS,
    KEY_CONFLICTS,
    REPORTS,
)
from effectgate.ledger.vocabulary import JobState

from ..bodies import MAX_OPERATOR_BODY_BYTES, BodyTooLarge, read_body
from . import documents, reporting, sessions
from .auth import OperatorToken, authenticate
from .params import (
    PARAMETER_ERRORS,
    BadParameter,
    parse_id,
    parse_job_filter,
    parse_name,
    parse_window,
)
from .sessions import COOKIE, SignedIn
from .throttle import FailureThrottle, client_key, retry_after

log = logging.getLogger("effectgate.operator")
MAX_FORM_BYTES = MAX_OPERATOR_BODY_BYTES
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


# -- rendering -------------------------------------------------------------------------------------


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
        csrf=_csrf(operator) if operator is not None else "",
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


# -- charts ----------------------------------------------------------------------------------------


def _nice(peak: int) -> int:
    # The axis top: the peak rounded up to 1, 2 or 5 times a power of ten.
    if peak <= 0:
        return 1
    magnitude: int = 10 ** int(math.log10(peak))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= peak)


def chart(
    title: str, rows: Sequence[Mapping[str, Any]], field: str, color: str, bucket: timedelta
) -> dict[str, Any]:
    """The geometry of a bar chart with axes, labels and its total, one bar per bucket."""
    width, height, left, right, top, bottom = 400, 170, 34, 8, 8, 34
    base = height - bottom
    values = [int(r[field]) for r in rows]
    peak = max(values, default=0)
    axis_top = _nice(peak)
    step = (width - left - right) / max(len(rows), 1)
    hourly = bucket < timedelta(days=1)
    pattern = "%m-%d %H:%M" if hourly else "%Y-%m-%d"

    def label(t: datetime) -> str:
        return t.astimezone(UTC).strftime(pattern)

    bars = []
    for i, (row, value) in enumerate(zip(rows, values, strict=True)):
        h = (base - top) * value / axis_top
        bars.append(
            {
                "x": f"{left + i * step + 0.5:.1f}",
                "y": f"{base - h:.1f}",
                "w": f"{max(step - 1, 1):.1f}",
                "h": f"{h:.1f}",
                "label": label(row["bucket"]),
                "value": value,
            }
        )
    marks = [0, axis_top // 2, axis_top] if axis_top % 2 == 0 else [0, axis_top]
    yticks = [{"y": round(base - (base - top) * v / axis_top, 1), "label": v} for v in marks]
    xticks = []
    for i, anchor in ((0, "start"), (len(rows) // 2, "middle"), (len(rows) - 1, "end")):
        if rows and (i > 0 or anchor == "start"):
            x = left + i * step + (step / 2 if anchor == "middle" else 0 if anchor == "start" else step)
            xticks.append({"x": f"{x:.1f}", "anchor": anchor, "label": label(rows[i]["bucket"])})
    return {
        "title": title,
        "total": sum(values),
        "peak": peak,
        "per": "hour" if hourly else "day",
        "color": color,
        "width": width,
        "height": height,
        "left": left,
        "right": right,
        "top": top,
        "base": base,
        "bars": bars,
        "yticks": yticks,
        "xticks": xticks,
    }


# -- auth ------------------------------------------------------------------------------------------


def _operator(request: Request, scope: str) -> SignedIn | None:
    return sessions.read(
        request.app.state.session_key, request.cookies.get(COOKIE), request.app.state.config.operators
    )


def _csrf(operator: OperatorToken) -> str:
    return operator.csrf if isinstance(operator, SignedIn) else ""


def _throttle(request: Request) -> FailureThrottle:
    throttle: FailureThrottle = request.app.state.auth_throttle
    return throttle


def _safe_next(value: str | None) -> str:
    # Only a path of this dashboard: a login link must not send the operator elsewhere.
    if value and value.startswith("/ui/") and not value.startswith("/ui//") and "\\" not in value:
        return value
    return "/ui/"


async def _form(request: Request) -> dict[str, str]:
    # Bounded before it is read: past the limit, BodyTooLarge becomes form_too_large's 413 page.
    body = await read_body(request, MAX_FORM_BYTES)
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def form_too_large(exc: BodyTooLarge) -> Response:
    """The dashboard's answer to a form over the limit: a 413 page, read no further."""
    return message(
        "Form too large", f"The form is over {exc.limit} bytes (payload_too_large).", None, status=413
    )


def _refresh(query: Mapping[str, str]) -> str | None:
    value = query.get("refresh")
    if value is not None and value not in {v for _, v in REFRESH}:
        raise BadParameter("refresh", f"expected one of {', '.join(v for _, v in REFRESH if v)} seconds")
    return value


# -- pages -----------------------------------------------------------------------------------------

View = Callable[[Request, db.Conn, OperatorToken, dict[str, str]], Awaitable[Response]]


def view(scope: str = "view") -> Callable[[View], Callable[[Request], Awaitable[Response]]]:
    """Wrap a page: require a signed-in operator with ``scope``, open a connection, render errors."""

    def wrap(fn: View) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            operator = _operator(request, "view")
            if operator is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/ui/login?{urlencode({'next': target})}", status_code=303)
            if not operator.allows(scope):
                return message(
                    "Not allowed", f"operator {operator.name} lacks the {scope} scope", operator, status=403
                )
            query = {k: v for k, v in request.query_params.items() if v != ""}
            try:
                async with db.connection(request.app.state.pool) as conn:
                    return await fn(request, conn, operator, query)
            except PARAMETER_ERRORS as exc:
                return message(
                    "Bad filter", f"{exc.parameter}: {exc.detail} ({exc.code})", operator, status=400
                )
            except LedgerUnavailable:
                return message(
                    "Ledger unavailable", "The ledger database cannot be reached.", operator, status=503
                )
            except LedgerError:
                return message(
                    "Ledger error", "The ledger could not answer; see the gateway log.", operator, status=500
                )

        return run

    return wrap


async def login_form(request: Request) -> Response:
    """The sign-in form."""
    return _login_page(_safe_next(request.query_params.get("next")), "")


def _login_page(target: str, problem: str, status: int = 200) -> HTMLResponse:
    return render("login.html", "Sign in", None, status=status, target=target, problem=problem)


async def login(request: Request) -> Response:
    """Check the token; on success start a session. Wrong tokens are throttled per client (``throttle``),
    and the right one is let in whatever the throttle says, so no one can lock an operator out."""
    form = await _form(request)
    target = _safe_next(form.get("next"))
    client = client_key(request)
    token = form.get("token", "").strip()
    who = authenticate(f"Bearer {token}", request.app.state.config.operators, "view")
    if not isinstance(who, OperatorToken):
        wait = _throttle(request).failed(client)
        if wait > 0:
            response = _login_page(target, "Too many wrong tokens from this address; try again later.", 429)
            response.headers["Retry-After"] = retry_after(wait)
            return response
        log.info("dashboard.sign_in_failed", extra={"client": client})
        return _login_page(target, "That token is not a configured operator token.", 401)
    ttl = request.app.state.config.dashboard.session_ttl
    signed_in = RedirectResponse(target, status_code=303)
    signed_in.set_cookie(
        COOKIE,
        sessions.issue(request.app.state.session_key, who, ttl),
        max_age=int(ttl),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request),
    )
    log.info("dashboard.signed_in", extra={"operator": who.name, "client": client})
    return signed_in


def secure_cookie(request: Request) -> bool:
    """Whether the session cookie is ``Secure``: as ``[operator] secure_cookies`` says, else when the
    request came over https (directly, or as a trusted proxy's ``X-Forwarded-Proto`` says)."""
    configured: bool | None = request.app.state.config.operator.secure_cookies
    return request.url.scheme == "https" if configured is None else configured


async def logout(request: Request) -> Response:
    """Sign out: a POST carrying the session's form token, so another site cannot sign anyone out."""
    operator = _operator(request, "view")
    form = await _form(request)
    if operator is not None and not hmac.compare_digest(form.get("csrf", ""), operator.csrf):
        return message("Not allowed", "The form was not sent from this dashboard.", operator, status=403)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


async def stylesheet(request: Request) -> Response:
    """The dashboard's stylesheet (the CSP allows no inline style)."""
    return Response(STYLESHEET, media_type="text/css", headers={"Cache-Control": "max-age=300"})


def _raw(spec: ReportSpec, query: Mapping[str, str], **changes: str) -> dict[str, str]:
    # A page's own parameters (refresh=, done=) are not the report's.
    raw = {k: v for k, v in query.items() if k in reporting.parameters(spec)}
    return {**raw, **changes}


async def _document(
    conn: db.Conn, spec: ReportSpec, query: Mapping[str, str], **changes: str
) -> dict[str, Any]:
    return reporting.document(await reporting.fetch(conn, spec, _raw(spec, query, **changes)))


def _cards(gauges: reports.JobGauges) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for row in gauges.by_state_kind:
        counts[row["state"]] = counts.get(row["state"], 0) + int(row["n"])
    waited = gauges.oldest_due_seconds
    cards = []
    for state, what in (("failed", "failed jobs"), ("parked", "parked jobs")):
        n = counts.get(state, 0)
        cards.append(
            {"value": n, "what": what, "tone": "bad" if n else "ok", "href": f"/ui/jobs?state={state}"}
        )
    cards.append(
        {
            "value": duration(waited) if waited else "none",
            "what": "oldest due job waiting" if waited else "no job waiting to run",
            "tone": "warn" if waited >= 60 else "ok",
            "href": "/ui/jobs?state=pending&sort=created",
        }
    )
    for state, what in (("pending", "pending jobs"), ("running", "running jobs")):
        cards.append(
            {"value": counts.get(state, 0), "what": what, "tone": "", "href": f"/ui/jobs?state={state}"}
        )
    return cards


def _toolbar(path: str, query: Mapping[str, str]) -> dict[str, Any]:
    return {"path": path, "query": query, "ranges": RANGES, "refresh_choices": REFRESH}


@view()
async def overview(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """What needs a human now, then duplicate and reject rates and the latest of each."""
    refresh = _refresh(query)
    window = {k: v for k, v in query.items() if k in ("source", "since", "until")}
    since, until = parse_window(
        window.get("since"), window.get("until"), now=datetime.now(UTC), default=reports.DEFAULT_WINDOW
    )
    assert since is not None and until is not None
    act = await reports.activity(
        conn, source=parse_name(window.get("source"), "source"), since=since, until=until
    )
    outcomes = await _document(conn, DELIVERY_OUTCOMES, window, sort="-deliveries")
    dups = await _document(conn, DUPLICATES, window, limit="10")
    conflicts = await _document(conn, KEY_CONFLICTS, window, limit="10")
    auth = await _document(conn, AUTH_FAILURES, window, limit="1")
    charts = [
        chart("Duplicate deliveries", act.rows, "duplicates", "#3f6fd8", act.bucket),
        chart("Key conflicts", act.rows, "conflicts", "#d8863f", act.bucket),
        chart("Authentication failures", act.rows, "auth_failures", "#b00020", act.bucket),
    ]
    outcome_columns = cells(DELIVERY_OUTCOMES.columns, DELIVERY_OUTCOMES)
    return render(
        "overview.html",
        "Overview",
        operator,
        refresh=refresh,
        cards=[
            *_cards(await reports.job_gauges(conn)),
            {
                "value": await resolutions.count_between(conn, since=since, until=until),
                "what": "resolved by hand in the window",
                "tone": "",
                "href": "/ui/jobs?state=resolved",
            },
        ],
        **_toolbar("/ui/", query),
        fields=form_fields(DUPLICATES, ["source", "since", "until"]),
        since=since,
        until=until,
        per="hour" if act.bucket < timedelta(days=1) else "day",
        charts=charts,
        outcomes=outcomes[DELIVERY_OUTCOMES.items_key],
        outcome_columns=outcome_columns,
        duplicates=dups["items"],
        duplicate_columns=cells(DUPLICATES.table_columns, DUPLICATES),
        conflicts=conflicts["items"],
        conflict_columns=cells(KEY_CONFLICTS.table_columns, KEY_CONFLICTS),
        auth=auth["by_reason"],
        auth_columns=cells(AUTH_FAILURES.summary.columns if AUTH_FAILURES.summary else ()),
    )


@dataclass(frozen=True, slots=True)
class Section:
    """A table on a report page."""

    title: str
    columns: list[Cell]
    rows: list[dict[str, Any]]
    cursor: str | None = None
    note: str = ""


def report_page(spec: ReportSpec) -> Callable[[Request], Awaitable[Response]]:
    """The page of any report: its filter form, one page of rows and its summary, all from its spec."""
    path = "/ui/" + reporting.slug(spec)
    # Jobs carry their redrive, cancel and resolve buttons (shown to operate tokens only).
    actions = [Cell("", "id", "actions")] if spec is JOBS else []

    async def page(
        request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
    ) -> Response:
        refresh = _refresh(query)
        document = await _document(conn, spec, query)
        sections = [
            Section(
                "",
                [*cells(spec.table_columns, spec), *actions],
                document[spec.items_key],
                document["next_cursor"],
            )
        ]
        if spec.summary is not None:
            sections.append(
                Section(
                    spec.summary.title.capitalize(), cells(spec.summary.columns), document[spec.summary.key]
                )
            )
        return render(
            "report.html",
            spec.title,
            operator,
            refresh=refresh,
            description=spec.description,
            **_toolbar(path, query),
            fields=form_fields(spec),
            document=document,
            sections=sections,
        )

    page.__doc__ = spec.title
    return view()(page)


@view()
async def rejects(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """Key conflicts with their diffs, and authentication failures."""
    refresh = _refresh(query)
    document = await _document(conn, KEY_CONFLICTS, query)
    auth = await _document(conn, AUTH_FAILURES, {k: v for k, v in query.items() if k != "cursor"})
    by_reason = AUTH_FAILURES.summary.columns if AUTH_FAILURES.summary else ()
    sections = [
        Section(
            "Key conflicts",
            cells(KEY_CONFLICTS.table_columns, KEY_CONFLICTS),
            document["items"],
            document["next_cursor"],
            "A different payload reused an effect key already held: recorded, never run.",
        ),
        Section(
            "Authentication failures by reason",
            cells(by_reason),
            auth["by_reason"],
            note="Signature checks that failed; bodies are never kept.",
        ),
        Section(
            "Authentication failures per minute (newest first)",
            cells(AUTH_FAILURES.table_columns),
            auth["per_minute"],
        ),
    ]
    return render(
        "report.html",
        "Rejects",
        operator,
        refresh=refresh,
        description="",
        **_toolbar("/ui/rejects", query),
        fields=form_fields(KEY_CONFLICTS),
        document=document,
        sections=sections,
    )


_NOTICES = {
    "redriven": "Redriven: the job is pending again.",
    "cancelled": "Cancelled.",
    "cancel_requested": "Cancel requested: the job stops at its worker's next heartbeat.",
    "resolved": "Resolved by hand: the job is closed and will not run.",
}
ATTEMPT_CELLS = [
    Cell("#", "attempt", "num"),
    Cell("lease token", "lease_token", "num"),
    Cell("worker", "worker"),
    Cell("started", "started_at", "time"),
    Cell("finished", "finished_at", "time"),
    Cell("outcome", "outcome"),
    Cell("error", "error_type", "error"),
]
STEP_CELLS = [
    Cell("step", "name"),
    Cell("status", "status"),
    Cell("idempotency key", "idempotency_key"),
    Cell("answer", "answer", "json"),
    Cell("recorded", "recorded_at", "time"),
]


def _steps(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s, "answer": s["result"] if s["status"] == "succeeded" else s["error"]} for s in steps]


@view()
async def job_show(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """One job: its state and last error (type, message, folded traceback), its attempts and steps."""
    result = await reports.job_view(conn, parse_id(request.path_params["job_id"], "job_id"))
    if result is None:
        return message(
            "Not found", f"No job {request.path_params['job_id']}.", operator, status=404, kind="muted"
        )
    document = documents.job(result)
    job = document["job"]
    error = job["last_error"] if isinstance(job["last_error"], dict) else None
    return render(
        "job.html",
        f"Job {job['id']}",
        operator,
        job={**job, "last_error": error},
        done=_NOTICES.get(query.get("done", "")),
        refused=query.get("refused"),
        attempts=document["attempts"],
        attempt_columns=ATTEMPT_CELLS,
        steps=_steps(document["steps"]),
        step_columns=STEP_CELLS,
    )


@view()
async def effect(request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]) -> Response:
    """One effect from delivery to outcome."""
    key = request.path_params["key"]
    result = await reports.effect_view(
        conn,
        parse_name(key, "key", max_length=reports.MAX_KEY_LENGTH) or "",
        tenant=parse_name(query.get("tenant"), "tenant"),
    )
    if result is None:
        return message("Not found", f"No effect with key {key}.", operator, status=404, kind="muted")
    document = documents.effect(result)
    payload = documents.dumps(document["effect"]["payload"])
    return render(
        "effect.html",
        f"Effect {key}",
        operator,
        effect=document["effect"],
        job=document["job"],
        steps=_steps(document["steps"]),
        step_columns=STEP_CELLS,
        deliveries=document["deliveries"],
        delivery_columns=[
            Cell("received", "received_at", "time"),
            Cell("outcome", "outcome"),
            Cell("event", "event_id"),
            Cell("request", "request_id", "long"),
            Cell("fingerprint", "fingerprint", "fingerprint"),
        ],
        attempts=document["attempts"],
        attempt_columns=ATTEMPT_CELLS,
        rejects=document["rejects"],
        reject_columns=[
            Cell("received", "received_at", "time"),
            Cell("event", "event_id"),
            Cell("fingerprint", "rejected_fingerprint", "fingerprint"),
            Cell("changes (held → rejected)", "diff", "diff"),
        ],
        payload_size=len(payload.encode("utf-8")),
        payload_open=len(payload) <= 2000,
    )


def _action(kind: str) -> Callable[[Request], Awaitable[Response]]:
    async def act(request: Request) -> Response:
        operator = _operator(request, "view")
        if operator is None:
            return RedirectResponse("/ui/login", status_code=303)
        if not operator.allows("operate"):
            return message(
                "Not allowed", f"operator {operator.name} lacks the operate scope", operator, status=403
            )
        form = await _form(request)
        if not hmac.compare_digest(form.get("csrf", ""), _csrf(operator)):
            return message("Not allowed", "The form was not sent from this dashboard.", operator, status=403)
        try:
            job_id = parse_id(request.path_params["job_id"], "job_id")
            async with db.connection(request.app.state.pool) as conn:
                if kind == "redrive":
                    refusal = await ledger_jobs.redrive(conn, job_id, force=form.get("force") == "true")
                    outcome = "redriven"
                elif kind == "resolve":
                    resolved = await control.resolve(
                        conn,
                        request.app.state.registry,
                        job_id,
                        by=f"operator:{operator.name}",
                        reason=form.get("reason", ""),
                    )
                    refusal = resolved if isinstance(resolved, ledger_jobs.Refused) else None
                    outcome = "resolved"
                else:
                    result = await control.cancel(
                        conn, request.app.state.registry, job_id, by=f"operator:{operator.name}"
                    )
                    refusal = result if isinstance(result, ledger_jobs.Refused) else None
                    outcome = "cancelled" if result == JobState.CANCELLED else "cancel_requested"
        except PARAMETER_ERRORS as exc:
            return message("Bad request", f"{exc.parameter}: {exc.detail}", operator, status=400)
        except LedgerError:
            return message("Ledger unavailable", "The ledger could not answer.", operator, status=503)
        status = {"refused": refusal.code} if refusal else {"done": outcome}
        return RedirectResponse(f"/ui/jobs/{job_id}?{urlencode(status)}", status_code=303)

    act.__doc__ = f"The {kind} button."
    return act


_BULK_FIELDS = ("state", "kind", "source", "since")
_BULK_ACTIONS: tuple[bulk_actions.Action, ...] = ("redrive", "cancel", "resolve")


@view()
async def bulk_form(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """The bulk form, filled from the jobs page's filters: a dry run first."""
    values = {k: v for k, v in query.items() if k in (*_BULK_FIELDS, "action", "reason")}
    return render(
        "bulk.html",
        "Bulk action",
        operator,
        summary=None,
        show_form=True,
        fields=_BULK_FIELDS,
        values=values,
        dry_run=True,
    )


async def bulk(request: Request) -> Response:
    """Redrive, cancel or resolve by hand every job a filter matches; a dry run shows what would happen and offers the same
    filter again, unticked, to act. Refusals are counted by code."""
    operator = _operator(request, "view")
    if operator is None:
        return RedirectResponse("/ui/login", status_code=303)
    form = await _form(request)
    if not operator.allows("operate") or not hmac.compare_digest(form.get("csrf", ""), _csrf(operator)):
        return message("Not allowed", "Not allowed.", operator, status=403)
    action = form.get("action", "")
    dry_run = form.get("dry_run") == "true"
    try:
        chosen = next((a for a in _BULK_ACTIONS if a == action), None)
        if chosen is None:
            raise BadParameter("action", "expected redrive, cancel or resolve")
        where = parse_job_filter(form, now=datetime.now(UTC))
        async with db.connection(request.app.state.pool) as conn:
            result = await bulk_actions.run(
                conn,
                request.app.state.registry,
                chosen,
                where,
                by=f"operator:{operator.name}",
                # Only a resolution takes the form's reason, and needs one; a cancel keeps its default.
                reason=form.get("reason", "") if chosen == "resolve" else None,
                dry_run=dry_run,
            )
    except PARAMETER_ERRORS as exc:
        return message("Bad request", f"{exc.parameter}: {exc.detail}", operator, status=400)
    except LedgerError:
        return message("Ledger unavailable", "The ledger could not answer.", operator, status=503)
    values = {k: v for k, v in form.items() if k in (*_BULK_FIELDS, "action", "reason")}
    return render(
        "bulk.html",
        f"Bulk {action}",
        operator,
        summary=result.summary(),
        show_form=dry_run,
        fields=_BULK_FIELDS,
        values=values,
        dry_run=False,
    )


def routes() -> list[BaseRoute]:
    """The routes of ``/ui``, relative to the mount."""
    return [
        Route("/", overview, methods=["GET"]),
        Route("/static/dashboard.css", stylesheet, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/rejects", rejects, methods=["GET"]),
        *(Route("/" + reporting.slug(spec), report_page(spec), methods=["GET"]) for spec in REPORTS),
        Route("/jobs/bulk", bulk_form, methods=["GET"]),
        Route("/jobs/bulk", bulk, methods=["POST"]),
        Route("/jobs/{job_id}", job_show, methods=["GET"]),
        Route("/jobs/{job_id}/redrive", _action("redrive"), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", _action("cancel"), methods=["POST"]),
        Route("/jobs/{job_id}/resolve", _action("resolve"), methods=["POST"]),
        Route("/effects/{key:path}", effect, methods=["GET"]),
    ]
