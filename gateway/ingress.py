"""``POST /webhooks/{source}``: verify, then claim every effect, then answer — never the other way round.

Order of checks: unknown source (404), body size (413, enforced while reading), signature (401),
payload (400), the tenant when the source takes it from the event (400 ``tenant_missing`` /
``tenant_invalid`` / ``tenant_not_allowed``), effect keys (422), then one transaction claiming every effect. The answer is sent
only after that transaction committed; a failure before it answers 5xx and leaves nothing behind,
so the provider's own retry is safe.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import time
import uuid
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from effectgate.handlers import tracing
from effectgate.handlers.event import Event as HandlerEvent
from effectgate.handlers.plan import MAX_TENANT_LENGTH as MAX_TENANT_LENGTH  # re-exported
from effectgate.handlers.plan import PlanFailed, TenantUnusable, plan_event
from effectgate.handlers.registry import Registry
from effectgate.ledger import claim_batcher, claims, db
from effectgate.ledger.claims import Accepted, ClaimOutcome, Delivery, EffectRequest, Rejected
from effectgate.ledger.errors import (
    ClaimOverloaded,
    ClaimTimeout,
    DeliveryRefused,
    LedgerError,
    LedgerUnavailable,
)
from effectgate.ledger.fingerprints import canonical_json
from effectgate.ledger.migrate import unapplied
from effectgate.ledger.storable import jsonb_problem

from . import metrics
from .bodies import BodyTooLarge, read_body
from .config import Config, Source
from .penalty_box import PenaltyBox
from .replay_memory import LedgerReplayMemory
from .signature_failures import SignatureFailures
from .signatures import ConfirmationUnavailable, Event, PayloadError, SignatureError, Verified

log = logging.getLogger("effectgate.gateway")

# The answer's outcome for an effect that matched the event type but whose ``require`` was not met.
UNMET_REQUIREMENT = "unmet_requirement"


# Request ids unique across processes without a uuid4 (an os.urandom call) per request: a random prefix per
# process (a forked child draws its own), then a counter.
_request_id_prefix = uuid.uuid4().hex[:16]
_request_numbers = itertools.count()


def _new_request_id() -> str:
    return f"{_request_id_prefix}{next(_request_numbers):016x}"


def _new_request_id_prefix() -> None:
    global _request_id_prefix
    _request_id_prefix = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_new_request_id_prefix)


def error(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    """Every error answer has this shape: ``{"error": CODE, "detail": …}``."""
    return JSONResponse({"error": code, "detail": detail, **extra}, status_code=status)


def _outcome_json(outcome: ClaimOutcome) -> dict[str, Any]:
    item: dict[str, Any] = {"key": outcome.effect_key, "handler": outcome.handler, "outcome": outcome.outcome}
    if isinstance(outcome, Accepted):
        item["job_id"] = outcome.job_id
    return item


async def receive(request: Request) -> Response:
    """The ingress route. Every request is counted here, once, by source and status, whatever answered it
    (``effectgate_webhook_requests_total``); an exception escaping ``_receive`` is counted with the status
    its handler will answer (400 for a client that went away, else 500)."""
    started = time.perf_counter()
    name = request.path_params["source"]
    status = 500
    try:
        with tracing.server_span(DELIVERY_SPAN, _server_attributes(request)) as span:
            response = await _receive(request)
            status = response.status_code
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                tracing.set_error(span, f"answered {status}")
            return response
    except ClientDisconnect:
        status = 400
        raise
    finally:
        label = name if name in request.app.state.config.sources else metrics.UNKNOWN_SOURCE
        metrics.webhook_request(label, status, time.perf_counter() - started)


#: The delivery's span: OpenTelemetry names an HTTP server span by its method and route.
DELIVERY_SPAN = "POST /webhooks/{source}"


def _server_attributes(request: Request) -> dict[str, tracing.AttributeValue] | None:
    # Built only while tracing is on: with it off the span site costs one global lookup.
    if not tracing.enabled():
        return None
    scope = request.scope
    attributes: dict[str, tracing.AttributeValue] = {
        "http.request.method": "POST",
        "http.route": "/webhooks/{source}",
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
        "effectgate.source": request.path_params["source"],
    }
    if scope.get("client"):
        attributes["client.address"] = scope["client"][0]
    user_agent = request.headers.get("user-agent")
    if user_agent:
        attributes["user_agent.original"] = user_agent
    return attributes


async def _receive(request: Request) -> Response:
    config: Config = request.app.state.config
    registry: Registry = request.app.state.registry
    pool: db.Pool = request.app.state.pool
    batcher: claim_batcher.ClaimBatcher = request.app.state.batcher
    name = request.path_params["source"]
    request_id = request.headers.get("x-request-id") or _new_request_id()
    source = config.sources.get(name)
    if source is None:
        return error(404, "unknown_source", f"no source named {name!r} is configured")
    box: PenaltyBox = request.app.state.penalty_box
    client = request.client
    if client is not None and box.active:
        # A direct peer in the box is refused by the connection guard before it gets here; this is the
        # client a trusted proxy forwarded for. Refused before its body is read.
        left = box.refuses(client.host, client.port, name)
        if left > 0:
            metrics.penalty_box_refusal(name, "answered")
            return _penalised(left, _FAILED)
    try:
        body = await read_body(request, config.gateway.max_body_bytes)
    except BodyTooLarge:
        return error(413, "payload_too_large", f"body exceeds {config.gateway.max_body_bytes} bytes")

    # A scheme whose verification needs I/O (PayPal's certificate) does it here, off the synchronous
    # verify; it never raises for a bad request, so the checks and their answers stay in verify.
    await source.scheme.prepare(body, request.headers)
    try:
        with tracing.span(
            "effectgate.verify", {"effectgate.source": name, "effectgate.scheme": source.scheme_name}
        ):
            verified = source.scheme.verify(body, request.headers)
        # Only after a valid signature: a scheme's checks that need I/O (PayPal's transmission ids, PayPal's
        # own API), so an unauthenticated sender cannot reach the ledger or a provider through them.
        await source.scheme.confirm(
            verified, body, request.headers, source=name, memory=LedgerReplayMemory(pool)
        )
    except SignatureError as exc:
        metrics.verification_failure(name, exc.code)
        # Counted in memory and written by a background flusher: no database call, no diagnosis here.
        failures: SignatureFailures = request.app.state.signature_failures
        failures.failed(name, exc, body)
        log.info(
            "delivery.unauthenticated", extra={"source": name, "reason": exc.code, "request_id": request_id}
        )
        if client is not None and box.failed(client.host, client.port, name):
            metrics.penalty_box_entered(name, "failures")
            log.warning(
                "penalty_box.entered",
                extra={
                    "source": name,
                    "client": client.host,
                    "seconds": box.settings.cooling,
                    "reason": "failures",
                },
            )
        return error(401, exc.code, exc.detail)
    except PayloadError as exc:
        metrics.delivery(name, exc.code)
        return error(400, exc.code, exc.detail)
    except ConfirmationUnavailable as exc:
        # Nothing claimed; the provider's retry is safe. The reason is in the log, not in the answer.
        metrics.delivery(name, exc.code)
        return error(503, exc.code, exc.detail)

    if client is not None:
        # Counted before the claim: a replay flood is refused without a database round trip each.
        replay = box.replayed(client.host, client.port, name, body)
        if replay != "served":
            metrics.penalty_box_refusal(name, "answered")
            if replay == "boxed":
                metrics.penalty_box_entered(name, "replays")
                log.warning(
                    "penalty_box.entered",
                    extra={
                        "source": name,
                        "client": client.host,
                        "seconds": box.settings.cooling,
                        "reason": "replays",
                    },
                )
            return _penalised(box.left(client.host, name), _REPLAYED)
        box.authenticated(client.host, client.port)
    if verified.challenge is not None:
        return JSONResponse(verified.challenge)
    for event in verified.events:
        # Authentic but unstorable (a NUL or a lone surrogate in a string): refused now with a 400, not
        # a 5xx on every one of the provider's retries.
        problem = jsonb_problem(event.payload)
        if problem is not None:
            metrics.delivery(name, "malformed_payload")
            return error(400, "malformed_payload", f"event {event.id!r}: {problem}")

    try:
        planned, unmet = _plan(source, registry, verified, request_id)
    except TenantUnusable as exc:
        # Nothing is claimed: an effect filed under a guessed tenant could collide with another's.
        metrics.delivery(name, exc.code)
        return error(400, exc.code, str(exc))
    except KeyFunctionFailed as exc:
        metrics.delivery(name, "effect_key_failed")
        return error(422, "effect_key_failed", str(exc))

    started = time.perf_counter()
    try:
        # The span includes the wait for the batch the claim joined: a busy ledger shows in the trace.
        with tracing.span("effectgate.claim") as span:
            outcomes = await batcher.claim(planned)
            if tracing.enabled():
                claimed = [o for per_event in outcomes for o in per_event]
                span.set_attribute("effectgate.effect_keys", [o.effect_key for o in claimed])
                span.set_attribute("effectgate.outcomes", [str(o.outcome) for o in claimed])
    except DeliveryRefused as exc:
        # Postgres refused what this delivery holds; the deliveries batched with it were claimed without it. A 4xx,
        # not a 503 the provider would retry for days, and a row in the rejects report for the operator.
        metrics.delivery(name, "delivery_refused")
        log.warning(
            "delivery.refused",
            extra={"source": name, "request_id": request_id, "sqlstate": exc.sqlstate, "size": len(body)},
        )
        await _record_refusal(pool, source, exc, planned, body)
        return error(400, "delivery_refused", str(exc))
    except ClaimOverloaded as exc:
        # Refused before queueing: this answer holds nothing, and costs no database work.
        metrics.delivery(name, "overloaded")
        return _retry_later("overloaded", str(exc))
    except ClaimTimeout as exc:
        metrics.delivery(name, "claim_timeout")
        log.warning(
            "delivery.claim_timeout",
            extra={
                "source": name,
                "request_id": request_id,
                "reason": exc.reason,
                "sqlstate": _sqlstate(exc),
            },
        )
        return _retry_later("claim_timeout", str(exc))
    except LedgerUnavailable as exc:
        metrics.delivery(name, "ledger_unavailable")
        # The driver's words (which can name hosts, indexes, error classes) go to the log, never to the sender.
        log.warning(
            "delivery.ledger_unavailable",
            extra={
                "source": name,
                "request_id": request_id,
                "sqlstate": _sqlstate(exc),
                "error": _cause(exc),
            },
        )
        return error(503, "ledger_unavailable", "the ledger database is unavailable; nothing was claimed")
    except LedgerError as exc:
        # Rolled back: nothing was acknowledged, so the provider's retry is safe.
        pending = await _pending_migrations(pool, exc)
        if pending:
            # A schema behind this version (`serve --no-migrate` past a deploy that did not migrate): a
            # 503 the provider retries until someone migrates, and a code saying what to do, not a 500.
            metrics.delivery(name, "migrations_pending")
            log.error(
                "delivery.migrations_pending",
                extra={"source": name, "request_id": request_id, "pending": pending},
            )
            return error(
                503,
                "migrations_pending",
                "the ledger's schema is behind this gateway (migrations pending); nothing was claimed",
            )
        log.error(
            "delivery.ledger_error",
            extra={
                "source": name,
                "request_id": request_id,
                "sqlstate": _sqlstate(exc),
                "error": _cause(exc),
            },
        )
        metrics.delivery(name, "ledger_error")
        return error(500, "ledger_error", "the delivery could not be recorded; nothing was claimed")
    metrics.claim_latency(time.perf_counter() - started)

    flat = [o for per_event in outcomes for o in per_event]
    metrics.claimed(name, [o.outcome for o in flat])
    # Effects whose require the signed payload did not meet are listed too: skipped, never claimed.
    effects_json = [_outcome_json(o) for o in flat] + unmet
    event_ids = [d.event_id for d, _ in planned]
    if log.isEnabledFor(logging.DEBUG):
        # Every delivery is a row in the ledger already; a log line each is for debugging, not the default.
        log.debug(
            "delivery.claimed",
            extra={
                "source": name,
                "request_id": request_id,
                "event_ids": event_ids,
                "outcomes": [(o.effect_key, o.outcome) for o in flat],
            },
        )
    body_json: dict[str, Any] = {"request_id": request_id, "event_ids": event_ids, "effects": effects_json}
    if any(isinstance(o, Rejected) for o in flat) and source.conflict_status == 409:
        return error(
            409,
            "key_conflict",
            "an effect key is already held by a different event payload; the delivery was recorded, not run",
            **body_json,
        )
    status = 202 if any(isinstance(o, Accepted) for o in flat) else 200
    if verified.acknowledgement is not None:
        # Some providers read the body, not the status: Adyen counts a delivery only on "[accepted]".
        return Response(verified.acknowledgement, status_code=status, media_type="text/plain")
    return JSONResponse(body_json, status_code=status)


class KeyFunctionFailed(Exception):
    """A handler's key function could not compute an effect key for this event."""


