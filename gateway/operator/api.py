"""The operator HTTP API under ``/api/``: the ledger reports as JSON, and job control.

    GET  /api/<report>                the filters, sort and window its spec declares           view
         (/duplicates, /rejects/conflicts, /rejects/auth, /jobs: every spec in ledger.reports.REPORTS)
    GET  /api/effects/{key}           ?tenant                                                   view
    GET  /api/jobs/{id}                                                                         view
    POST /api/jobs/{id}/redrive       ?force&reason                                             operate
    POST /api/jobs/{id}/cancel        ?reason                                                   operate
    POST /api/jobs/{id}/resolve       ?reason (required)                                        operate
    POST /api/jobs/redrive            ?state&kind&source&since&limit&dry_run&force&reason      operate
    POST /api/jobs/cancel             ?state&kind&source&since&limit&dry_run&reason            operate
    POST /api/jobs/resolve            ?state&kind&source&since&limit&dry_run&reason (required) operate
    GET  /api/kinds/paused                                                                      view
    POST /api/kinds/{kind}/pause      ?reason                                                   operate
    POST /api/kinds/{kind}/resume     ?reason                                                   operate
    GET  /api/openapi.json                                                                      view

Every answer that is not a 2xx has the shape ``{"error": CODE, "detail": …}``: 401 ``missing_token`` or
``invalid_token``, 403 ``insufficient_scope``, 400 ``invalid_<parameter>`` or ``unknown_parameter``
(with ``"parameter"`` naming it), 404 ``not_found``, 409 with the refusal code of a job action, 503
``ledger_unavailable``. The token is checked before any parameter, so a caller without one learns nothing.
The OpenAPI document needs a token too: it names every filter and refusal code, which is a map for an
attacker and of no use to anyone who cannot call the API anyway.

Every answer under ``/api/`` — errors, 404s and 405s included — carries ``Cache-Control: no-store`` (a
report is neither for a shared cache nor for the browser's history) and ``X-Content-Type-Options:
nosniff`` (JSON is never guessed into HTML), added by ``ApiHeaders`` around the whole app.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from effectgate.handlers.actions import bulk as bulk_actions
from effectgate.handlers.actions import control
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.errors import LedgerError, LedgerUnavailable
from effectgate.ledger.jobs import audit, filters, resolutions
from effectgate.ledger.reports import REPORTS, ReportSpec
from effectgate.ledger.vocabulary import JobState, RefusalCode

from ..bodies import MAX_OPERATOR_BODY_BYTES, read_body
from ..config.operator import OperatorToken
from . import documents, openapi, reporting
from .auth import AuthFailure, authenticate
from .params import (
    JOB_FILTER_PARAMETERS,
    PARAMETER_ERRORS,
    BadParameter,
    parse_flag,
    parse_id,
    parse_job_filter,
    parse_name,
)
from .throttle import FailureThrottle, client_key, retry_after

log = logging.getLogger("effectgate.operator")


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer; datetimes become RFC 3339 strings."""
    return Response(
        documents.dumps(document), status_code=status, media_type="application/json", headers=headers
    )


def error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    """An error answer: ``{"error": CODE, "detail": …}`` plus any extra fields."""
    return json_response({"error": code, "detail": detail, **extra}, status, headers)


Query = dict[str, str]
Handler = Callable[[Request, db.Conn, OperatorToken, Query], Awaitable[Response]]


def _query(request: Request, allowed: tuple[str, ...]) -> Query:
    query: Query = {}
    for name, value in request.query_params.multi_items():
        if name not in allowed:
            raise BadParameter(
                name[:100],
                f"unknown parameter; this endpoint takes {', '.join(allowed) or 'none'}",
                code="unknown_parameter",
            )
        if name in query:
            raise BadParameter(name, "given more than once")
        query[name] = value
    return query


def _authenticate(request: Request, scope: str) -> OperatorToken | Response:
    """The operator a request's bearer token names, or the answer to send.

    A wrong token counts against the client (``throttle``); past the limit it is answered 429 with
    ``Retry-After``. The token is checked first, so a right one is never refused by the throttle.
    """
    who = authenticate(request.headers.get("authorization"), request.app.state.config.operators, scope)
    if not isinstance(who, AuthFailure):
        return who
    if who.code == "invalid_token":
        throttle: FailureThrottle = request.app.state.auth_throttle
        client = client_key(request)
        wait = throttle.failed(client)
        if wait > 0:
            return error(
                429,
                "too_many_failures",
                "too many wrong operator tokens from this address; try again after Retry-After seconds",
                {"Retry-After": retry_after(wait)},
            )
        log.info("operator.token_refused", extra={"client": client, "path": request.url.path})
    return error(who.status, who.code, who.detail, {"WWW-Authenticate": who.www_authenticate})


