"""The overview for the on-call engineer: failed and parked jobs and the oldest due job up front; duplicate
and reject rates per source; duplicates, key conflicts and authentication failures over time; the latest of each.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from effectgate.ledger import db, reports
from effectgate.ledger.jobs import resolutions
from effectgate.ledger.reports import AUTH_FAILURES, DELIVERY_OUTCOMES, DUPLICATES, KEY_CONFLICTS

from ...config.operator import OperatorToken
from ..params import parse_name, parse_window
from .charts import chart
from .rendering import cells, duration, form_fields, refresh_of, render, toolbar
from .report_pages import fetch_document
from .signin import view


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


@view()
async def overview(
    request: Request, conn: db.Conn, operator: OperatorToken, query: dict[str, str]
) -> Response:
    """What needs a human now, then duplicate and reject rates and the latest of each."""
    refresh = refresh_of(query)
    window = {k: v for k, v in query.items() if k in ("source", "since", "until")}
    since, until = parse_window(
        window.get("since"), window.get("until"), now=datetime.now(UTC), default=reports.DEFAULT_WINDOW
    )
    assert since is not None and until is not None
    act = await reports.activity(
        conn, source=parse_name(window.get("source"), "source"), since=since, until=until
    )
    outcomes = await fetch_document(conn, DELIVERY_OUTCOMES, window, sort="-deliveries")
    dups = await fetch_document(conn, DUPLICATES, window, limit="10")
    conflicts = await fetch_document(conn, KEY_CONFLICTS, window, limit="10")
    auth = await fetch_document(conn, AUTH_FAILURES, window, limit="1")
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
        **toolbar("/ui/", query),
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