def event_tenant(source: Source, event: Event) -> str:
    """The tenant ``event`` belongs to: the source's static one, or an allowed string at ``tenant_from``."""
    return source.tenant_rule.tenant_of(event.id, event.payload)


def _plan(
    source: Source, registry: Registry, verified: Verified, request_id: str
) -> tuple[list[tuple[Delivery, list[EffectRequest]]], list[dict[str, Any]]]:
    # The decisions (tenant, require, key, fingerprint, lock key) are handlers.plan's, shared with the
    # replay; what is left here is the delivery record. Every event's tenant first: a batch with one
    # unusable tenant is refused before any key is computed.
    rule = source.tenant_rule
    tenants = [rule.tenant_of(event.id, event.payload) for event in verified.events]
    # The delivery span's (tracing on), stored on the jobs this delivery creates: their spans link to it.
    trace_parent = tracing.current_traceparent()
    planned = []
    unmet: list[dict[str, Any]] = []
    for event, tenant in zip(verified.events, tenants, strict=True):
        handler_event = HandlerEvent(
            source.name, event.id, event.type, event.payload, tenant, event.delivery_id, event.type_signed
        )
        try:
            plan = plan_event(registry, handler_event)
        except PlanFailed as exc:
            raise KeyFunctionFailed(str(exc)) from exc
        if plan.unmet:
            # A signed body under a type it does not fit (a topic swap), or simply a case the effect skips.
            log.info(
                "delivery.requirement_unmet",
                extra={"source": source.name, "request_id": request_id, "handlers": plan.unmet},
            )
            unmet.extend({"handler": kind, "outcome": UNMET_REQUIREMENT} for kind in plan.unmet)
        # Serialised once: the canonical text is both what the fingerprint hashes and what is stored.
        canonical = canonical_json(event.payload)
        delivery = Delivery(
            request_id=request_id,
            tenant=tenant,
            source=source.name,
            event_id=event.id,
            event_type=event.type,
            payload=event.payload,
            fingerprint=hashlib.sha256(canonical).hexdigest(),
            secret_index=verified.secret_index,
            payload_text=canonical.decode(),
            trace_parent=trace_parent,
        )
        planned.append((delivery, plan.effects))
    return planned, unmet


