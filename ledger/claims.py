"""Claiming effects: the atomic step before anything is performed.

``claim_delivery`` takes one verified delivery and the effects its handlers asked for, and in one
transaction claims each effect by (tenant, effect key): new → claim + job (``Accepted``); the same
payload again → counted (``Duplicate``); a different payload under a held key → recorded
(``Rejected``). Nothing is acknowledged before this transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from .db import Conn
from .queries import Q


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """One effect a delivery asks for: which handler, under which key, with what limits."""

    effect_key: str
    handler: str
    max_attempts: int
    orphan_policy: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified delivery as the ledger records it."""

    request_id: str
    tenant: str
    source: str
    event_id: str
    event_type: str
    payload: Any
    fingerprint: str
    secret_index: int | None = None


@dataclass(frozen=True, slots=True)
class Accepted:
    """A new claim: the effect will run, as job ``job_id``."""

    effect_key: str
    handler: str
    effect_id: int
    job_id: int
    outcome: str = "accepted"


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The same event again: counted, not run again."""

    effect_key: str
    handler: str
    effect_id: int
    delivery_count: int
    outcome: str = "duplicate"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A different payload reusing a held key: recorded, never run."""

    effect_key: str
    handler: str
    effect_id: int
    held_fingerprint: str
    outcome: str = "rejected"


ClaimOutcome = Accepted | Duplicate | Rejected


async def claim_delivery(
    conn: Conn,
    delivery: Delivery,
    effects: Sequence[EffectRequest],
    *,
    now: datetime | None = None,
) -> list[ClaimOutcome]:
    """Claim every effect of one delivery atomically; returns one outcome per effect, in input order.

    A delivery that matched no handler is recorded as ``unmatched`` and returns ``[]``.
    """
    base = {
        "request_id": delivery.request_id,
        "tenant": delivery.tenant,
        "source": delivery.source,
        "event_id": delivery.event_id,
        "event_type": delivery.event_type,
        "fingerprint": delivery.fingerprint,
        "secret_index": delivery.secret_index,
        "now": now,
    }
    outcomes: dict[int, ClaimOutcome] = {}
    async with conn.transaction():
        if not effects:
            await conn.execute(Q["delivery_record_unmatched"], base)
            return []
        payload = Jsonb(delivery.payload)
        # Claim in key order: two deliveries sharing several keys then lock them in the same order and
        # cannot deadlock each other.
        for index, effect in sorted(enumerate(effects), key=lambda item: item[1].effect_key):
            params = {
                **base,
                "effect_key": effect.effect_key,
                "handler": effect.handler,
                "payload": payload,
                "max_attempts": effect.max_attempts,
                "orphan_policy": effect.orphan_policy,
            }
            row = await (await conn.execute(Q["effect_claim"], params)).fetchone()
            assert row is not None  # INSERT … ON CONFLICT DO UPDATE always yields the row
            if row["outcome"] == "accepted":
                outcomes[index] = Accepted(effect.effect_key, effect.handler, row["effect_id"], row["job_id"])
            elif row["outcome"] == "duplicate":
                outcomes[index] = Duplicate(
                    effect.effect_key, effect.handler, row["effect_id"], row["delivery_count"]
                )
            else:
                outcomes[index] = Rejected(
                    effect.effect_key, effect.handler, row["effect_id"], row["held_fingerprint"]
                )
    return [outcomes[i] for i in range(len(effects))]


async def record_signature_failure(
    conn: Conn,
    *,
    source: str,
    reason: str,
    size: int,
    body_sha256: str,
    detail: str,
    now: datetime | None = None,
) -> None:
    """Count one failed verification in its (source, reason, minute) bucket; the body is never stored."""
    await conn.execute(
        Q["signature_failure_count"],
        {
            "source": source,
            "reason": reason,
            "size": size,
            "body_sha256": body_sha256,
            "detail": detail[:500],
            "now": now,
        },
    )
