"""A verified request as the ledger records it: one ``Delivery`` per event, with the effects it asks for.

Shared by the ingress pipeline (``pipeline``) and tests that plan a delivery without HTTP.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from effectgate.handlers import tracing
from effectgate.handlers.event import Event as HandlerEvent
from effectgate.handlers.plan import plan_event
from effectgate.handlers.registry import Registry
from effectgate.ledger.claims import Delivery, EffectRequest
from effectgate.ledger.fingerprints import canonical_json

from ..config import Source
from ..signatures import Verified

log = logging.getLogger("effectgate.gateway")

# The answer's outcome for an effect that matched the event type but whose ``require`` was not met.
UNMET_REQUIREMENT = "unmet_requirement"


def plan(
    source: Source, registry: Registry, verified: Verified, request_id: str
) -> tuple[list[tuple[Delivery, list[EffectRequest]]], list[dict[str, Any]]]:
    """The delivery records of a verified request and the effects each asks for, with the effects skipped for
    an unmet ``require``. The decisions (tenant, require, key, fingerprint, lock key) are
    ``handlers.plan``'s, shared with the replay; what is made here is the delivery record. Every event's
    tenant is read first, so a batch with one unusable tenant is refused (``TenantUnusable``) before any key
    is computed; a kind's function that fails raises ``PlanFailed`` and nothing of the request is claimed."""
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
        plan = plan_event(registry, handler_event)
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