def endpoint(
    scope: str, allowed: tuple[str, ...] = ()
) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """Wrap a handler: authenticate for ``scope``, validate the query names, open a connection, and turn
    the ledger's errors into answers."""

    def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            # No endpoint reads a body, but none may make the process hold a big one either: read it within
            # the limit (BodyTooLarge is the app's 413), before the token is even looked at.
            await read_body(request, MAX_OPERATOR_BODY_BYTES)
            who = _authenticate(request, scope)
            if isinstance(who, Response):
                return who
            try:
                query = _query(request, allowed)
                async with db.connection(request.app.state.pool) as conn:
                    return await handler(request, conn, who, query)
            except PARAMETER_ERRORS as exc:
                return error(400, exc.code, exc.detail, parameter=exc.parameter)
            except LedgerUnavailable as exc:
                return error(503, "ledger_unavailable", str(exc))
            except LedgerError as exc:
                log.error("operator.ledger_error", extra={"path": request.url.path, "error": str(exc)})
                return error(500, "ledger_error", "the ledger could not answer; see the gateway log")

        run.__doc__ = handler.__doc__
        return run

    return wrap


def report(spec: ReportSpec) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one report: its parameters and document come from its spec."""

    async def handler(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
        return json_response(await reporting.report_document(conn, spec, query))

    handler.__doc__ = spec.title
    return endpoint("view", reporting.parameters(spec))(handler)


@endpoint("view", ("tenant",))
async def effect(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """One effect's lineage."""
    key = request.path_params["key"]
    view = await reports.effect_view(
        conn,
        parse_name(key, "key", max_length=reports.MAX_KEY_LENGTH) or "",
        tenant=parse_name(query.get("tenant"), "tenant"),
    )
    if view is None:
        return error(404, "not_found", f"no effect with key {key!r}")
    return json_response(documents.effect(view))


