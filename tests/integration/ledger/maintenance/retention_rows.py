"""Rows for the retention tests, on a clock that is a parameter: deliveries of a key (``delivery``, ``deliver``), a
job claimed, run with one recorded step and finished (``finished``), and an effect's row read back (``effect``).
``day(n)`` is n days after T0, so a pass is told it is later and nothing sleeps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import (
    Accepted,
    Delivery,
    Duplicate,
    EffectRequest,
    Rejected,
    claim_delivery,
)
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.jobs import steps

T0 = datetime(2031, 1, 1, 0, 0, tzinfo=UTC)


def day(n: float) -> datetime:
    return T0 + timedelta(days=n)


def delivery(key: str, *, source: str = "stripe", payload: Any = None, tenant: str = "default") -> Delivery:
    payload = payload if payload is not None else {"key": key, "card": "4242"}
    return Delivery(
        uuid.uuid4().hex, tenant, source, f"evt-{key}", "thing.happened", payload, fingerprint(payload)
    )


async def deliver(conn: db.Conn, key: str, now: datetime, **kw: Any) -> Accepted | Duplicate | Rejected:
    [outcome] = await claim_delivery(
        conn, delivery(key, **kw), [EffectRequest(key, "k", 3, "redrive")], now=now
    )
    return outcome


async def finished(conn: db.Conn, key: str, now: datetime, *, state: str = "succeeded", **kw: Any) -> int:
    """Claim ``key`` at ``now``, run it with one recorded step, finish it ``state`` at ``now``."""
    outcome = await deliver(conn, key, now, **kw)
    assert isinstance(outcome, Accepted)
    [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 30}, limit=1, now=now)
    assert lease.job_id == outcome.job_id
    await steps.record(
        conn,
        job_id=lease.job_id,
        lease_token=lease.lease_token,
        name="capture",
        idempotency_key=f"idem-{key}",
        status="succeeded",
        result={"charge": "ch_1", "last4": "4242"},
        now=now,
    )
    await jobs.finish(conn, lease.job_id, lease.lease_token, state=state, by="w", now=now)
    return lease.job_id


async def effect(conn: db.Conn, key: str) -> dict[str, Any] | None:
    return await (await conn.execute("SELECT * FROM effects WHERE effect_key = %s", (key,))).fetchone()
