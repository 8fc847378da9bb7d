"""A small, fully known ledger for the report, API and CLI tests (no tests of its own).

Written through the ledger's own functions (claims, leases, steps, terminal transitions) with a fixed
clock, so every report has exact expected rows.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import (
    Accepted,
    Delivery,
    EffectRequest,
    claim_delivery,
    record_signature_failure,
)
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.jobs import steps

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
# What the worker stores for a handler's exception (handlers/worker/runtime.py storable_error), abridged.
TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/effectgate/handlers/worker.py", line 312, in _run_slice
    await handler(ctx, event)
  File "/srv/app/shop/effects.py", line 41, in fulfil_order
    await ctx.step("capture", lambda idem: ctx.payments.capture(pi, idempotency_key=idem))
  File "/srv/app/effectgate/handlers/context.py", line 97, in step
    raise TerminalError(answer["error"]["message"], code=answer["error"]["code"])
effectgate.handlers.errors.TerminalError: card declined
"""


def paid(order: str, amount: int = 1000, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"evt_{order}",
        "data": {"object": {"amount": amount, "metadata": {"order_id": order}}},
        **extra,
    }


async def deliver(
    conn: db.Conn,
    payload: Any,
    key: str,
    at: datetime,
    *,
    source: str = "stripe",
    tenant: str = "default",
    event_type: str = "payment_intent.succeeded",
    event_id: str | None = None,
    handler: str = "fulfil_order",
) -> Any:
    delivery = Delivery(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        source=source,
        event_id=event_id or str(payload.get("id", "evt")),
        event_type=event_type,
        payload=payload,
        fingerprint=fingerprint(payload),
        secret_index=0,
    )
    [outcome] = await claim_delivery(
        conn, delivery, [EffectRequest(key, handler, max_attempts=3, orphan_policy="redrive")], now=at
    )
    return outcome


async def seed(conn: db.Conn) -> dict[str, int]:
    """Fill the ledger; returns the job ids by effect key."""
    job_ids: dict[str, int] = {}
    # order-paid:1234 — delivered three times (the last an hour ago), once rejected with another payload;
    # its job ran: captured with a recorded step and succeeded.
    first = await deliver(conn, paid("1234"), "order-paid:1234", NOW - timedelta(hours=5))
    assert isinstance(first, Accepted)
    job_ids["order-paid:1234"] = first.job_id
    await deliver(conn, paid("1234"), "order-paid:1234", NOW - timedelta(hours=3))
    await deliver(conn, paid("1234"), "order-paid:1234", NOW - timedelta(hours=1))
    await deliver(
        conn,
        paid("1234", amount=999, coupon="X"),
        "order-paid:1234",
        NOW - timedelta(minutes=30),
        event_id="evt_forged",
    )
    # order-paid:1 — delivered once: not a duplicate. Its job failed once, then for good.
    single = await deliver(conn, paid("1"), "order-paid:1", NOW - timedelta(hours=2))
    assert isinstance(single, Accepted)
    job_ids["order-paid:1"] = single.job_id
    # ship:9 on shopify for tenant acme — delivered twice, two hours ago; its job is still pending.
    ship = await deliver(
        conn,
        {"id": 9, "items": [1, 2]},
        "ship:9",
        NOW - timedelta(hours=4),
        source="shopify",
        tenant="acme",
        event_type="orders/create",
        handler="ship_order",
    )
    assert isinstance(ship, Accepted)
    job_ids["ship:9"] = ship.job_id
    await deliver(
        conn,
        {"id": 9, "items": [1, 2]},
        "ship:9",
        NOW - timedelta(hours=2),
        source="shopify",
        tenant="acme",
        event_type="orders/create",
        handler="ship_order",
    )
    # order-paid:old — a duplicate from three days ago, outside the default window.
    old = await deliver(
        conn, paid("old"), "order-paid:old", NOW - timedelta(days=3, hours=1), handler="audit_order"
    )
    assert isinstance(old, Accepted)
    job_ids["order-paid:old"] = old.job_id
    await deliver(conn, paid("old"), "order-paid:old", NOW - timedelta(days=3), handler="audit_order")

    # Run order-paid:1234: capture recorded, succeeded.
    [lease] = await jobs.fetch_and_lease(
        conn, owner="worker-a", kinds={"fulfil_order": 30}, limit=1, now=NOW - timedelta(hours=4, minutes=59)
    )
    assert lease.job_id == job_ids["order-paid:1234"]
    await steps.record(
        conn,
        job_id=lease.job_id,
        lease_token=lease.lease_token,
        name="capture",
        idempotency_key="eg_capture_key",
        status="succeeded",
        result={"id": "pi_1234", "status": "succeeded"},
        now=NOW - timedelta(hours=4, minutes=58),
    )
    await jobs.finish(
        conn,
        lease.job_id,
        lease.lease_token,
        state="succeeded",
        by="worker-a",
        reason="done",
        now=NOW - timedelta(hours=4, minutes=57),
    )
    # Run order-paid:1: a retry, then a terminal failure.
    [lease] = await jobs.fetch_and_lease(
        conn, owner="worker-b", kinds={"fulfil_order": 30}, limit=1, now=NOW - timedelta(minutes=119)
    )
    assert lease.job_id == job_ids["order-paid:1"]
    await jobs.retry(
        conn,
        lease.job_id,
        lease.lease_token,
        delay=1,
        error={"type": "TransientError", "message": "502 from provider"},
        now=NOW - timedelta(minutes=118),
    )
    [lease] = await jobs.fetch_and_lease(
        conn, owner="worker-b", kinds={"fulfil_order": 30}, limit=1, now=NOW - timedelta(minutes=117)
    )
    await jobs.finish(
        conn,
        lease.job_id,
        lease.lease_token,
        state="failed",
        by="worker-b",
        reason="card declined",
        error={"type": "TerminalError", "message": "card declined", "traceback": TRACEBACK},
        now=NOW - timedelta(minutes=116),
    )

    # Authentication failures: bodies never stored, counted per (source, reason, minute).
    for minutes, source, reason in [
        (10, "stripe", "signature_invalid"),
        (10, "stripe", "signature_invalid"),
        (10, "stripe", "signature_invalid"),
        (5, "stripe", "signature_invalid"),
        (5, "shopify", "signature_missing"),
        (60 * 30, "stripe", "timestamp_out_of_tolerance"),
    ]:
        await record_signature_failure(
            conn,
            source=source,
            reason=reason,
            size=100,
            body_sha256="0" * 64,
            detail="no matching signature",
            now=NOW - timedelta(minutes=minutes),
        )
    return job_ids


@contextmanager
def seeded_database(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A database cloned from the migrated template and seeded once, for a module's read-only tests."""
    from tests.conftest import database_url

    name = f"effectgate_seeded_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')  # type: ignore[arg-type]
    url = database_url(pg_server_url, name)

    async def fill() -> None:
        conn = await db.connect(url)
        async with conn:
            await seed(conn)

    asyncio.run(fill())
    try:
        yield url
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]
