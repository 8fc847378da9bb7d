"""The dashboard under ``/ui/``: server-rendered HTML with inline SVG charts — no build step, no script.

Pages: an overview (duplicates, key conflicts and authentication failures over time, the latest of
each), the duplicate and reject reports with their filters, effect lineage, jobs with redrive and
cancel buttons for ``operate`` tokens, and a bulk form (redrive or cancel every job a filter matches, dry run
first). Every page reads ``ledger.reports``, the code path of the API
and the CLI.

A browser cannot send a bearer header by itself, so ``/ui/login`` takes the operator token once and
answers with a session cookie (``HttpOnly``, ``SameSite=Strict``, scoped to ``/ui``, ``Secure`` over
HTTPS) that names the operator's token by id and expires; the token itself is never stored in the
browser (``sessions`` says why the session is signed rather than stored). Failed sign-ins are throttled
per client address. Forms that act (redrive, cancel, sign out) carry a token derived from the session,
which a page of another site can neither read nor compute; signing out is such a form, a POST.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from effectgate.handlers import bulk as bulk_actions
from effectgate.handlers import control
from effectgate.ledger import bulk as ledger_bulk
from effectgate.ledger import db, reports
from effectgate.ledger import jobs as ledger_jobs
from effectgate.ledger.errors import LedgerError, LedgerUnavailable
from effectgate.ledger.reports import InvalidParameter

from . import documents, sessions
from .auth import OperatorToken, authenticate
from .sessions import COOKIE, SignedIn

log = logging.getLogger("effectgate.operator")
MAX_FORM_BYTES = 4096
NAV = [
    ("/ui/", "Overview"),
    ("/ui/duplicates", "Duplicates"),
    ("/ui/rejects", "Rejects"),
    ("/ui/jobs", "Jobs"),
]
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header b{margin-right:1em}main{padding:1em 1.2em}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.2em;font-size:13px}
th,td{border:1px solid #dde1e7;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#eef1f5}
td.num{text-align:right}code{font-size:12px}.error{background:#fde8e8;border:1px solid #f5b5b5;padding:.5em}
.notice{background:#e8f5e9;border:1px solid #a5d6a7;padding:.5em}form.filters{margin:.5em 0}
form.filters input{width:11em}.charts{display:flex;gap:1em;flex-wrap:wrap}figure{margin:0;background:#fff;
padding:.5em;border:1px solid #dde1e7}figcaption{font-weight:600}.state-failed,.state-parked{color:#b00020}
.state-succeeded{color:#1b5e20}button{cursor:pointer}
"""


# -- auth ------------------------------------------------------------------------------------------


def _operator(request: Request, scope: str) -> SignedIn | None:
    return sessions.read(
        request.app.state.session_key, request.cookies.get(COOKIE), request.app.state.config.operators
    )


def _csrf(operator: OperatorToken) -> str:
    return operator.csrf if isinstance(operator, SignedIn) else ""


def _throttle(request: Request) -> sessions.SignInThrottle:
    throttle: sessions.SignInThrottle = request.app.state.sign_in_throttle
    return throttle


def _safe_next(value: str | None) -> str:
    # Only a path of this dashboard: a login link must not send the operator elsewhere.
    if value and value.startswith("/ui/") and not value.startswith("/ui//") and "\\" not in value:
        return value
    return "/ui/"


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


# -- rendering -------------------------------------------------------------------------------------


