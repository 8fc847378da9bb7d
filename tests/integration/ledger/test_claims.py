"""Invariant 3 and 4: one claim per (tenant, effect key); same fingerprint duplicate, else reject."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, Delivery, Duplicate, EffectRequest, Rejected, claim_delivery
from effectgate.ledger.fingerprints import fingerprint

pytestmark = pytest.mark.anyio


def delivery(payload: Any, *, event_id: str = "evt_1", tenant: str = "default") -> Delivery:
    return Delivery(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        source="stripe",
        event_id=event_id,
        event_type="payment_intent.succeeded",
        payload=payload,
        fingerprint=fingerprint(payload),
        secret_index=0,
    )


def effect(key: str = "order-paid:1", handler: str = "fulfil") -> EffectRequest:
    return EffectRequest(effect_key=key, handler=handler, max_attempts=5, orphan_policy="redrive")


async def count(conn: db.Conn, sql: str) -> int:
    row = await (await conn.execute(sql)).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row["n"])


async def test_new_key_is_accepted_with_a_job(conn: db.Conn) -> None:
    [outcome] = await claim_delivery(conn, delivery({"id": "evt_1"}), [effect()])
    assert isinstance(outcome, Accepted)
    job = await (await conn.execute("SELECT state::text, effect_id FROM jobs")).fetchone()
    assert job == {"state": "pending", "effect_id": outcome.effect_id}


async def test_same_payload_again_is_a_duplicate_counted_not_rerun(conn: db.Conn) -> None:
    await claim_delivery(conn, delivery({"id": "evt_1", "a": 1}), [effect()])
    # Key order and whitespace do not matter: the fingerprint is over the canonical form.
    [again] = await claim_delivery(conn, delivery({"a": 1, "id": "evt_1"}), [effect()])
    assert isinstance(again, Duplicate)
    assert again.delivery_count == 2
    assert await count(conn, "SELECT count(*) AS n FROM jobs") == 1
    assert await count(conn, "SELECT count(*) AS n FROM deliveries WHERE outcome = 'duplicate'") == 1


async def test_different_payload_reusing_a_key_is_rejected_and_recorded(conn: db.Conn) -> None:
    await claim_delivery(conn, delivery({"id": "evt_1", "amount": 100}), [effect()])
    other = {"id": "evt_2", "amount": 999}
    [outcome] = await claim_delivery(conn, delivery(other, event_id="evt_2"), [effect()])
    assert isinstance(outcome, Rejected)
    assert outcome.held_fingerprint == fingerprint({"id": "evt_1", "amount": 100})
    rej = await (await conn.execute("SELECT * FROM effect_rejects")).fetchall()
    assert len(rej) == 1
    assert rej[0]["rejected_payload"] == other
    assert rej[0]["rejected_fingerprint"] == fingerprint(other)
    assert await count(conn, "SELECT count(*) AS n FROM jobs") == 1


async def test_keys_are_scoped_by_tenant(conn: db.Conn) -> None:
    [a] = await claim_delivery(conn, delivery({"x": 1}, tenant="acme"), [effect()])
    [b] = await claim_delivery(conn, delivery({"x": 1}, tenant="globex"), [effect()])
    assert isinstance(a, Accepted) and isinstance(b, Accepted)


async def test_several_effects_of_one_delivery_are_claimed_together(conn: db.Conn) -> None:
    outcomes = await claim_delivery(
        conn, delivery({"id": "e"}), [effect("k:b", "ship"), effect("k:a", "capture")]
    )
    assert [type(o) for o in outcomes] == [Accepted, Accepted]
    assert [o.effect_key for o in outcomes] == ["k:b", "k:a"]
    assert await count(conn, "SELECT count(*) AS n FROM jobs") == 2


async def test_a_failing_effect_rolls_back_the_whole_delivery(conn: db.Conn) -> None:
    bad = EffectRequest(effect_key="k:2", handler="x", max_attempts=5, orphan_policy="nonsense")
    with pytest.raises(Exception, match="orphan_policy"):
        await claim_delivery(conn, delivery({"id": "e"}), [effect("k:1"), bad])
    for table in ("effects", "jobs", "deliveries"):
        assert await count(conn, f"SELECT count(*) AS n FROM {table}") == 0, table


async def test_unmatched_delivery_is_recorded(conn: db.Conn) -> None:
    assert await claim_delivery(conn, delivery({"id": "e"}), []) == []
    assert await count(conn, "SELECT count(*) AS n FROM deliveries WHERE outcome = 'unmatched'") == 1


async def _race(db_url: str, payloads: list[Any]) -> list[Any]:
    conns = [await db.connect(db_url) for _ in payloads]
    # Every claimant and this task meet at the start line; the claims all leave it together.
    start = asyncio.Barrier(len(payloads) + 1)

    async def one(c: db.Conn, payload: Any, i: int) -> Any:
        await start.wait()
        [outcome] = await claim_delivery(c, delivery(payload, event_id=f"evt_{i}"), [effect()])
        return outcome

    tasks = [asyncio.create_task(one(c, p, i)) for i, (c, p) in enumerate(zip(conns, payloads, strict=True))]
    try:
        await asyncio.wait_for(start.wait(), 60)
        return await asyncio.gather(*tasks)
    finally:
        for c in conns:
            await c.close()


async def test_fifty_concurrent_claims_of_one_key_accept_exactly_one(db_url: str, conn: db.Conn) -> None:
    outcomes = await _race(db_url, [{"id": "evt", "order": 1}] * 50)
    assert sum(isinstance(o, Accepted) for o in outcomes) == 1
    assert sum(isinstance(o, Duplicate) for o in outcomes) == 49
    assert await count(conn, "SELECT count(*) AS n FROM jobs") == 1
    assert await count(conn, "SELECT delivery_count AS n FROM effects") == 50
    assert await count(conn, "SELECT count(*) AS n FROM deliveries") == 50


async def test_fifty_concurrent_different_payloads_accept_one_reject_the_rest(
    db_url: str, conn: db.Conn
) -> None:
    outcomes = await _race(db_url, [{"id": f"evt_{i}", "order": 1} for i in range(50)])
    assert sum(isinstance(o, Accepted) for o in outcomes) == 1
    assert sum(isinstance(o, Rejected) for o in outcomes) == 49
    assert await count(conn, "SELECT count(*) AS n FROM jobs") == 1
    assert await count(conn, "SELECT count(*) AS n FROM effect_rejects") == 49
    assert await count(conn, "SELECT reject_count AS n FROM effects") == 49
