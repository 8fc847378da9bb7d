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
from typing import Any, Literal

from psycopg.types.json import Jsonb

from .db import Conn
from .queries import Q
from .vocabulary import DeliveryOutcome


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """One effect a delivery asks for: which handler, under which key, with what limits."""

    effect_key: str
    handler: str
    max_attempts: int
    orphan_policy: str
    lock_key: str | None = None
    # The fingerprint of the fields this effect says make "the same request"; None: the delivery's,
    # of the whole payload.
    fingerprint: str | None = None


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
    outcome: Literal[DeliveryOutcome.ACCEPTED] = DeliveryOutcome.ACCEPTED


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The same event again: counted, not run again."""

    effect_key: str
    handler: str
    effect_id: int
    delivery_count: int
    outcome: Literal[DeliveryOutcome.DUPLICATE] = DeliveryOutcome.DUPLICATE


@dataclass(frozen=True, slots=True)
class Rejected:
    """A different payload reusing a held key: recorded, never run."""

    effect_key: str
    handler: str
    effect_id: int
    held_fingerprint: str
    outcome: Literal[DeliveryOutcome.REJECTED] = DeliveryOutcome.REJECTED


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
    [outcomes] = await claim_deliveries(conn, [(delivery, effects)], now=now)
    return outcomes


async def claim_deliveries(
    conn: Conn,
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]],
    *,
    now: datetime | None = None,
) -> list[list[ClaimOutcome]]:
    """Claim the effects of several deliveries (one request's batch) in one transaction.

    One effect is one statement, atomic on its own; several are pipelined in one transaction (BEGIN,
    every claim and COMMIT reach Postgres together), so a delivery costs one round trip whatever its
    number of effects. Returns, per delivery, one outcome per effect in input order.
    """
    planned: list[tuple[int, int, EffectRequest, dict[str, Any]]] = []
    unmatched: list[dict[str, Any]] = []
    for d_index, (delivery, effects) in enumerate(items):
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
        if not effects:
            unmatched.append({**base, "payload": Jsonb(delivery.payload)})
            continue
        payload = Jsonb(delivery.payload)
        for e_index, effect in enumerate(effects):
            params = {
                **base,
                "effect_key": effect.effect_key,
                "handler": effect.handler,
                "payload": payload,
                "max_attempts": effect.max_attempts,
                "orphan_policy": effect.orphan_policy,
                "lock_key": effect.lock_key,
                "fingerprint": effect.fingerprint or delivery.fingerprint,
            }
            planned.append((d_index, e_index, effect, params))
    # Claim in (tenant, key) order: two requests sharing several keys then lock them in the same order
    # and cannot deadlock each other.
    planned.sort(key=lambda item: (items[item[0]][0].tenant, item[2].effect_key))

    if len(planned) + len(unmatched) == 1 and not conn.info.transaction_status:
        # The common case, one effect: a single statement on an autocommit connection is its own
        # transaction, so it needs neither BEGIN/COMMIT nor the pipeline's bookkeeping.
        if unmatched:
            await conn.execute(Q["delivery_record_unmatched"], unmatched[0])
            rows = []
        else:
            d, e, eff, params = planned[0]
            rows = [(d, e, eff, await (await conn.execute(Q["effect_claim"], params)).fetchone())]
    else:
        async with conn.pipeline():
            async with conn.transaction():
                for base in unmatched:
                    await conn.execute(Q["delivery_record_unmatched"], base)
                cursors = [
                    (d, e, eff, await conn.execute(Q["effect_claim"], params))
                    for d, e, eff, params in planned
                ]
            rows = [(d, e, eff, await cursor.fetchone()) for d, e, eff, cursor in cursors]

    results: list[list[ClaimOutcome | None]] = [[None] * len(effects) for _, effects in items]
    for d, e, eff, row in rows:
        assert row is not None  # INSERT … ON CONFLICT DO UPDATE always yields the row
        key, handler = eff.effect_key, eff.handler
        outcome: ClaimOutcome
        if row["outcome"] == DeliveryOutcome.ACCEPTED:
            outcome = Accepted(key, handler, row["effect_id"], row["job_id"])
        elif row["outcome"] == DeliveryOutcome.DUPLICATE:
            outcome = Duplicate(key, handler, row["effect_id"], row["delivery_count"])
        else:
            outcome = Rejected(key, handler, row["effect_id"], row["held_fingerprint"])
        results[d][e] = outcome
    return [[o for o in per_delivery if o is not None] for per_delivery in results]


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