@endpoint("view")
async def job_show(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """One job with its attempts and steps."""
    view = await reports.job_view(conn, parse_id(request.path_params["job_id"], "job_id"))
    if view is None:
        return error(404, "not_found", f"no job {request.path_params['job_id']}")
    return json_response(documents.job(view))


def _refused(refusal: jobs.Refused) -> Response:
    return error(404 if refusal.code == RefusalCode.NOT_FOUND else 409, refusal.code, refusal.detail)


@endpoint("operate", ("force", "reason"))
async def redrive(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Put a failed or parked job back to pending (``force=true`` for an unrecoverable one, or one whose step
    recorded a terminal error the next run replays without calling the provider: ``replays`` names those)."""
    job_id = parse_id(request.path_params["job_id"], "job_id")
    force = parse_flag(query.get("force"), "force")
    reason = audit.check_note(query.get("reason"))
    refusal = await jobs.redrive(conn, job_id, by=f"operator:{who.name}", reason=reason, force=force)
    log.info(
        "operator.redrive",
        extra={
            "operator": who.name,
            "job_id": job_id,
            "force": force,
            "refused": refusal.code if refusal else None,
        },
    )
    if refusal is not None:
        return _refused(refusal)
    replays = await audit.replayed_failures(conn, job_id)
    return json_response(
        {
            "job_id": job_id,
            "state": JobState.PENDING,
            **(
                {"replays": [{"step": f.step, "code": f.code, "message": f.message} for f in replays]}
                if replays
                else {}
            ),
        }
    )


@endpoint("operate", ("reason",))
async def cancel(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Cancel a job: at once if pending, at its next heartbeat if running."""
    job_id = parse_id(request.path_params["job_id"], "job_id")
    reason = audit.check_note(query.get("reason")) or f"cancelled by operator {who.name}"
    registry = request.app.state.registry
    outcome = await control.cancel(conn, registry, job_id, by=f"operator:{who.name}", reason=reason)
    refused = outcome if isinstance(outcome, jobs.Refused) else None
    log.info(
        "operator.cancel",
        extra={"operator": who.name, "job_id": job_id, "refused": refused.code if refused else None},
    )
    if refused is not None:
        return _refused(refused)
    return json_response({"job_id": job_id, "state": outcome, "cancel_requested": True})


@endpoint("operate", ("reason",))
async def resolve(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Close a failed or parked job without running it: resolved by hand, with who, why and when."""
    job_id = parse_id(request.path_params["job_id"], "job_id")
    outcome = await control.resolve(
        conn, request.app.state.registry, job_id, by=f"operator:{who.name}", reason=query.get("reason", "")
    )
    refused = outcome if isinstance(outcome, jobs.Refused) else None
    log.info(
        "operator.resolve",
        extra={"operator": who.name, "job_id": job_id, "refused": refused.code if refused else None},
    )
    if refused is not None:
        return _refused(refused)
    assert isinstance(outcome, resolutions.Resolved)
    return json_response(documents.resolution(outcome))


_BULK = (*JOB_FILTER_PARAMETERS, "dry_run")


async def _bulk(
    request: Request, who: OperatorToken, conn: db.Conn, query: Query, action: bulk_actions.Action
) -> Response:
    where = parse_job_filter(query, now=datetime.now(UTC))
    reason: str | None
    if action == "resolve":
        # Required, never defaulted: a resolution says why a human closed the job.
        reason = resolutions.check_reason(query.get("reason"))
    elif action == "redrive":
        reason = audit.check_note(query.get("reason"))
    else:
        reason = audit.check_note(query.get("reason")) or f"cancelled by operator {who.name}"
    result = await bulk_actions.run(
        conn,
        request.app.state.registry,
        action,
        where,
        by=f"operator:{who.name}",
        reason=reason,
        force=parse_flag(query.get("force"), "force"),
        dry_run=parse_flag(query.get("dry_run"), "dry_run"),
    )
    log.info("operator.bulk", extra={"operator": who.name, "action": action, **result.summary()})
    return json_response(
        {
            **result.summary(),
            "job_ids": result.done,
            "refused_job_ids": result.refused,
            "replaying_job_ids": result.replaying,
        }
    )


@endpoint("operate", (*_BULK, "force", "reason"))
async def bulk_redrive(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Redrive every job a filter matches; refusals counted by code (``dry_run=true`` changes nothing)."""
    return await _bulk(request, who, conn, query, "redrive")


@endpoint("operate", (*_BULK, "reason"))
async def bulk_cancel(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Cancel every job a filter matches; refusals counted by code (``dry_run=true`` changes nothing)."""
    return await _bulk(request, who, conn, query, "cancel")


@endpoint("operate", (*_BULK, "reason"))
async def bulk_resolve(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Resolve by hand every failed or parked job a filter matches (``reason`` required); refusals counted by
    code (``dry_run=true`` changes nothing)."""
    return await _bulk(request, who, conn, query, "resolve")


@endpoint("view")
async def kinds_paused(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """The paused kinds, with who paused them, why, and how many of their jobs wait."""
    return json_response({"paused": await filters.paused(conn)})


@endpoint("operate", ("reason",))
async def kind_pause(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Stop leasing one kind's jobs (they wait pending) until it is resumed."""
    kind = parse_name(request.path_params["kind"], "kind")
    assert kind is not None
    reason = audit.check_note(query.get("reason"))
    row = await filters.pause(conn, kind, by=f"operator:{who.name}", reason=reason)
    log.info("operator.pause", extra={"operator": who.name, "kind": kind})
    return json_response(row)


@endpoint("operate", ("reason",))
async def kind_resume(request: Request, conn: db.Conn, who: OperatorToken, query: Query) -> Response:
    """Lease a paused kind's jobs again."""
    kind = parse_name(request.path_params["kind"], "kind")
    assert kind is not None
    reason = audit.check_note(query.get("reason"))
    if not await filters.resume(conn, kind, by=f"operator:{who.name}", reason=reason):
        return error(409, "not_paused", f"kind {kind} is not paused")
    log.info("operator.resume", extra={"operator": who.name, "kind": kind})
    return json_response({"kind": kind, "paused": False})


async def openapi_document(request: Request) -> Response:
    """The OpenAPI 3.1 description of this API (``view`` scope, like the reports it describes)."""
    who = _authenticate(request, "view")
    if isinstance(who, Response):
        return who
    return json_response(openapi.DOCUMENT)


_API_HEADERS = (("cache-control", "no-store"), ("x-content-type-options", "nosniff"))


class ApiHeaders:
    """ASGI middleware: the ``/api/`` answers' headers on every answer under ``/api``, whoever made it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/api" or path.startswith("/api/")):
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in _API_HEADERS:
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, sending)


def routes() -> list[BaseRoute]:
    """The routes of ``/api``, relative to the mount."""
    return [
        Route("/openapi.json", openapi_document, methods=["GET"]),
        *(Route(reporting.api_path(spec), report(spec), methods=["GET"]) for spec in REPORTS),
        Route("/effects/{key:path}", effect, methods=["GET"]),
        Route("/jobs/redrive", bulk_redrive, methods=["POST"]),
        Route("/jobs/cancel", bulk_cancel, methods=["POST"]),
        Route("/jobs/resolve", bulk_resolve, methods=["POST"]),
        Route("/kinds/paused", kinds_paused, methods=["GET"]),
        Route("/kinds/{kind}/pause", kind_pause, methods=["POST"]),
        Route("/kinds/{kind}/resume", kind_resume, methods=["POST"]),
        Route("/jobs/{job_id}", job_show, methods=["GET"]),
        Route("/jobs/{job_id}/redrive", redrive, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/jobs/{job_id}/resolve", resolve, methods=["POST"]),
    ]
