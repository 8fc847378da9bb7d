"""The claim for one tenant (effect_claim_tenant_v1, migration 0023) decides exactly as the statement does.

Citus routes that function to the tenant's node (tests/citus/test_claims_routed.py); it is created on every
ledger, so CI checks here, on one node, what the cluster relies on: the same outcomes and the same rows for the
same deliveries, a guard against another tenant's entries, and a wake-up for the jobs it creates.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from effectgate.ledger import claims, db
from effectgate.ledger.claims import ClaimOutcome, Delivery, EffectRequest, claim_deliveries
from effectgate.ledger.cluster import topology
from effectgate.ledger.fingerprints import fingerprint
from tests.topologies import ROUTED_ON_ONE_NODE

pytestmark = pytest.mark.anyio


def delivery(tenant: str, payload: Any, event_id: str) -> Delivery:
    return Delivery(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        source="stripe",
        event_id=event_id,
        event_type="order.paid",
        payload=payload,
        fingerprint=fingerprint(payload),
        secret_index=0,
    )


def effect(
    key: str, handler: str = "charge", *, lock: str | None = None, version: int | None = None
) -> EffectRequest:
    return EffectRequest(
        key, handler, max_attempts=5, orphan_policy="redrive", lock_key=lock, version=version
    )


def scenario(tenant: str) -> list[list[tuple[Delivery, list[EffectRequest]]]]:
    """Batches, in order: new keys, a duplicate, a reject, a superseded version, an unmatched body twice."""
    return [
        [
            (delivery(tenant, {"id": 1}, "e1"), [effect("k1"), effect("k2", "ship", lock="o1", version=5)]),
            (delivery(tenant, {"id": 2}, "e2"), [effect("k3")]),
        ],
        [
            (delivery(tenant, {"id": 1}, "e1"), [effect("k1"), effect("k2", "ship", lock="o1", version=5)]),
            (delivery(tenant, {"id": 9}, "e9"), [effect("k3")]),
            (delivery(tenant, {"id": 4}, "e4"), [effect("k4", "ship", lock="o1", version=3)]),
            (delivery(tenant, {"id": 5}, "e5"), []),
        ],
        [(delivery(tenant, {"id": 5}, "e5"), [])],
    ]


def shape(outcomes: list[list[ClaimOutcome]]) -> list[list[tuple[str, ...]]]:
    # What a sender and an operator see, without the ids (the twin runs make different rows).
    return [
        [
            (
                o.outcome,
                o.effect_key,
                o.handler,
                *(
                    str(getattr(o, f))
                    for f in ("delivery_count", "version", "latest_version")
                    if hasattr(o, f)
                ),
            )
            for o in per
        ]
        for per in outcomes
    ]


async def rows(conn: db.Conn, tenant: str) -> dict[str, list[Any]]:
    queries = {
        "effects": "SELECT effect_key, handler, delivery_count, reject_count FROM effects WHERE tenant = %s ORDER BY 1",
        "jobs": "SELECT e.effect_key, j.kind, j.state::text, j.version FROM jobs j JOIN effects e"
        " ON e.id = j.effect_id WHERE j.tenant = %s ORDER BY 1",
        "deliveries": "SELECT event_id, effect_key, outcome FROM deliveries WHERE tenant = %s ORDER BY 1, 2, 3",
        "rejects": "SELECT effect_key, event_id FROM effect_rejects WHERE tenant = %s ORDER BY 1",
        "unmatched": "SELECT source, delivery_count FROM unmatched_deliveries WHERE tenant = %s",
        "versions": "SELECT kind, lock_key, version FROM effect_versions WHERE tenant = %s",
    }
    return {
        name: [tuple(r.values()) for r in await (await conn.execute(q, (tenant,))).fetchall()]  # type: ignore[arg-type]
        for name, q in queries.items()
    }


async def test_the_function_decides_and_writes_as_the_statement(conn: db.Conn) -> None:
    by_statement = [await claim_deliveries(conn, batch) for batch in scenario("t-statement")]
    by_function = [
        await claim_deliveries(conn, batch, topology=ROUTED_ON_ONE_NODE) for batch in scenario("t-function")
    ]
    assert [shape(b) for b in by_function] == [shape(b) for b in by_statement]
    # Not vacuous: every outcome the statement knows came out.
    seen = {o.outcome for batch in by_statement for per in batch for o in per}
    assert seen == {"accepted", "duplicate", "rejected", "superseded"}
    assert await rows(conn, "t-function") == await rows(conn, "t-statement")
    assert (await rows(conn, "t-function"))["unmatched"] == [("stripe", 2)]


async def test_a_batch_of_several_tenants_or_a_repeated_key_takes_the_statement(conn: db.Conn) -> None:
    mixed = [
        (delivery("t-a", {"id": 1}, "e1"), [effect("k")]),
        (delivery("t-b", {"id": 1}, "e1"), [effect("k")]),
        (delivery("t-b", {"id": 2}, "e2"), [effect("k")]),  # the same key again: a second round
    ]
    outcomes = await claim_deliveries(conn, mixed, topology=ROUTED_ON_ONE_NODE)
    assert [o.outcome for [o] in outcomes] == ["accepted", "accepted", "rejected"]


async def test_the_function_refuses_another_tenants_entries(conn: db.Conn) -> None:
    # As if a caller routed a two-tenant batch by its first tenant: the rows of the second live elsewhere.
    batch = [
        (delivery("t-a", {"id": 1}, "e1"), [effect("k")]),
        (delivery("t-b", {"id": 1}, "e1"), [effect("k")]),
    ]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="another tenant"):
        await claims._claim_round(conn, batch, [(0, 0), (1, 0)], None, tenant="t-a")
    assert (await (await conn.execute("SELECT count(*) AS n FROM effects")).fetchone()) == {"n": 0}


async def test_a_routed_claim_wakes_the_workers_of_its_kinds_once(conn: db.Conn, db_url: str) -> None:
    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    async with listener:
        await listener.execute("LISTEN effectgate_jobs")
        batch = [(delivery("t-a", {"id": 1}, "e1"), [effect("k1", "charge"), effect("k2", "ship")])]
        await claim_deliveries(conn, batch, topology=ROUTED_ON_ONE_NODE)
        # The function sends none itself (on Citus it runs where no one listens): this is the caller's.
        heard = {n.payload async for n in listener.notifies(timeout=1.0)}
        assert heard == {"charge", "ship"}
        # The function alone accepts without a word: the wake-up above was the caller's.
        alone = [(delivery("t-a", {"id": 2}, "e2"), [effect("k3", "charge")])]
        [(_, row)] = await claims._claim_round(conn, alone, [(0, 0)], None, tenant="t-a")
        assert row["outcome"] == "accepted"
        assert [n async for n in listener.notifies(timeout=0.5)] == []
        # A batch that accepts nothing wakes no one: the same delivery again is a duplicate.
        await claim_deliveries(conn, batch, topology=ROUTED_ON_ONE_NODE)
        assert [n async for n in listener.notifies(timeout=0.5)] == []


async def test_a_single_node_ledger_claims_with_the_statement(conn: db.Conn) -> None:
    assert (await topology.read(conn)).claims_routed is False


async def test_concurrent_routed_claims_of_one_key_accept_once(conn: db.Conn, db_url: str) -> None:

    async def one(n: int) -> str:
        c = await db.connect(db_url)
        async with c:
            [[o]] = await claim_deliveries(
                c, [(delivery("t-race", {"id": 1}, f"e{n}"), [effect("k")])], topology=ROUTED_ON_ONE_NODE
            )
            return o.outcome

    outcomes = await asyncio.gather(*(one(n) for n in range(20)))
    assert sorted(outcomes) == ["accepted"] + ["duplicate"] * 19
    jobs = await (await conn.execute("SELECT count(*) AS n FROM jobs WHERE tenant = 't-race'")).fetchone()
    assert jobs == {"n": 1}