def h(value: Any) -> str:
    """Any value as escaped HTML text; nested values as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        value = documents.timestamp(value)
    elif not isinstance(value, str):
        value = json.dumps(documents.jsonable(value), ensure_ascii=False, separators=(",", ":"))
    return escape(value)


def page(title: str, body: str, operator: OperatorToken | None, *, status: int = 200) -> HTMLResponse:
    """A whole dashboard page."""
    nav = "".join(f'<a href="{href}">{label}</a>' for href, label in NAV)
    who = (
        f'<span style="margin-left:auto">{h(operator.name)} · <form method="post" action="/ui/logout" '
        f'style="display:inline"><input type="hidden" name="csrf" value="{h(_csrf(operator))}">'
        "<button>log out</button></form></span>"
        if operator
        else ""
    )
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{h(title)} · effectgate</title>'
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>'
        f"<header><b>effectgate</b>{nav if operator else ''}{who}</header><main><h1>{h(title)}</h1>{body}</main>"
        "</body></html>"
    )
    return HTMLResponse(
        html,
        status_code=status,
        headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
            "X-Frame-Options": "DENY",
            "Cache-Control": "no-store",
        },
    )


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str | Callable[[dict[str, Any]], str]]]
) -> str:
    """Rows as an HTML table; a column is a field name (escaped) or a function returning HTML."""
    head = "".join(f"<th>{h(title)}</th>" for title, _ in columns)
    if not rows:
        return f"<table><tr>{head}</tr><tr><td colspan={len(columns)}>(none)</td></tr></table>"
    body = []
    for row in rows:
        cells = []
        for _, column in columns:
            if callable(column):
                cells.append(f"<td>{column(row)}</td>")
            else:
                value = row.get(column)
                num = ' class="num"' if isinstance(value, int) and not isinstance(value, bool) else ""
                cells.append(f"<td{num}>{h(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def chart(title: str, rows: Sequence[dict[str, Any]], field: str, color: str) -> str:
    """A bar chart of one series as inline SVG, one bar per bucket."""
    width, height, pad = 360, 120, 18
    peak = max((int(r[field]) for r in rows), default=0)
    step = (width - 2 * pad) / max(len(rows), 1)
    bars = []
    for i, row in enumerate(rows):
        value = int(row[field])
        bar = 0 if peak == 0 else (height - 2 * pad) * value / peak
        x = pad + i * step
        bars.append(
            f'<rect x="{x:.1f}" y="{height - pad - bar:.1f}" width="{max(step - 1, 1):.1f}" height="{bar:.1f}" '
            f'fill="{color}"><title>{h(row["bucket"])}: {value}</title></rect>'
        )
    first = h(documents.timestamp(rows[0]["bucket"])) if rows else ""
    last = h(documents.timestamp(rows[-1]["bucket"])) if rows else ""
    total = sum(int(r[field]) for r in rows)
    return (
        f"<figure><figcaption>{h(title)} — {total} in all, peak {peak}</figcaption>"
        f'<svg role="img" aria-label="{h(title)}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><line x1="{pad}" y1="{height - pad}" x2="{width - pad}" '
        f'y2="{height - pad}" stroke="#999"/>{"".join(bars)}'
        f'<text x="{pad}" y="{height - 3}" font-size="9">{first}</text>'
        f'<text x="{width - pad}" y="{height - 3}" font-size="9" text-anchor="end">{last}</text></svg></figure>'
    )


def _filters_form(action: str, query: dict[str, str], fields: Sequence[str]) -> str:
    inputs = "".join(
        f'<label>{h(name)} <input name="{h(name)}" value="{h(query.get(name, ""))}"></label> '
        for name in fields
    )
    return f'<form class="filters" method="get" action="{action}">{inputs}<button>Apply</button></form>'


def _next_link(path: str, query: dict[str, str], cursor: str | None) -> str:
    if not cursor:
        return ""
    return f'<p><a href="{path}?{h(urlencode({**query, "cursor": cursor}))}">next page →</a></p>'


def _key_link(row: dict[str, Any]) -> str:
    tenant = row.get("tenant")
    suffix = f"?tenant={quote(tenant, safe='')}" if tenant else ""
    return f'<a href="/ui/effects/{quote(row["effect_key"], safe="")}{suffix}">{h(row["effect_key"])}</a>'


def _job_link(row: dict[str, Any], field: str = "id") -> str:
    return f'<a href="/ui/jobs/{int(row[field])}">{int(row[field])}</a>' if row.get(field) is not None else ""


def _state(row: dict[str, Any]) -> str:
    return f'<span class="state-{h(row["state"])}">{h(row["state"])}</span>'


def _diff(row: dict[str, Any]) -> str:
    items = "".join(
        f"<li><code>{h(d['path'] or '/')}</code> {h(d['change'])}"
        + (f": {h(d['held'])} → {h(d['rejected'])}" if d["change"] == "changed" else "")
        + "</li>"
        for d in row["diff"]
    )
    return f"<ul>{items}</ul>" + ("…" if row["diff_truncated"] else "")


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
                return page(
                    "Not allowed",
                    f'<p class="error">operator {h(operator.name)} lacks the {h(scope)} scope</p>',
                    operator,
                    status=403,
                )
            query = {k: v for k, v in request.query_params.items() if v != ""}
            try:
                async with db.connection(request.app.state.pool) as conn:
                    return await fn(request, conn, operator, query)
            except InvalidParameter as exc:
                return page(
                    "Bad filter",
                    f'<p class="error">{h(exc.parameter)}: {h(exc.detail)} ({h(exc.code)})</p>',
                    operator,
                    status=400,
                )
            except LedgerUnavailable:
                return page(
                    "Ledger unavailable",
                    '<p class="error">The ledger database cannot be reached.</p>',
                    operator,
                    status=503,
                )
            except LedgerError:
                return page(
                    "Ledger error",
                    '<p class="error">The ledger could not answer; see the gateway log.</p>',
                    operator,
                    status=500,
                )

        return run

    return wrap


async def login_form(request: Request) -> Response:
    """The sign-in form."""
    return _login_page(_safe_next(request.query_params.get("next")), "")


def _login_page(target: str, problem: str, status: int = 200) -> HTMLResponse:
    error = f'<p class="error">{h(problem)}</p>' if problem else ""
    return page(
        "Sign in",
        f'{error}<form method="post" action="/ui/login"><input type="hidden" name="next" value="{h(target)}">'
        '<label>Operator token <input type="password" name="token" autocomplete="current-password" autofocus></label> '
        "<button>Sign in</button></form>",
        None,
        status=status,
    )


async def login(request: Request) -> Response:
    """Check the token (throttled per client address); on success start a session."""
    form = await _form(request)
    target = _safe_next(form.get("next"))
    address = request.client.host if request.client else "unknown"
    throttle = _throttle(request)
    wait = throttle.wait(address)
    if wait > 0:
        response = _login_page(target, "Too many failed sign-ins from this address; try again later.", 429)
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response
    token = form.get("token", "").strip()
    who = authenticate(f"Bearer {token}", request.app.state.config.operators, "view")
    if not isinstance(who, OperatorToken):
        throttle.failed(address)
        log.info("dashboard.sign_in_failed", extra={"client": address})
        return _login_page(target, "That token is not a configured operator token.", 401)
    throttle.succeeded(address)
    ttl = request.app.state.config.dashboard.session_ttl
    signed_in = RedirectResponse(target, status_code=303)
    signed_in.set_cookie(
        COOKIE,
        sessions.issue(request.app.state.session_key, who, ttl),
        max_age=int(ttl),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    log.info("dashboard.signed_in", extra={"operator": who.name, "client": address})
    return signed_in


async def logout(request: Request) -> Response:
    """Sign out: a POST carrying the session's form token, so another site cannot sign anyone out."""
    operator = _operator(request, "view")
    form = await _form(request)
    if operator is not None and not hmac.compare_digest(form.get("csrf", ""), operator.csrf):
        return page(
            "Not allowed",
            '<p class="error">The form was not sent from this dashboard.</p>',
            operator,
            status=403,
        )
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


