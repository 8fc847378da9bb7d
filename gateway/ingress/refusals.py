"""A verified delivery that cannot become effects: kept, logged, counted, then answered by the source's policy.

Why it happens: an effect's key, lock-key or ``require`` function raised (``effect_key_failed``); the tenant
the source takes from the event is missing, malformed or not allowed (``tenant_*``); the payload is past what
the ledger stores (``malformed_payload``: nested deeper than ``storable.MAX_DEPTH``); or Postgres refused what
the delivery holds (``delivery_refused``). The provider's signature was good, so the event is real and the
provider will not send a different one: it is kept (``ledger.refusals``) with its raw body and reason, so an
operator sees it (``effectgate ledger refused``, ``ledger delivery-outcomes``, the dashboard's Rejects page,
the ``EffectgateDeliveriesRefused`` alert) and claims it with ``effectgate ledger replay --refused`` once the
cause is fixed.

The answer (``[sources.NAME] on_refusal``): ``acknowledge``, the default for a provider that retries a
non-2xx for days and may disable the endpoint, answers 200 with the refusal in the body — only once the
delivery is kept; a delivery that could not be kept is answered 503, so the provider's retry brings it back.
``reject`` answers the refusal's own 4xx whether kept or not (the provider retries, and each retry is kept
again; a replay claims the effect once).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from effectgate.handlers.plan import TenantUnusable
from effectgate.ledger import db
from effectgate.ledger.fingerprints import canonical_json
from effectgate.ledger.refusals import RefusedEvent, body_fingerprint, keep_refused
from effectgate.ledger.storable import Unstorable, storable_payload, storable_text

from .. import metrics
from ..config import Source
from ..signatures import Verified
from .answers import Answer, error_answer, json_answer, retry_later, text_answer

log = logging.getLogger("effectgate.gateway")

# Longest exception message kept on the row and in the log: a handler's exception can quote the payload.
_MAX_ERROR = 2000


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a verified delivery cannot become effects: the answer's code, the status ``reject`` answers, the
    sender-facing detail, the event that failed, and, for a function that raised, its handler and exception."""

    reason: str
    status: int
    detail: str
    event_id: str | None = None
    handler: str | None = None
    error: BaseException | None = None
    # Extra fields for the log line alone (never the body, never the tenant text).
    log_detail: str | None = None
    sqlstate: str | None = None


async def refuse(
    *,
    pool: db.Pool,
    source: Source,
    request_id: str,
    verified: Verified,
    body: bytes,
    refusal: Refusal,
) -> Answer:
    """Count, log and keep a refused delivery, and the answer ``source.on_refusal`` gives it."""
    name = source.name
    metrics.delivery(name, refusal.reason)
    event_type = next((event.type for event in verified.events if event.id == refusal.event_id), None)
    error = _error_text(refusal.error)
    extra: dict[str, object] = {
        "source": name,
        "request_id": request_id,
        "reason": refusal.reason,
        "event_id": refusal.event_id,
        "event_type": event_type,
        "event_ids": [event.id for event in verified.events],
        "size": len(body),
    }
    for key, value in (
        ("handler", refusal.handler),
        ("error", error),
        ("detail", refusal.log_detail),
        ("sqlstate", refusal.sqlstate),
    ):
        if value is not None:
            extra[key] = value
    kept = await _keep(pool, source, request_id, verified, body, refusal, error)
    extra["kept"] = kept
    # Genuine events, refused the same way each time until a handler or the configuration changes: the counter
    # says how many, this line says which. Never the body: it is in the ledger, and the event id finds it.
    log.warning("delivery.refused", extra=extra)
    return _answer(source, verified, refusal, request_id, kept)


def _error_text(error: BaseException | None) -> str | None:
    if error is None:
        return None
    return storable_text(f"{type(error).__name__}: {error}")[:_MAX_ERROR]


async def _keep(
    pool: db.Pool,
    source: Source,
    request_id: str,
    verified: Verified,
    body: bytes,
    refusal: Refusal,
    error: str | None,
) -> bool:
    events = [_refused_event(source, event.id, event.type, event.payload, body) for event in verified.events]
    record = {
        "reason": refusal.reason,
        "detail": refusal.detail,
        "event_id": refusal.event_id,
        "handler": refusal.handler,
        "error_type": type(refusal.error).__name__ if refusal.error is not None else None,
        "error": error,
        "sqlstate": refusal.sqlstate,
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }
    try:
        async with db.connection(pool) as conn:
            await keep_refused(
                conn,
                request_id=request_id,
                source=source.name,
                secret_index=verified.secret_index,
                events=events,
                refusal={k: v for k, v in record.items() if v is not None},
                body=body,
            )
    except Exception as exc:
        # Whatever failed (the ledger unreachable, a value still refused), the answer must not acknowledge what
        # was not kept: it asks the provider to send it again (acknowledge), or is the 4xx it retries (reject).
        log.error(
            "delivery_refusal.not_kept",
            extra={"source": source.name, "request_id": request_id, "error": f"{type(exc).__name__}: {exc}"},
        )
        return False
    return True


def _refused_event(
    source: Source, event_id: str, event_type: str, payload: object, body: bytes
) -> RefusedEvent:
    try:
        tenant = source.tenant_rule.tenant_of(event_id, payload)
    except TenantUnusable:
        tenant = ""  # the refusal is that it has none usable; the replay reads it again from the payload
    try:
        stored, _ = storable_payload(payload)
    except Unstorable:
        return RefusedEvent(event_id, event_type, tenant, None, body_fingerprint(body))
    canonical = canonical_json(stored)
    return RefusedEvent(
        event_id, event_type, tenant, canonical.decode(), hashlib.sha256(canonical).hexdigest()
    )


def _answer(source: Source, verified: Verified, refusal: Refusal, request_id: str, kept: bool) -> Answer:
    detail = storable_text(refusal.detail)
    if source.on_refusal == "reject":
        return error_answer(refusal.status, refusal.reason, detail, kept=kept)
    if not kept:
        # Acknowledging what was not kept would lose it: the provider's retry is the only copy left.
        return retry_later(
            refusal.reason, f"{detail}; the delivery could not be kept, so it was not acknowledged"
        )
    if verified.acknowledgement is not None:
        # A provider that reads the body (Adyen's "[accepted]") would otherwise retry what is kept.
        return text_answer(200, verified.acknowledgement)
    return json_answer(
        200,
        {
            "error": refusal.reason,
            "detail": detail,
            "request_id": request_id,
            "event_ids": [storable_text(event.id) for event in verified.events],
            "kept": True,
        },
    )
