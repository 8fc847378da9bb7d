"""Claiming effects: the atomic step before anything is performed.

``claim_delivery`` takes one verified delivery and the effects its handlers asked for, and in one
transaction claims each effect by (tenant, effect key): new → claim + job (``Accepted``); the same
payload again → counted (``Duplicate``); a different payload under a held key → recorded
(``Rejected``). Nothing is acknowledged before this transaction commits.

``ClaimBatcher`` (``ledger/claim_batcher.py``) is group commit for a gateway process: the claims of
concurrent deliveries are written by one statement in one transaction, each request answered after that commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg

from .cluster.topology import SINGLE_NODE, Topology
from .db import Conn
from .fingerprints import canonical_json
from .queries import Q
from .vocabulary import DeliveryOutcome

log = logging.getLogger("effectgate.ledger")


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
    # Latest wins per (tenant, handler, lock key): the delivery's version (None: the effect declares none).
    version: int | None = None


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
    # The canonical JSON the fingerprint was taken over, if the caller kept it: sent as the payload as is.
    payload_text: str | None = None
    # The W3C traceparent of the span that received the delivery (tracing on), kept on the jobs it creates.
    trace_parent: str | None = None


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


@dataclass(frozen=True, slots=True)
class Superseded:
    """Older than the newest version claimed for its object (``latest_version``): recorded, never run."""

    effect_key: str
    handler: str
    version: int
    latest_version: int
    outcome: Literal[DeliveryOutcome.SUPERSEDED] = DeliveryOutcome.SUPERSEDED


ClaimOutcome = Accepted | Duplicate | Rejected | Superseded


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
    topology: Topology = SINGLE_NODE,
    wake: bool = True,
) -> list[list[ClaimOutcome]]:
    """Claim the effects of several deliveries in one transaction, with one statement for all of them.

    Claims resolve as if the deliveries ran one after another in the given order: the first claim of a
    key is accepted, the same payload later is a duplicate, another payload is rejected — also when
    one key comes several times here. Returns, per delivery, one outcome per effect in input order.

    Where ``topology.claims_routed`` (the claim function distributed by tenant on Citus): deliveries of one
    tenant, each key once, on an autocommit connection are claimed by one call of ``effect_claim_tenant_v1`` that Citus runs
    whole on that tenant's node; anything else takes the statement in a transaction, which Citus runs
    correctly, through the coordinator. The routed call wakes no one; this sends the wake-up from here after
    it, unless ``wake`` is false (a caller that claims for many tenants at once and wakes them in one go,
    ``notify_kinds``).
    """
    rounds = _rounds(items)
    tenants = {delivery.tenant for delivery, _ in items}
    if topology.claims_routed and len(rounds) == 1 and len(tenants) == 1 and not conn.info.transaction_status:
        # Distributed by tenant: one call Citus runs whole on the tenant's node, its own transaction there.
        [tenant] = tenants
        rows = await _claim_round(conn, items, rounds[0], now, tenant=tenant)
        if wake:
            await _wake(conn, items, rows)
    elif len(rounds) == 1 and not conn.info.transaction_status:
        # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT round trip.
        rows = await _claim_round(conn, items, rounds[0], now)
    else:
        rows = []
        async with conn.transaction():
            for entries in rounds:
                rows.extend(await _claim_round(conn, items, entries, now))
    results: list[list[ClaimOutcome | None]] = [[None] * len(effects) for _, effects in items]
    for (d, e), row in rows:
        eff = items[d][1][e]
        key, handler = eff.effect_key, eff.handler
        outcome: ClaimOutcome
        if row["outcome"] == DeliveryOutcome.ACCEPTED:
            outcome = Accepted(key, handler, row["effect_id"], row["job_id"])
        elif row["outcome"] == DeliveryOutcome.DUPLICATE:
            outcome = Duplicate(key, handler, row["effect_id"], row["delivery_count"])
        elif row["outcome"] == DeliveryOutcome.SUPERSEDED:
            outcome = Superseded(key, handler, row["version"], row["latest_version"])
        else:
            outcome = Rejected(key, handler, row["effect_id"], row["held_fingerprint"])
        results[d][e] = outcome
    return [[o for o in per_delivery if o is not None] for per_delivery in results]


# One entry of a claim statement: (delivery index, effect index or -1 for an unmatched delivery).
_Entry = tuple[int, int]


def _rounds(items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]) -> list[list[_Entry]]:
    """Split the entries into statements in which every (tenant, key) appears at most once.

    ON CONFLICT DO UPDATE may touch a row once per statement, and a later claim of a key must see the
    earlier one's row, so the n-th claim of a key goes to the n-th statement; they run in order in one
    transaction. Later rounds only touch keys the first round already locked: no new lock order.
    """
    rounds: list[list[_Entry]] = [[]]
    seen: dict[tuple[str, str], int] = {}
    for d, (delivery, effects) in enumerate(items):
        if not effects:
            rounds[0].append((d, -1))
            continue
        for e, effect in enumerate(effects):
            key = (delivery.tenant, effect.effect_key)
            n = seen.get(key, -1) + 1
            seen[key] = n
            if n == len(rounds):
                rounds.append([])
            rounds[n].append((d, e))
    return rounds


async def _claim_round(
    conn: Conn,
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]],
    entries: list[_Entry],
    now: datetime | None,
    *,
    tenant: str | None = None,
) -> list[tuple[_Entry, Any]]:
    rows: list[tuple[Any, ...]] = []  # one per entry, in _COLUMNS order; sent as one array per column
    payloads: list[str] = []
    payload_ix: dict[int, int] = {}
    for n, (d, e) in enumerate(entries):
        delivery, effects = items[d]
        if e < 0:
            # A delivery no handler asked for keeps its payload too (for the payload window), so it can be
            # replayed once a handler exists.
            effect_key = handler = orphan_policy = lock_key = None
            max_attempts = version = None
            fingerprint = delivery.fingerprint
        else:
            effect = effects[e]
            effect_key, handler = effect.effect_key, effect.handler
            max_attempts, orphan_policy, lock_key = effect.max_attempts, effect.orphan_policy, effect.lock_key
            version = effect.version if lock_key is not None else None
            # The effect's own fingerprint fields, when it names some; else the whole payload's.
            fingerprint = effect.fingerprint or delivery.fingerprint
        ix = payload_ix.get(d)
        if ix is None:
            # Sent once per delivery however many effects it has; the canonical text the fingerprint
            # was taken over, when the caller kept it, so the payload is not serialised again.
            payloads.append(delivery.payload_text or canonical_json(delivery.payload).decode())
            ix = payload_ix[d] = len(payloads)
        rows.append(
            (
                n,
                delivery.request_id,
                delivery.tenant,
                effect_key,
                delivery.source,
                handler,
                delivery.event_id,
                delivery.event_type,
                fingerprint,
                ix,
                max_attempts,
                orphan_policy,
                lock_key,
                delivery.secret_index,
                version,
                delivery.trace_parent,
            )
        )
    columns = (
        {name: list(values) for name, values in zip(_COLUMNS, zip(*rows, strict=True), strict=True)}
        if rows
        else {name: [] for name in _COLUMNS}
    )
    params: dict[str, Any] = {**columns, "payloads": payloads, "now": now}
    if tenant is None:
        found = await (await conn.execute(Q["effect_claim_batch"], params)).fetchall()
    else:
        found = await (
            await conn.execute(Q["effect_claim_tenant"], {**params, "tenant_id": tenant})
        ).fetchall()
    return [(entries[row["ord"]], row) for row in found]


async def _wake(
    conn: Conn,
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]],
    rows: list[tuple[_Entry, Any]],
) -> None:
    # The routed call sends no NOTIFY (on the tenant's node no one would hear it); the workers listen here. The
    # claim has committed, so a wake-up lost now costs a poll interval, never the claim: logged, not raised.
    kinds = sorted({items[d][1][e].handler for (d, e), row in rows if row["job_id"] is not None})
    if not kinds:
        return
    try:
        await conn.execute(Q["jobs_notify"], {"kinds": kinds})
    except psycopg.Error as exc:
        log.warning("claims.wake_failed", extra={"kinds": kinds, "error": type(exc).__name__})


_COLUMNS = (
    "ord",
    "request_id",
    "tenant",
    "effect_key",
    "source",
    "handler",
    "event_id",
    "event_type",
    "fingerprint",
    "payload_ix",
    "max_attempts",
    "orphan_policy",
    "lock_key",
    "secret_index",
    "version",
    "trace_parent",
)


async def notify_kinds(conn: Conn, kinds: Sequence[str]) -> None:
    """Wake the workers of ``kinds`` (after routed claims that sent no wake-up of their own)."""
    await conn.execute(Q["jobs_notify"], {"kinds": list(kinds)})


# Keys a statement of ``effects_missing`` asks for at most: an index scan's array, not a backlog.
MISSING_CHECK_CHUNK = 1_000


async def effects_missing(conn: Conn, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Of the (tenant, effect key) pairs ``keys``, those the ledger holds no effect for: after a failover,
    claims that were acknowledged on the old primary and never reached the new one (ledger/timeline.py).

    One statement per tenant and ``MISSING_CHECK_CHUNK`` keys, each an index scan (a router statement on Citus).
    """
    by_tenant: dict[str, list[str]] = {}
    for tenant, key in keys:
        by_tenant.setdefault(tenant, []).append(key)
    missing: set[tuple[str, str]] = set()
    for tenant, tenant_keys in by_tenant.items():
        for start in range(0, len(tenant_keys), MISSING_CHECK_CHUNK):
            chunk = tenant_keys[start : start + MISSING_CHECK_CHUNK]
            cur = await conn.execute(Q["effects_held_of"], {"tenant": tenant, "keys": chunk})
            held = {row["effect_key"] for row in await cur.fetchall()}
            missing.update((tenant, key) for key in chunk if key not in held)
    return missing


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
