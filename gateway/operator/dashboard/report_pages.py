"""The page of every report (its filter form, rows and summary come from its spec), and the rejects page.

Every page reads ``ledger.reports`` through ``reporting``, the code path of the API and the CLI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from effectgate.ledger import db
from effectgate.ledger.reports import AUTH_FAILURES, JOBS, KEY_CONFLICTS, REFUSED_DELIVERIES
from effectgate.ledger.reports.spec import ReportSpec

from ...config.operator import OperatorToken
from .. import reporting
from .rendering import Cell, cells, form_fields, refresh_of, render, toolbar
from .signin import view


def _raw(spec: ReportSpec, query: Mapping[str, str], **changes: str) -> dict[str, str]:
    # A page's own parameters (refresh=, done=) are not the report's.
    raw = {k: v for k, v in query.items() if k in reporting.parameters(spec)}
    return {**raw, **changes}


async def fetch_document(
    conn: db.Conn, spec: ReportSpec, query: Mapping[str, str], **changes: str
) -> dict[str, Any]:
    """One page of ``spec`` as the API would answer it, from a page's query plus ``changes``."""
    return reporting.document(await reporting.fetch(conn, spec, _raw(spec, query, **changes)))


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
        refresh = refresh_of(query)
        document = await fetch_document(conn, spec, query)
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
            **toolbar(path, query),
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
    """Key conflicts with their diffs, refused deliveries, and authentication failures."""
    refresh = refresh_of(query)
    document = await fetch_document(conn, KEY_CONFLICTS, query)
    refused = await fetch_document(
        conn, REFUSED_DELIVERIES, {k: v for k, v in query.items() if k != "cursor"}
    )
    auth = await fetch_document(conn, AUTH_FAILURES, {k: v for k, v in query.items() if k != "cursor"})
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
            "Refused deliveries",
            cells(REFUSED_DELIVERIES.table_columns, REFUSED_DELIVERIES),
            refused["items"],
            note="Verified, but they could not become effects (a key or tenant function raised, a value "
            "Postgres refuses): kept with their body; `effectgate ledger replay --refused` claims them once "
            "the cause is fixed.",
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
        **toolbar("/ui/rejects", query),
        fields=form_fields(KEY_CONFLICTS),
        document=document,
        sections=sections,
    )