@view()
async def overview(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """Duplicates and rejects over time, and the latest of each."""
    source, since, until = query.get("source"), query.get("since"), query.get("until")
    act = await reports.activity(conn, source=source, since=since, until=until)
    dups = await reports.duplicates(conn, source=source, since=since, until=until, limit=10)
    conflicts = await reports.key_conflicts(conn, source=source, since=since, until=until, limit=10)
    auth = await reports.auth_failures(conn, source=source, since=since, until=until, limit=1)
    per = "hour" if act.bucket.total_seconds() == 3600 else "day"
    body = (
        _filters_form("/ui/", query, ("source", "since", "until"))
        + f"<p>{h(act.since)} to {h(act.until)}, per {per}</p>"
        + '<div class="charts">'
        + chart("Duplicate deliveries", act.rows, "duplicates", "#3f6fd8")
        + chart("Key conflicts", act.rows, "conflicts", "#d8863f")
        + chart("Authentication failures", act.rows, "auth_failures", "#b00020")
        + "</div><h2>Latest duplicates</h2>"
        + table(
            [documents.pick(r, documents.DUPLICATE_FIELDS) for r in dups.items],
            [
                ("last seen", "last_seen_at"),
                ("deliveries", "delivery_count"),
                ("source", "source"),
                ("event type", "event_type"),
                ("key", _key_link),
            ],
        )
        + "<h2>Latest key conflicts</h2>"
        + table(
            [documents.pick(r, documents.CONFLICT_FIELDS) for r in conflicts.items],
            [
                ("received", "received_at"),
                ("source", "source"),
                ("event", "event_id"),
                ("key", _key_link),
                ("changes (held → rejected)", _diff),
            ],
        )
        + "<h2>Authentication failures by reason</h2>"
        + table(
            [documents.pick(r, documents.AUTH_REASON_FIELDS) for r in auth.by_reason],
            [("source", "source"), ("reason", "reason"), ("count", "count"), ("last seen", "last_seen_at")],
        )
    )
    return page("Overview", body, operator)


@view()
async def duplicates(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """The duplicates report with its filters."""
    report = await reports.duplicates(
        conn,
        source=query.get("source"),
        tenant=query.get("tenant"),
        event_type=query.get("event_type"),
        since=query.get("since"),
        until=query.get("until"),
        sort=query.get("sort"),
        limit=query.get("limit"),
        cursor=query.get("cursor"),
    )
    document = documents.duplicates(report)
    body = (
        _filters_form("/ui/duplicates", query, ("source", "tenant", "event_type", "since", "until", "sort"))
        + f"<p>{h(document['since'])} to {h(document['until'])}, sorted {h(document['sort'])}</p>"
        + table(
            document["items"],
            [
                ("last seen", "last_seen_at"),
                ("deliveries", "delivery_count"),
                ("source", "source"),
                ("event type", "event_type"),
                ("tenant", "tenant"),
                ("key", _key_link),
                ("first seen", "first_seen_at"),
            ],
        )
        + _next_link(
            "/ui/duplicates", {k: v for k, v in query.items() if k != "cursor"}, document["next_cursor"]
        )
        + "<h2>Totals over the window</h2>"
        + table(
            document["totals"],
            [
                ("source", "source"),
                ("event type", "event_type"),
                ("effects", "effects"),
                ("deliveries", "deliveries"),
                ("duplicates", "duplicate_deliveries"),
            ],
        )
    )
    return page("Duplicates", body, operator)


@view()
async def rejects(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """Key conflicts with their diffs, and authentication failures."""
    report = await reports.key_conflicts(
        conn,
        source=query.get("source"),
        tenant=query.get("tenant"),
        event_type=query.get("event_type"),
        since=query.get("since"),
        until=query.get("until"),
        limit=query.get("limit"),
        cursor=query.get("cursor"),
    )
    auth = await reports.auth_failures(
        conn, source=query.get("source"), since=query.get("since"), until=query.get("until")
    )
    document = documents.conflicts(report)
    auth_document = documents.auth_failures(auth)
    body = (
        _filters_form("/ui/rejects", query, ("source", "tenant", "event_type", "since", "until"))
        + f"<p>{h(document['since'])} to {h(document['until'])}</p>"
        + "<h2>Key conflicts</h2><p>A different payload reused an effect key already held: recorded, never run.</p>"
        + table(
            document["items"],
            [
                ("received", "received_at"),
                ("source", "source"),
                ("event", "event_id"),
                ("type", "event_type"),
                ("key", _key_link),
                ("held by", "held_event_id"),
                ("held fingerprint", "held_fingerprint"),
                ("rejected fingerprint", "rejected_fingerprint"),
                ("changes (held → rejected)", _diff),
            ],
        )
        + _next_link(
            "/ui/rejects", {k: v for k, v in query.items() if k != "cursor"}, document["next_cursor"]
        )
        + "<h2>Authentication failures</h2><p>Signature checks that failed; bodies are never kept.</p>"
        + table(
            auth_document["by_reason"],
            [("source", "source"), ("reason", "reason"), ("count", "count"), ("last seen", "last_seen_at")],
        )
        + "<h3>Per minute (newest first)</h3>"
        + table(
            auth_document["per_minute"],
            [
                ("minute", "minute"),
                ("source", "source"),
                ("reason", "reason"),
                ("count", "count"),
                ("last detail", "last_detail"),
            ],
        )
    )
    return page("Rejects", body, operator)


def _actions(operator: OperatorToken, job: dict[str, Any]) -> str:
    if not operator.allows("operate"):
        return ""
    csrf = h(_csrf(operator))
    forms = []
    if job["state"] in ("failed", "parked"):
        force = (
            ' <label><input type="checkbox" name="force" value="true"> force (unrecoverable)</label>'
            if job.get("unrecoverable")
            else ""
        )
        forms.append(
            f'<form method="post" action="/ui/jobs/{int(job["id"])}/redrive" style="display:inline">'
            f'<input type="hidden" name="csrf" value="{csrf}"><button name="redrive">Redrive</button>{force}</form>'
        )
    if job["state"] in ("pending", "running") and not job.get("cancel_requested"):
        forms.append(
            f'<form method="post" action="/ui/jobs/{int(job["id"])}/cancel" style="display:inline">'
            f'<input type="hidden" name="csrf" value="{csrf}"><button name="cancel">Cancel</button></form>'
        )
    return " ".join(forms)


@view()
async def job_list(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """Jobs by state, kind, source and age, with actions for operate tokens."""
    report = await reports.jobs(
        conn,
        state=query.get("state"),
        kind=query.get("kind"),
        source=query.get("source"),
        since=query.get("since"),
        until=query.get("until"),
        sort=query.get("sort"),
        limit=query.get("limit"),
        cursor=query.get("cursor"),
    )
    document = documents.jobs(report)
    body = (
        _filters_form("/ui/jobs", query, ("state", "kind", "source", "since", "until", "sort"))
        + table(
            document["items"],
            [
                ("id", _job_link),
                ("state", _state),
                ("kind", "kind"),
                ("source", "source"),
                ("key", _key_link),
                ("attempt", "attempt"),
                ("created", "created_at"),
                ("reason", "terminal_reason"),
                ("", lambda j: _actions(operator, j)),
            ],
        )
        + _next_link("/ui/jobs", {k: v for k, v in query.items() if k != "cursor"}, document["next_cursor"])
        + _bulk_form(operator, query, dry_run=True)
    )
    return page("Jobs", body, operator)


_BULK_FIELDS = ("state", "kind", "source", "since")


def _bulk_form(operator: OperatorToken, values: dict[str, str], *, dry_run: bool) -> str:
    """Redrive or cancel every job a filter matches; a dry run first, then the same filter for real."""
    if not operator.allows("operate"):
        return ""
    inputs = "".join(
        f'<label>{name} <input name="{name}" value="{h(values.get(name, ""))}"></label> '
        for name in _BULK_FIELDS
    )
    action = values.get("action", "redrive")
    options = "".join(
        f'<option value="{a}"{" selected" if a == action else ""}>{a}</option>' for a in ("redrive", "cancel")
    )
    check = " checked" if dry_run else ""
    return (
        '<h2>Bulk action</h2><form method="post" action="/ui/jobs/bulk" class="filters" id="bulk">'
        f'<input type="hidden" name="csrf" value="{h(_csrf(operator))}">{inputs}'
        f'<select name="action">{options}</select> '
        f'<label><input type="checkbox" name="dry_run" value="true"{check}> dry run</label> '
        '<button name="go">Apply to every matching job</button></form>'
    )


async def bulk(request: Request) -> Response:
    """The bulk form: a dry run shows what would happen; unticked, it acts and counts refusals by code."""
    operator = _operator(request, "view")
    if operator is None:
        return RedirectResponse("/ui/login", status_code=303)
    form = await _form(request)
    if not operator.allows("operate") or not hmac.compare_digest(form.get("csrf", ""), _csrf(operator)):
        return page("Not allowed", '<p class="error">Not allowed.</p>', operator, status=403)
    action = form.get("action", "")
    dry_run = form.get("dry_run") == "true"
    try:
        if action not in ("redrive", "cancel"):
            raise InvalidParameter("action", "expected redrive or cancel")
        states = reports.parse_states(form.get("state") or None)
        where = ledger_bulk.JobFilter(
            states=tuple(states) if states else None,
            kind=reports.parse_name(form.get("kind") or None, "kind"),
            source=reports.parse_name(form.get("source") or None, "source"),
            since=reports.parse_time(form.get("since") or None, "since", now=datetime.now(UTC)),
        )
        if where.empty:
            raise InvalidParameter("filter", "give at least one of state, kind, source, since")
        async with db.connection(request.app.state.pool) as conn:
            result = await bulk_actions.run(
                conn,
                request.app.state.registry,
                "redrive" if action == "redrive" else "cancel",
                where,
                by=f"operator:{operator.name}",
                dry_run=dry_run,
            )
    except InvalidParameter as exc:
        return page(
            "Bad request", f'<p class="error">{h(exc.parameter)}: {h(exc.detail)}</p>', operator, status=400
        )
    except LedgerError:
        return page(
            "Ledger unavailable", '<p class="error">The ledger could not answer.</p>', operator, status=503
        )
    summary = result.summary()
    rows = [
        {"what": "matched", "n": summary["matched"]},
        {"what": "done" if not dry_run else "would be done", "n": summary["done"]},
    ]
    rows += [{"what": f"refused {code}", "n": n} for code, n in dict(summary["refused"]).items()]  # type: ignore[call-overload]
    body = (
        f'<p class="notice" id="summary">{"Dry run: nothing was changed. " if dry_run else ""}'
        f"{h(action)}: {summary['done']} of {summary['matched']} jobs.</p>"
        + table(rows, [("", "what"), ("jobs", "n")])
        + (_bulk_form(operator, {**form, "action": action}, dry_run=False) if dry_run else "")
    )
    return page(f"Bulk {action}", body, operator)


_NOTICES = {
    "redriven": "Redriven: the job is pending again.",
    "cancelled": "Cancelled.",
    "cancel_requested": "Cancel requested: the job stops at its worker's next heartbeat.",
}


def _notice(query: dict[str, str]) -> str:
    if query.get("done") in _NOTICES:
        return f'<p class="notice" id="notice">{h(_NOTICES[query["done"]])}</p>'
    if query.get("refused"):
        return f'<p class="error" id="notice">Refused: {h(query["refused"])}</p>'
    return ""


@view()
async def job_show(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """One job with its attempts and steps."""
    result = await reports.job_view(conn, request.path_params["job_id"])
    if result is None:
        return page("Not found", f"<p>No job {h(request.path_params['job_id'])}.</p>", operator, status=404)
    document = documents.job(result)
    job = document["job"]
    fields = "".join(f"<tr><th>{h(k)}</th><td>{h(v)}</td></tr>" for k, v in job.items())
    body = (
        _notice(query)
        + f"<p>{_actions(operator, job)}</p>"
        + f"<p>Effect {_key_link(job)}</p><table>{fields}</table>"
        + "<h2>Attempts</h2>"
        + table(
            document["attempts"],
            [
                ("#", "attempt"),
                ("lease token", "lease_token"),
                ("worker", "worker"),
                ("started", "started_at"),
                ("finished", "finished_at"),
                ("outcome", "outcome"),
                ("error", "error_type"),
                ("message", "error_message"),
            ],
        )
        + "<h2>Steps</h2>"
        + table(
            document["steps"],
            [
                ("step", "name"),
                ("status", "status"),
                ("idempotency key", "idempotency_key"),
                ("answer", lambda s: h(s["result"] if s["status"] == "succeeded" else s["error"])),
                ("recorded", "recorded_at"),
            ],
        )
    )
    return page(f"Job {job['id']}", body, operator)


@view()
async def effect(request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]) -> Response:
    """One effect from delivery to outcome."""
    key = request.path_params["key"]
    result = await reports.effect_view(conn, key, tenant=query.get("tenant"))
    if result is None:
        return page("Not found", f"<p>No effect with key <code>{h(key)}</code>.</p>", operator, status=404)
    document = documents.effect(result)
    effect_doc, job = document["effect"], document["job"]
    summary = (
        f"<table><tr><th>key</th><td>{h(effect_doc['effect_key'])}</td></tr>"
        f"<tr><th>tenant</th><td>{h(effect_doc['tenant'])}</td></tr>"
        f"<tr><th>event</th><td>{h(effect_doc['source'])} {h(effect_doc['event_type'])} {h(effect_doc['event_id'])}</td></tr>"
        f"<tr><th>handler</th><td>{h(effect_doc['handler'])}</td></tr>"
        f"<tr><th>claimed</th><td>{h(effect_doc['first_seen_at'])}</td></tr>"
        f"<tr><th>deliveries / rejects</th><td>{effect_doc['delivery_count']} / {effect_doc['reject_count']}</td></tr>"
        f"<tr><th>fingerprint</th><td><code>{h(effect_doc['fingerprint'])}</code></td></tr>"
        + (
            f"<tr><th>job</th><td>{_job_link(job)} {_state(job)} {h(job['terminal_reason'])}</td></tr>"
            if job
            else "<tr><th>job</th><td>none</td></tr>"
        )
        + "</table>"
    )
    body = (
        summary
        + "<h2>Steps: what was sent downstream, with which idempotency key, and the answer</h2>"
        + table(
            document["steps"],
            [
                ("step", "name"),
                ("status", "status"),
                ("idempotency key", "idempotency_key"),
                ("answer", lambda s: h(s["result"] if s["status"] == "succeeded" else s["error"])),
                ("recorded", "recorded_at"),
            ],
        )
        + "<h2>Deliveries</h2>"
        + table(
            document["deliveries"],
            [
                ("received", "received_at"),
                ("outcome", "outcome"),
                ("event", "event_id"),
                ("request", "request_id"),
            ],
        )
        + "<h2>Attempts</h2>"
        + table(
            document["attempts"],
            [
                ("#", "attempt"),
                ("lease token", "lease_token"),
                ("worker", "worker"),
                ("started", "started_at"),
                ("finished", "finished_at"),
                ("outcome", "outcome"),
                ("error", "error_message"),
            ],
        )
        + "<h2>Rejected deliveries of this key</h2>"
        + table(
            document["rejects"],
            [
                ("received", "received_at"),
                ("event", "event_id"),
                ("fingerprint", "rejected_fingerprint"),
                ("changes (held → rejected)", _diff),
            ],
        )
        + "<h2>Payload</h2><pre>"
        + h(json.dumps(effect_doc["payload"], indent=2, ensure_ascii=False))
        + "</pre>"
    )
    return page(f"Effect {key}", body, operator)


def _action(kind: str) -> Callable[[Request], Awaitable[Response]]:
    async def act(request: Request) -> Response:
        operator = _operator(request, "view")
        if operator is None:
            return RedirectResponse("/ui/login", status_code=303)
        if not operator.allows("operate"):
            return page(
                "Not allowed",
                f'<p class="error">operator {h(operator.name)} lacks the operate scope</p>',
                operator,
                status=403,
            )
        form = await _form(request)
        if not hmac.compare_digest(form.get("csrf", ""), _csrf(operator)):
            return page(
                "Not allowed",
                '<p class="error">The form was not sent from this dashboard.</p>',
                operator,
                status=403,
            )
        try:
            job_id = reports.parse_id(request.path_params["job_id"], "job_id")
            async with db.connection(request.app.state.pool) as conn:
                if kind == "redrive":
                    refusal = await ledger_jobs.redrive(conn, job_id, force=form.get("force") == "true")
                    outcome = "redriven"
                else:
                    result = await control.cancel(
                        conn, request.app.state.registry, job_id, by=f"operator:{operator.name}"
                    )
                    refusal = result if isinstance(result, ledger_jobs.Refused) else None
                    outcome = "cancelled" if result == "cancelled" else "cancel_requested"
        except InvalidParameter as exc:
            return page("Bad request", f'<p class="error">{h(exc.detail)}</p>', operator, status=400)
        except LedgerError:
            return page(
                "Ledger unavailable",
                '<p class="error">The ledger could not answer.</p>',
                operator,
                status=503,
            )
        status = {"refused": refusal.code} if refusal else {"done": outcome}
        return RedirectResponse(f"/ui/jobs/{job_id}?{urlencode(status)}", status_code=303)

    act.__doc__ = f"The {kind} button."
    return act


def routes() -> list[BaseRoute]:
    """The routes of ``/ui``, relative to the mount."""
    return [
        Route("/", overview, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/duplicates", duplicates, methods=["GET"]),
        Route("/rejects", rejects, methods=["GET"]),
        Route("/jobs", job_list, methods=["GET"]),
        Route("/jobs/bulk", bulk, methods=["POST"]),
        Route("/jobs/{job_id}", job_show, methods=["GET"]),
        Route("/jobs/{job_id}/redrive", _action("redrive"), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", _action("cancel"), methods=["POST"]),
        Route("/effects/{key:path}", effect, methods=["GET"]),
    ]
