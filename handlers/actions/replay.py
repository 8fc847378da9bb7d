"""Replay of kept deliveries: unmatched ones (events that arrived before any handler wanted them) and refused
ones (verified events that could not become effects: a key or tenant function raised, the tenant was not
allowed, Postgres refused a value), claimed now.

An unmatched delivery keeps its payload for the payload window. Once a handler for its event exists, a replay
plans its effects exactly as the ingress does, with the same function (``plan.plan_event``: require, key,
fingerprint and lock key), and claims them with the delivery's original tenant, event id and fingerprint — under the normal rules: a key
claimed meanwhile is a duplicate (same payload) or a conflict (another payload), and replaying twice claims
nothing twice. The original unmatched row stays as the record of what arrived; each job a replay creates records who
replayed it (``ledger.jobs.audit``). A refused row stays too, marked
replayed (``refusal.replayed_at`` and the outcomes) once its effects are claimed; one that fails again stays
as it was, to be replayed after the next fix. A refused event's tenant is read again by the source's rule
(``tenant_of``, from the configuration): the refusal may have been that rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from effectgate.ledger import db, refusals
from effectgate.ledger.claims import Accepted, ClaimOutcome, Delivery, EffectRequest, claim_delivery
from effectgate.ledger.jobs import audit, filters

from ..event import Event
from ..plan import PlanFailed, TenantUnusable, plan_event
from ..registry import Registry


@dataclass(slots=True)
class ReplayResult:
    """Deliveries replayed, and the claim outcomes by kind (accepted, duplicate, rejected)."""

    deliveries: int = 0
    still_unmatched: int = 0
    key_failed: int = 0
    tenant_unusable: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, object]:
        """Counts, as the CLI prints them."""
        return {
            "deliveries": self.deliveries,
            "still_unmatched": self.still_unmatched,
            "key_failed": self.key_failed,
            "tenant_unusable": self.tenant_unusable,
            "outcomes": dict(sorted(self.outcomes.items())),
        }


async def replay_unmatched(
    conn: db.Conn,
    registry: Registry,
    *,
    by: str,
    source: str,
    since: datetime,
    until: datetime | None = None,
    limit: int = filters.DEFAULT_LIMIT,
    now: datetime | None = None,
    unsigned_type_sources: frozenset[str] = frozenset(),
) -> ReplayResult:
    """Claim every kept unmatched delivery of ``source`` in [since, until) as if it had just arrived,
    planned by ``plan_event`` as the ingress plans it. ``unsigned_type_sources``: the sources whose
    signature leaves the event type unsigned (the caller knows the configuration; this side does not)."""
    result = ReplayResult()
    for row in await filters.unmatched_for_replay(conn, source=source, since=since, until=until, limit=limit):
        result.deliveries += 1
        try:
            delivery, effects = _planned(registry, row, row["tenant"], unsigned_type_sources)
        except PlanFailed:
            # The ingress answers such a delivery 422; a replay counts it and goes on.
            result.key_failed += 1
            continue
        if not effects:
            result.still_unmatched += 1
            continue
        for outcome in await _claim(conn, delivery, effects, by=by, kept="unmatched", now=now):
            result.outcomes[outcome.outcome] += 1
    return result


async def replay_refused(
    conn: db.Conn,
    registry: Registry,
    *,
    by: str,
    source: str,
    tenant_of: Callable[[str, Any], str],
    since: datetime,
    until: datetime | None = None,
    limit: int = filters.DEFAULT_LIMIT,
    now: datetime | None = None,
    unsigned_type_sources: frozenset[str] = frozenset(),
) -> ReplayResult:
    """Claim every kept refused delivery of ``source`` in [since, until) not replayed yet, planned as the ingress
    plans it, with its tenant read again by ``tenant_of`` (the source's rule). A row whose effects are claimed is
    marked replayed; one that still fails is counted (``key_failed``, ``tenant_unusable``) and left as it was."""
    result = ReplayResult()
    rows = await refusals.refused_for_replay(conn, source=source, since=since, until=until, limit=limit)
    for row in rows:
        result.deliveries += 1
        try:
            tenant = tenant_of(row["event_id"], row["payload"])
        except TenantUnusable:
            result.tenant_unusable += 1
            continue
        try:
            delivery, effects = _planned(registry, row, tenant, unsigned_type_sources)
        except PlanFailed:
            result.key_failed += 1
            continue
        outcomes = await _claim(conn, delivery, effects, by=by, kept="refused", now=now)
        if not effects:
            result.still_unmatched += 1
        for outcome in outcomes:
            result.outcomes[outcome.outcome] += 1
        await refusals.mark_replayed(
            conn,
            row,
            replayed_at=now or datetime.now(UTC),
            outcomes=[
                {"key": o.effect_key, "handler": o.handler, "outcome": str(o.outcome)} for o in outcomes
            ],
        )
    return result


def _planned(
    registry: Registry, row: dict[str, Any], tenant: str, unsigned_type_sources: frozenset[str]
) -> tuple[Delivery, list[EffectRequest]]:
    """A kept delivery row planned as the ingress plans it (``PlanFailed`` when a kind's function fails), and
    the delivery record its claim writes: the original event id and fingerprint, under ``tenant``."""
    # The stored type is trusted only as far as the source's signature covers it.
    event = Event(
        row["source"],
        row["event_id"],
        row["event_type"],
        row["payload"],
        tenant,
        type_signed=row["source"] not in unsigned_type_sources,
    )
    effects = plan_event(registry, event).effects
    delivery = Delivery(
        request_id=f"replay:{row['request_id']}"[:200],
        tenant=tenant,
        source=row["source"],
        event_id=row["event_id"],
        event_type=row["event_type"],
        payload=row["payload"],
        fingerprint=row["fingerprint"],
        secret_index=row["secret_index"],
    )
    return delivery, effects


async def _claim(
    conn: db.Conn,
    delivery: Delivery,
    effects: Sequence[EffectRequest],
    *,
    by: str,
    kept: str,
    now: datetime | None,
) -> list[ClaimOutcome]:
    """Claim a replayed delivery's effects and record, in the same transaction, the replay on each job it
    created: who replayed which kept delivery (``kept``: unmatched or refused) shows in the effect's timeline."""
    async with conn.transaction():
        outcomes = await claim_delivery(conn, delivery, effects, now=now)
        for outcome in outcomes:
            if isinstance(outcome, Accepted):
                await audit.record(
                    conn,
                    "replay",
                    by=by,
                    job_id=outcome.job_id,
                    tenant=delivery.tenant,
                    detail={"delivery": delivery.request_id, "source": kept},
                    now=now,
                )
    return outcomes