# Seconds a sender is asked to wait after a 503 overloaded or claim_timeout: long enough for a queue to drain.
RETRY_AFTER = "1"


_FAILED = "too many failed authentications from this client for this source; try again later"
_REPLAYED = "one delivery repeated too often by this client for this source; try again later"


def _penalised(seconds_left: float, detail: str) -> JSONResponse:
    response = error(429, "client_penalised", detail)
    response.headers["Retry-After"] = str(max(1, round(seconds_left)))
    # Its next request would be refused too: it reconnects rather than keeps a connection to send it on.
    response.headers["Connection"] = "close"
    return response


def _retry_later(code: str, detail: str) -> JSONResponse:
    response = error(503, code, detail)
    response.headers["Retry-After"] = RETRY_AFTER
    return response


# What a statement meets on a schema older than the code: a table, column, function, type or schema missing.
_SCHEMA_MISSING_STATES = frozenset({"42P01", "42703", "42883", "42704", "3F000"})


async def _pending_migrations(pool: db.Pool, exc: LedgerError) -> list[str]:
    """The migrations the ledger lacks when ``exc`` is a statement meeting a missing schema object, else
    none. Asked of the database only on that error, so a dropped table in a migrated ledger stays a 500."""
    if _sqlstate(exc) not in _SCHEMA_MISSING_STATES:
        return []
    try:
        async with db.connection(pool) as conn:
            return await unapplied(conn)
    except LedgerError:
        return []


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


async def _record_refusal(
    pool: db.Pool,
    source: Source,
    exc: DeliveryRefused,
    planned: list[tuple[Delivery, list[EffectRequest]]],
    body: bytes,
) -> None:
    # Best effort, like a signature failure's count: the 400 does not depend on it.
    try:
        async with db.connection(pool) as conn:
            await claims.record_refused_delivery(
                conn,
                source=source.name,
                sqlstate=exc.sqlstate,
                event_ids=[d.event_id for d, _ in planned],
                size=len(body),
                body_sha256=hashlib.sha256(body).hexdigest(),
            )
    except Exception as record_exc:
        log.warning("delivery_refusal.not_recorded", extra={"source": source.name, "error": str(record_exc)})
