"""The buttons that act, for ``operate`` tokens: redrive, cancel and resolve-by-hand on a job's page, and the
bulk form (``/ui/jobs/bulk``: act on every job a filter matches, dry run first). Each carries the form token.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from effectgate.handlers.actions import bulk as bulk_actions
from effectgate.handlers.actions import control
from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LedgerError
from effectgate.ledger.jobs import audit
from effectgate.ledger.vocabulary import JobState

from ...config.operator import OperatorToken
from ..params import PARAMETER_ERRORS, BadParameter, parse_id, parse_job_filter
from .rendering import csrf_of, message, render
from .signin import read_form, signed_in_operator, view


def job_action(kind: str) -> Callable[[Request], Awaitable[Response]]:
    """The handler of a job's ``kind`` button (redrive, cancel or resolve), checked for scope and form token."""

    async def act(request: Request) -> Response:
        operator = signed_in_operator(request, "view")
        if operator is None:
            return RedirectResponse("/ui/login", status_code=303)
        if not operator.allows("operate"):
            return message(
                "Not allowed", f"operator {operator.name} lacks the operate scope", operator, status=403
            )
        form = await read_form(request)
        if not hmac.compare_digest(form.get("csrf", ""), csrf_of(operator)):
            return message("Not allowed", "The form was not sent from this dashboard.", operator, status=403)
        try:
            job_id = parse_id(request.path_params["job_id"], "job_id")
            async with db.connection(request.app.state.pool) as conn:
                if kind == "redrive":
                    refusal = await jobs.redrive(
                        conn,
                        job_id,
                        by=f"operator:{operator.name}",
                        reason=audit.check_note(form.get("reason")),
                        force=form.get("force") == "true",
                    )
                    outcome = "redriven"
                    if refusal is None and await audit.replayed_failures(conn, job_id):
                        outcome = "redriven_replaying"
                elif kind == "resolve":
                    resolved = await control.resolve(
                        conn,
                        request.app.state.registry,
                        job_id,
                        by=f"operator:{operator.name}",
                        reason=form.get("reason", ""),
                    )
                    refusal = resolved if isinstance(resolved, jobs.Refused) else None
                    outcome = "resolved"
                else:
                    result = await control.cancel(
                        conn, request.app.state.registry, job_id, by=f"operator:{operator.name}"
                    )
                    refusal = result if isinstance(result, jobs.Refused) else None
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
    operator = signed_in_operator(request, "view")
    if operator is None:
        return RedirectResponse("/ui/login", status_code=303)
    form = await read_form(request)
    if not operator.allows("operate") or not hmac.compare_digest(form.get("csrf", ""), csrf_of(operator)):
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
                reason=form.get("reason", "") if chosen in ("resolve", "redrive") else None,
                force=form.get("force") == "true",
                dry_run=dry_run,
            )
    except PARAMETER_ERRORS as exc:
        return message("Bad request", f"{exc.parameter}: {exc.detail}", operator, status=400)
    except LedgerError:
        return message("Ledger unavailable", "The ledger could not answer.", operator, status=503)
    values = {k: v for k, v in form.items() if k in (*_BULK_FIELDS, "action", "reason", "force")}
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
