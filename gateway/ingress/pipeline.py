"""``POST /webhooks/{source}``: verify, then claim every effect, then answer — never the other way round.

A raw ASGI route (``deliver``; ``gateway.app.Gateway`` sends deliveries to it past Starlette's stack) and a
pipeline of five steps (``_receive``): read, verify, plan, claim, answer. The request each step reads is
``gateway.ingress.inbound.Inbound``; a step that ends the request raises ``Refused`` with its answer.

Order of checks: unknown source (404), body size (413, enforced while reading), signature (401), then
what a verified delivery holds: a payload past what the ledger stores, the tenant when the source takes it
from the event (``tenant_missing`` / ``tenant_invalid`` / ``tenant_not_allowed``), effect keys
(``effect_key_failed``), and what Postgres refuses in the claim (``delivery_refused``). Such a delivery is
refused but kept, with its body and reason, and answered by the source's ``on_refusal`` (``refusals``).
Otherwise one transaction claims every effect. The answer is sent only after that transaction committed;
a failure before it answers 5xx and leaves nothing behind, so the provider's own retry is safe.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers, State
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from effectgate.handlers import tracing
from effectgate.handlers.plan import PlanFailed, TenantUnusable
from effectgate.ledger import claim_batcher
from effectgate.ledger.claims import Accepted, ClaimOutcome, Delivery, EffectRequest, Rejected
from effectgate.ledger.errors import ClaimOverloaded, DeliveryRefused, LedgerError
from effectgate.ledger.storable import Unstorable, storable_payload

from .. import metrics
from ..bodies import BodyTooLarge, receive_body
from ..config import Source
from ..edge.penalty_box import PenaltyBox
from ..signatures import ConfirmationUnavailable, PayloadError, SignatureError, Verified
from . import deliveries
from .answers import Answer, error_answer, json_answer, retry_later, text_answer
from .claim_failures import claim_failed
from .inbound import Inbound, Refused
from .refusals import Refusal, refuse
from .replay_memory import LedgerReplayMemory
from .signature_failures import SignatureFailures

log = logging.getLogger("effectgate.gateway")


def error(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    """Every error answer has this shape: ``{"error": CODE, "detail": …}``."""
    return JSONResponse({"error": code, "detail": detail, **extra}, status_code=status)


#: The delivery's span: OpenTelemetry names an HTTP server span by its method and route.
DELIVERY_SPAN = "POST /webhooks/{source}"


async def deliver(app: Starlette, name: str, scope: Scope, receive: Receive, send: Send) -> None:
    """The ingress route, raw ASGI (``webhook_source`` picks the requests it serves; the app's
    ``__call__`` sends them here past Starlette's routing and middleware). Every request is counted here,
    once, by source and status, whatever answered it (``effectgate_webhook_requests_total``); an
    exception escaping ``_receive`` is counted with the status it is answered (400 for a client that
    went away, else 500, as Starlette's error middleware answers, and re-raised for uvicorn to log)."""
    started = time.perf_counter()
    state = app.state
    answer = _INTERNAL_ERROR
    try:
        inbound = Inbound(state, scope, receive, name)
        with tracing.server_span(DELIVERY_SPAN, _server_attributes(inbound)) as span:
            answer = await _receive(inbound)
            span.set_attribute("http.response.status_code", answer.status)
            if answer.status >= 500:
                tracing.set_error(span, f"answered {answer.status}")
    except ClientDisconnect:
        answer = _client_disconnected(scope)
    except Exception:
        _count(state, name, answer.status, started)
        await answer.send(send)
        raise
    _count(state, name, answer.status, started)
    await answer.send(send)


def _count(state: State, name: str, status: int, started: float) -> None:
    label = name if name in state.config.sources else metrics.UNKNOWN_SOURCE
    metrics.webhook_request(label, status, time.perf_counter() - started)


_INTERNAL_ERROR = text_answer(500, b"Internal Server Error")


def _client_disconnected(scope: Scope) -> Answer:
    # Not the gateway's error: one line at info, no traceback. Nothing was claimed, and the answer reaches
    # no one.
    request_id = Headers(scope=scope).get("x-request-id")
    log.info("request.client_disconnected", extra={"path": scope["path"], "request_id": request_id})
    return error_answer(
        400, "client_disconnected", "the client closed the connection before the body was read"
    )


def _server_attributes(inbound: Inbound) -> dict[str, tracing.AttributeValue] | None:
    # Built only while tracing is on: with it off the span site costs one global lookup.
    if not tracing.enabled():
        return None
    scope = inbound.scope
    attributes: dict[str, tracing.AttributeValue] = {
        "http.request.method": "POST",
        "http.route": "/webhooks/{source}",
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
        "effectgate.source": inbound.name,
    }
    if inbound.client:
        attributes["client.address"] = inbound.client[0]
    user_agent = inbound.headers.get("user-agent")
    if user_agent:
        attributes["user_agent.original"] = user_agent
    return attributes


async def _receive(inbound: Inbound) -> Answer:
    """Read, verify, plan, claim, answer: each step returns what the next needs, or raises ``Refused``
    with the answer that ends the request there."""
    try:
        source = _source(inbound)
        _admit(inbound)
        _shed(inbound)
        body = await _read(inbound)
        verified = await _verify(inbound, source, body)
        _admit_replay(inbound, body)
        if verified.challenge is not None:
            return json_answer(200, verified.challenge)
        verified = _storable(inbound, verified)
        planned, unmet = _plan_delivery(inbound, source, verified)
        outcomes = await _claim(inbound, source, verified, planned, body)
    except Refused as refused:
        return refused.answer
    except _NotPlanned as not_planned:
        # Verified, but it cannot become effects: kept, logged and answered by the source's policy.
        return await refuse(
            pool=inbound.state.pool,
            source=source,
            request_id=inbound.request_id,
            verified=not_planned.verified,
            body=body,
            refusal=not_planned.refusal,
        )
    return _answer(inbound, source, verified, planned, unmet, outcomes)


# -- read ------------------------------------------------------------------------------------------------


def _source(inbound: Inbound) -> Source:
    source: Source | None = inbound.state.config.sources.get(inbound.name)
    if source is None:
        raise Refused(error_answer(404, "unknown_source", f"no source named {inbound.name!r} is configured"))
    return source


def _admit(inbound: Inbound) -> None:
    box: PenaltyBox = inbound.state.penalty_box
    if inbound.client is None or not box.active:
        return
    # A direct peer in the box is refused by the connection guard before it gets here; this is the client a
    # trusted proxy forwarded for. Refused before its body is read.
    host, port = inbound.client
    left = box.refuses(host, port, inbound.name)
    if left > 0:
        metrics.penalty_box_refusal(inbound.name, "answered")
        raise Refused(_penalised(left, _FAILED))


def _shed(inbound: Inbound) -> None:
    # Past the claim queue's bound the claim would be refused: refused before the body is read, verified and
    # planned, so the 503 costs next to nothing and the loop's time goes to the claims it can take. A forged
    # request gets this 503 too, not its 401: under overload nothing is verified that cannot be claimed.
    batcher: claim_batcher.ClaimBatcher = inbound.state.batcher
    try:
        batcher.check_room()
    except ClaimOverloaded as exc:
        metrics.delivery(inbound.name, "overloaded")
        raise Refused(retry_later("overloaded", str(exc))) from None


async def _read(inbound: Inbound) -> bytes:
    limit = inbound.state.config.gateway.max_body_bytes
    try:
        return await receive_body(inbound.receive, inbound.headers.get("content-length"), limit)
    except BodyTooLarge:
        raise Refused(error_answer(413, "payload_too_large", f"body exceeds {limit} bytes")) from None


# -- verify ----------------------------------------------------------------------------------------------


async def _verify(inbound: Inbound, source: Source, body: bytes) -> Verified:
    name, headers = inbound.name, inbound.headers
    # A scheme whose verification needs I/O (PayPal's certificate) does it here, off the synchronous
    # verify; it never raises for a bad request, so the checks and their answers stay in verify.
    # Its fetches are charged to the client the edge limits count: the sender is not authenticated yet.
    await source.scheme.prepare(body, headers, client=inbound.client[0] if inbound.client else None)
    try:
        with tracing.span(
            "effectgate.verify", {"effectgate.source": name, "effectgate.scheme": source.scheme_name}
        ):
            verified = source.scheme.verify(body, headers)
        # Only after a valid signature: a scheme's checks that need I/O (PayPal's transmission ids, PayPal's
        # own API), so an unauthenticated sender cannot reach the ledger or a provider through them.
        await source.scheme.confirm(
            verified, body, headers, source=name, memory=LedgerReplayMemory(inbound.state.pool)
        )
    except SignatureError as exc:
        raise Refused(_unauthenticated(inbound, exc, body)) from None
    except PayloadError as exc:
        metrics.delivery(name, exc.code)
        raise Refused(error_answer(400, exc.code, exc.detail)) from None
    except ConfirmationUnavailable as exc:
        # Nothing claimed; the provider's retry is safe. The reason is in the log, not in the answer.
        metrics.delivery(name, exc.code)
        raise Refused(error_answer(503, exc.code, exc.detail)) from None
    return verified


def _unauthenticated(inbound: Inbound, exc: SignatureError, body: bytes) -> Answer:
    name, client = inbound.name, inbound.client
    metrics.verification_failure(name, exc.code)
    # Counted in memory and written by a background flusher: no database call, no diagnosis here.
    failures: SignatureFailures = inbound.state.signature_failures
    failures.failed(name, exc, body)
    log.info(
        "delivery.unauthenticated",
        extra={"source": name, "reason": exc.code, "request_id": inbound.request_id},
    )
    box: PenaltyBox = inbound.state.penalty_box
    if client is not None and box.failed(client[0], client[1], name):
        metrics.penalty_box_entered(name, "failures")
        _log_boxed(box, name, client[0], "failures")
    return error_answer(401, exc.code, exc.detail)


def _admit_replay(inbound: Inbound, body: bytes) -> None:
    if inbound.client is None:
        return
    # Counted before the claim: a replay flood is refused without a database round trip each.
    box: PenaltyBox = inbound.state.penalty_box
    host, port = inbound.client
    replay = box.replayed(host, port, inbound.name, body)
    if replay == "served":
        box.authenticated(host, port)
        return
    metrics.penalty_box_refusal(inbound.name, "answered")
    if replay == "boxed":
        metrics.penalty_box_entered(inbound.name, "replays")
        _log_boxed(box, inbound.name, host, "replays")
    raise Refused(_penalised(box.left(host, inbound.name), _REPLAYED))


def _log_boxed(box: PenaltyBox, source: str, client: str, reason: str) -> None:
    log.warning(
        "penalty_box.entered",
        extra={"source": source, "client": client, "seconds": box.settings.cooling, "reason": reason},
    )


# -- plan ------------------------------------------------------------------------------------------------


class _NotPlanned(Exception):
    """A verified delivery that cannot become effects (``refusals``), and the events as they were planned."""

    def __init__(self, verified: Verified, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.verified = verified
        self.refusal = refusal


def _storable(inbound: Inbound, verified: Verified) -> Verified:
    """``verified`` with each event's payload as the ledger stores it, planned and runs it: a NUL or a lone
    surrogate in its text (user-entered text: a gift note, an address line) becomes U+FFFD, and the delivery is
    claimed like any other; past what the ledger stores (``storable.MAX_DEPTH``), it is refused."""
    events = []
    rewritten = False
    for event in verified.events:
        try:
            payload, problem = storable_payload(event.payload)
        except Unstorable as exc:
            refusal = Refusal(
                "malformed_payload", 400, f"event {event.id!r}: {exc}", event.id, log_detail=str(exc)
            )
            raise _NotPlanned(verified, refusal) from None
        if problem is not None:
            log.info(
                "delivery.payload_rewritten",
                extra={
                    "source": inbound.name,
                    "request_id": inbound.request_id,
                    "event_id": event.id,
                    "detail": problem,
                },
            )
            event = replace(event, payload=payload)
            rewritten = True
        events.append(event)
    return replace(verified, events=tuple(events)) if rewritten else verified


def _plan_delivery(
    inbound: Inbound, source: Source, verified: Verified
) -> tuple[list[tuple[Delivery, list[EffectRequest]]], list[dict[str, Any]]]:
    try:
        return deliveries.plan(source, inbound.state.registry, verified, inbound.request_id)
    except TenantUnusable as exc:
        # Nothing is claimed: an effect filed under a guessed tenant could collide with another's. The
        # detail quotes the tenant, which is the sender's text: the answer carries it, the log does not.
        raise _NotPlanned(verified, Refusal(exc.code, 400, str(exc), exc.event_id)) from None
    except PlanFailed as exc:
        refusal = Refusal("effect_key_failed", 422, str(exc), exc.event_id, handler=exc.kind, error=exc.error)
        raise _NotPlanned(verified, refusal) from None


# -- claim -----------------------------------------------------------------------------------------------


async def _claim(
    inbound: Inbound,
    source: Source,
    verified: Verified,
    planned: list[tuple[Delivery, list[EffectRequest]]],
    body: bytes,
) -> list[list[ClaimOutcome]]:
    batcher: claim_batcher.ClaimBatcher = inbound.state.batcher
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
        # Postgres refused what this delivery holds; the deliveries batched with it were claimed without it.
        raise _NotPlanned(
            verified, Refusal("delivery_refused", 400, str(exc), sqlstate=exc.sqlstate)
        ) from None
    except LedgerError as exc:
        answer = await claim_failed(
            exc,
            pool=inbound.state.pool,
            source=source,
            request_id=inbound.request_id,
        )
        raise Refused(answer) from None
    metrics.claim_latency(time.perf_counter() - started)
    return outcomes


# -- answer ----------------------------------------------------------------------------------------------


def _answer(
    inbound: Inbound,
    source: Source,
    verified: Verified,
    planned: list[tuple[Delivery, list[EffectRequest]]],
    unmet: list[dict[str, Any]],
    outcomes: list[list[ClaimOutcome]],
) -> Answer:
    flat = [o for per_event in outcomes for o in per_event]
    metrics.claimed(inbound.name, [o.outcome for o in flat])
    inbound.state.acknowledged.record([d for d, _ in planned], outcomes)
    # Effects whose require the signed payload did not meet are listed too: skipped, never claimed.
    effects_json = [_outcome_json(o) for o in flat] + unmet
    event_ids = [d.event_id for d, _ in planned]
    if log.isEnabledFor(logging.DEBUG):
        # Every delivery is a row in the ledger already; a log line each is for debugging, not the default.
        log.debug(
            "delivery.claimed",
            extra={
                "source": inbound.name,
                "request_id": inbound.request_id,
                "event_ids": event_ids,
                "outcomes": [(o.effect_key, o.outcome) for o in flat],
            },
        )
    body_json: dict[str, Any] = {
        "request_id": inbound.request_id,
        "event_ids": event_ids,
        "effects": effects_json,
    }
    if source.conflict_status == 409 and any(isinstance(o, Rejected) for o in flat):
        return error_answer(
            409,
            "key_conflict",
            "an effect key is already held by a different event payload; the delivery was recorded, not run",
            **body_json,
        )
    status = 202 if any(isinstance(o, Accepted) for o in flat) else 200
    if verified.acknowledgement is not None:
        # Some providers read the body, not the status: Adyen counts a delivery only on "[accepted]".
        return text_answer(status, verified.acknowledgement)
    return json_answer(status, body_json)


def _outcome_json(outcome: ClaimOutcome) -> dict[str, Any]:
    item: dict[str, Any] = {"key": outcome.effect_key, "handler": outcome.handler, "outcome": outcome.outcome}
    if isinstance(outcome, Accepted):
        item["job_id"] = outcome.job_id
    return item


_FAILED = "too many failed authentications from this client for this source; try again later"
_REPLAYED = "one delivery repeated too often by this client for this source; try again later"


def _penalised(seconds_left: float, detail: str) -> Answer:
    # Its next request would be refused too: it reconnects rather than keeps a connection to send it on.
    return (
        error_answer(429, "client_penalised", detail)
        .header("retry-after", str(max(1, round(seconds_left))))
        .header("connection", "close")
    )
