"""The claim's guarantees on a three-node Citus cluster (coordinator + 2 workers), the ledger distributed by tenant.

Run by `make citus-check` against ``CITUS_URL``; what ran and what does not hold yet is in deploy/README.md,
"Past one Postgres". The claim statement is today's production one (``effect_claim_batch``), sent through
``ledger.claims`` as the ingress sends it.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import (
    Accepted,
    Duplicate,
    Rejected,
    claim_delivery,
    effects_missing,
)
from effectgate.ledger.cluster import topology
from effectgate.ledger.paces import LedgerTurns
from tests.topologies import CITUS

from .ledger import claim_params, delivery, effect, explain, rows

pytestmark = pytest.mark.anyio

DISTRIBUTED = {
    "effects",
    "jobs",
    "job_attempts",
    "steps",
    "job_actions",
    "effect_versions",
    "unmatched_deliveries",
    "deliveries",
    "effect_rejects",
}
REFERENCE = {"paused_kinds", "kind_actions"}


async def test_the_ledger_is_distributed_by_tenant_and_colocated(conn: db.Conn, citus_schema: str) -> None:
    tables = await rows(
        conn,
        "SELECT table_name::text AS name, citus_table_type AS type, distribution_column AS col, colocation_id"
        " FROM public.citus_tables WHERE table_name::text NOT LIKE '%%\\_p2%%'"
        " AND (table_name::regclass)::oid IN (SELECT oid FROM pg_class WHERE relnamespace = %s::regnamespace)",
        citus_schema,
    )
    by_name = {r["name"].split(".")[-1]: r for r in tables}
    distributed = {n for n, r in by_name.items() if r["type"] == "distributed" and not n.endswith("_default")}
    distributed = {n for n in distributed if not n.endswith("_legacy")}
    assert distributed == DISTRIBUTED
    assert {r["col"] for n, r in by_name.items() if n in DISTRIBUTED} == {"tenant"}
    assert len({r["colocation_id"] for n, r in by_name.items() if n in DISTRIBUTED}) == 1
    assert {n for n, r in by_name.items() if r["type"] == "reference"} == REFERENCE
    placement = await rows(
        conn,
        "SELECT nodeport, count(*) AS shards FROM citus_shards WHERE table_name = %s::regclass"
        " GROUP BY nodeport ORDER BY nodeport",
        f'"{citus_schema}".effects',
    )
    print("effects shards per worker node:", {r["nodeport"]: r["shards"] for r in placement})
    workers = await rows(conn, "SELECT * FROM citus_get_active_worker_nodes()")
    assert len(placement) == len(workers) >= 2


async def test_fifty_concurrent_claims_of_one_key_make_exactly_one_effect(
    citus_url: str, citus_schema: str
) -> None:
    """The claim race: 50 connections claim one (tenant, key) at once; the unique key on the shard decides."""
    arrived = delivery("race-tenant", "race-key")
    start, connected, ready = asyncio.Event(), asyncio.Event(), [0]

    async def one(n: int) -> Any:
        c = await db.connect(citus_url, schema=citus_schema)
        async with c:
            ready[0] += 1
            if ready[0] == 50:
                connected.set()
            await start.wait()
            [outcome] = await claim_delivery(c, arrived, [effect("race-key")])
            return outcome

    tasks = [asyncio.create_task(one(n)) for n in range(50)]
    # Every connection made before any claim starts, so the 50 claims meet on the shard at once.
    await asyncio.wait_for(connected.wait(), 60)
    start.set()
    outcomes = await asyncio.gather(*tasks)
    accepted = [o for o in outcomes if isinstance(o, Accepted)]
    duplicates = [o for o in outcomes if isinstance(o, Duplicate)]
    assert (len(accepted), len(duplicates)) == (1, 49)
    assert sorted(o.delivery_count for o in duplicates) == list(range(2, 51))
    conn = await db.connect(citus_url, schema=citus_schema)
    async with conn:
        [counts] = await rows(
            conn,
            "SELECT (SELECT count(*) FROM effects WHERE tenant = 'race-tenant') AS effects,"
            " (SELECT count(*) FROM jobs WHERE tenant = 'race-tenant') AS jobs,"
            " (SELECT count(*) FROM deliveries WHERE tenant = 'race-tenant') AS deliveries,"
            " (SELECT delivery_count FROM effects WHERE tenant = 'race-tenant') AS delivery_count",
        )
    assert counts == {"effects": 1, "jobs": 1, "deliveries": 50, "delivery_count": 50}


async def test_duplicates_and_rejects_are_answered_as_on_one_node(conn: db.Conn) -> None:
    [first] = await claim_delivery(conn, delivery("acme", "order-1"), [effect("order-1")])
    [again] = await claim_delivery(conn, delivery("acme", "order-1"), [effect("order-1")])
    [other] = await claim_delivery(conn, delivery("acme", "order-1", amount=7), [effect("order-1")])
    # The same key in another tenant is another effect (another shard, most likely).
    [elsewhere] = await claim_delivery(conn, delivery("globex", "order-1"), [effect("order-1")])
    assert isinstance(first, Accepted) and isinstance(elsewhere, Accepted)
    assert isinstance(again, Duplicate) and again.delivery_count == 2
    assert isinstance(other, Rejected) and other.held_fingerprint == delivery("acme", "order-1").fingerprint
    [row] = await rows(
        conn,
        "SELECT e.delivery_count, e.reject_count, r.rejected_fingerprint FROM effects e"
        " JOIN effect_rejects r ON r.effect_id = e.id AND r.tenant = e.tenant"
        " WHERE e.tenant = 'acme' AND e.effect_key = 'order-1'",
    )
    assert row == {
        "delivery_count": 2,
        "reject_count": 1,
        "rejected_fingerprint": delivery("acme", "order-1", amount=7).fingerprint,
    }


async def test_tenants_spread_over_the_worker_nodes(conn: db.Conn, citus_schema: str) -> None:
    for n in range(40):
        [outcome] = await claim_delivery(conn, delivery(f"tenant-{n}", "spread"), [effect("spread")])
        assert isinstance(outcome, Accepted)
    placed = await rows(
        conn,
        "SELECT s.nodeport, count(DISTINCT e.tenant) AS tenants FROM effects e"
        " JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column(%s::regclass, e.tenant)"
        " WHERE e.effect_key = 'spread' GROUP BY s.nodeport ORDER BY s.nodeport",
        f'"{citus_schema}".effects',
    )
    print("tenants of key 'spread' per worker node:", {r["nodeport"]: r["tenants"] for r in placed})
    # Two or more nodes (cluster.sh starts two workers; rebalance_run.py may have added more).
    assert len(placed) >= 2 and sum(r["tenants"] for r in placed) == 40


async def test_a_lookup_by_tenant_and_key_is_a_router_plan(conn: db.Conn) -> None:
    text = await explain(conn, "effect_by_key", {"tenant": "acme", "effect_key": "order-1"})
    assert "Task Count: 1" in text and "Distributed Subplan" not in text, text


async def test_the_failover_gap_check_runs_routed_on_the_cluster(conn: db.Conn) -> None:
    # After a failover of the coordinator (or a node), a gateway asks which of its acknowledged claims are
    # missing: each tenant's keys in one router statement (a join of unnest() with effects is refused here).
    for tenant in ("acme", "globex"):
        await claim_delivery(conn, delivery(tenant, "held"), [effect("held")])
    asked = [
        ("acme", "held"),
        ("acme", "lost-1"),
        ("globex", "held"),
        ("globex", "lost-2"),
        ("initech", "held"),
    ]
    assert await effects_missing(conn, asked) == {
        ("acme", "lost-1"),
        ("globex", "lost-2"),
        ("initech", "held"),
    }
    text = await explain(conn, "effects_held_of", {"tenant": "acme", "keys": ["held", "lost-1"]})
    assert "Task Count: 1" in text and "Distributed Subplan" not in text, text


async def test_the_claim_statement_is_not_a_router_plan_so_the_gateway_calls_the_function(
    conn: db.Conn,
) -> None:
    """Why ledger/citus.py exists: Citus plans the statement's chained INSERT ... SELECTs as subplans pulled
    through the coordinator, even for one tenant (test_claims_routed.py shows the function's one-task plan)."""
    text = await explain(conn, "effect_claim_batch", claim_params("acme", "plan-key"))
    assert "Distributed Subplan" in text, text


async def test_the_single_statement_fetch_is_refused_so_the_worker_leases_per_tenant(conn: db.Conn) -> None:
    """Over every tenant the fetch is a multi-shard FOR UPDATE, which Citus refuses: why the worker asks
    ``topology`` and then leases one tenant at a time (``topology.distributed``)."""
    assert (await topology.read(conn)).distributed
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        await jobs.fetch_and_lease(conn, owner="w", kinds={"charge": 30.0}, limit=5)
    assert (
        await jobs.fetch_and_lease(conn, owner="w", kinds={"nothing-due": 30.0}, limit=5, topology=CITUS)
        == []
    )


async def test_a_claim_wakes_the_workers_listening_on_the_coordinator(citus_url: str, conn: db.Conn) -> None:
    """The claim's pg_notify runs in the coordinator's transaction, so a worker's LISTEN there hears it."""
    listener = await db.connect(citus_url)
    async with listener:
        await listener.execute("LISTEN effectgate_jobs")
        [outcome] = await claim_delivery(conn, delivery("acme", "wake-1"), [effect("wake-1")])
        assert isinstance(outcome, Accepted)
        heard = []
        async with asyncio.timeout(10):
            async for note in listener.notifies():
                heard.append(note.payload)
                break
    assert heard == ["charge"]


async def test_a_fenced_write_runs_on_the_cluster(conn: db.Conn) -> None:
    [claimed] = await claim_delivery(conn, delivery("acme", "fenced-1"), [effect("fenced-1")])
    assert isinstance(claimed, Accepted)
    # Leased by hand, routed by tenant.
    await conn.execute(
        "UPDATE jobs SET state = 'running', attempt = 1, lease_token = 1, lease_owner = 'w',"
        " lease_expires_at = now() + interval '1 minute' WHERE tenant = 'acme' AND id = %s",
        (claimed.job_id,),
    )
    await jobs.save_checkpoint(conn, claimed.job_id, 1, {"at": 1}, now=datetime.now(UTC), tenant="acme")
    # The clock from the database (no `now` passed), as the worker writes it.
    await jobs.save_checkpoint(conn, claimed.job_id, 1, {"at": 2}, tenant="acme")
    job = await jobs.get(conn, claimed.job_id)
    assert job is not None and job["checkpoint"] == {"at": 2}


async def test_a_downstreams_pace_is_one_schedule_on_the_coordinator(
    citus_url: str, citus_schema: str
) -> None:
    # Two pools, as two worker processes hold them: one call a second between them, the turns reserved in order.
    pools = [db.make_pool(citus_url, min_size=1, max_size=2, schema=citus_schema) for _ in range(2)]
    for pool in pools:
        await pool.open(wait=True)
    try:
        turns = [LedgerTurns(pool) for pool in pools]
        reserved = [await turns[i % 2].take("citus-api", 1.0, 10.0) for i in range(4)]
        refused = await turns[0].take("citus-api", 1.0, 0.5)
    finally:
        for pool in pools:
            await pool.close()
    assert [ok for ok, _ in reserved] == [True] * 4
    waits = [wait for _, wait in reserved]
    assert all(b - a > 0.9 for a, b in itertools.pairwise(waits)), waits
    assert refused[0] is False and refused[1] > 3.0
