"""The claim routed by tenant on the cluster (effect_claim_tenant_v1; docs/adr/0023-claims-and-leases-on-citus.md).

`effectgate migrate` distributed the claim function by its tenant argument with ``effects``. Checked: the call is one task on one worker node, the claim
races resolve there as on one node, the wake-up reaches the coordinator, and the gateway's batcher splits a
batch of many tenants into routed calls with the right answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import psycopg
import psycopg_pool
import pytest
from psycopg.rows import DictRow, dict_row

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import Accepted, Duplicate, Rejected, claim_deliveries
from effectgate.ledger.cluster import topology
from effectgate.ledger.handle import Ledger
from effectgate.ledger.queries import Q
from tests.topologies import CITUS

from .ledger import claim_params, delivery, effect, rows

pytestmark = pytest.mark.anyio


async def test_the_claim_function_is_distributed_by_tenant_with_effects(conn: db.Conn) -> None:
    assert (await topology.read(conn)).claims_routed
    [row] = await rows(
        conn,
        "SELECT o.distribution_argument_index AS arg, o.colocationid = p.colocationid AS colocated"
        " FROM pg_dist_object o JOIN pg_proc f ON f.oid = o.objid, pg_dist_partition p"
        " WHERE f.proname = 'effect_claim_tenant_v1' AND f.pronamespace = current_schema()::regnamespace"
        " AND p.logicalrelid = 'effects'::regclass",
    )
    assert row == {"arg": 0, "colocated": True}


async def test_a_claim_for_one_tenant_is_one_task_on_one_worker_node(conn: db.Conn) -> None:
    params = {**claim_params("acme", "routed-plan"), "tenant_id": "acme"}
    # Outside a transaction block, as the gateway calls it: Citus delegates the call to the tenant's node.
    cur = await conn.execute("EXPLAIN " + Q["effect_claim_tenant"], params)  # type: ignore[operator]
    text = "\n".join(next(iter(r.values())) for r in await cur.fetchall())
    print(text)
    assert "Task Count: 1" in text and "Distributed Subplan" not in text, text
    [shard] = await rows(
        conn,
        "SELECT nodeport FROM citus_shards WHERE table_name = 'effects'::regclass"
        " AND shardid = get_shard_id_for_distribution_column('effects', 'acme')",
    )
    assert f"port={shard['nodeport']}" in text, text


async def test_fifty_concurrent_routed_claims_of_one_key_make_exactly_one_effect(
    citus_url: str, citus_schema: str
) -> None:
    arrived = delivery("routed-race", "race-key")
    start, connected, ready = asyncio.Event(), asyncio.Event(), [0]

    async def one() -> Any:
        c = await db.connect(citus_url, schema=citus_schema)
        async with c:
            assert (await topology.read(c)).claims_routed
            ready[0] += 1
            if ready[0] == 50:
                connected.set()
            await start.wait()
            [[outcome]] = await claim_deliveries(c, [(arrived, [effect("race-key")])], topology=CITUS)
            return outcome

    tasks = [asyncio.create_task(one()) for _ in range(50)]
    await asyncio.wait_for(connected.wait(), 60)
    start.set()
    outcomes = await asyncio.gather(*tasks)
    assert sorted(type(o).__name__ for o in outcomes) == ["Accepted"] + ["Duplicate"] * 49
    assert sorted(o.delivery_count for o in outcomes if isinstance(o, Duplicate)) == list(range(2, 51))
    conn = await db.connect(citus_url, schema=citus_schema)
    async with conn:
        [counts] = await rows(
            conn,
            "SELECT (SELECT count(*) FROM effects WHERE tenant = 'routed-race') AS effects,"
            " (SELECT count(*) FROM jobs WHERE tenant = 'routed-race') AS jobs,"
            " (SELECT count(*) FROM deliveries WHERE tenant = 'routed-race') AS deliveries",
        )
    assert counts == {"effects": 1, "jobs": 1, "deliveries": 50}


async def test_a_routed_claim_wakes_the_coordinators_listeners_only_by_the_callers_notify(
    citus_url: str, conn: db.Conn
) -> None:
    listener = await db.connect(citus_url)
    async with listener:
        await listener.execute("LISTEN effectgate_jobs")
        # The function alone, on the worker node: it sends no NOTIFY (none would be heard here).
        params = {**claim_params("acme", "wake-routed-0"), "tenant_id": "acme"}
        [row] = await (await conn.execute(Q["effect_claim_tenant"], params)).fetchall()
        assert row["outcome"] == "accepted"
        assert [n async for n in listener.notifies(timeout=1.0)] == []
        # Through ledger.claims: the wake-up is sent from the coordinator after the call.
        [[outcome]] = await claim_deliveries(
            conn, [(delivery("acme", "wake-routed-1"), [effect("wake-routed-1")])], topology=CITUS
        )
        assert isinstance(outcome, Accepted)
        heard = [n.payload async for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert heard == ["charge"]


async def test_the_batcher_routes_a_batch_of_many_tenants_per_tenant(
    citus_url: str, citus_schema: str
) -> None:
    pool = db.make_pool(citus_url, min_size=1, max_size=8, schema=citus_schema)
    await pool.open()
    batcher = ClaimBatcher(Ledger(pool))
    try:
        tenants = [f"batch-{n}" for n in range(12)]
        firsts = [(delivery(t, "order-1"), [effect("order-1")]) for t in tenants]
        seconds = [(delivery(t, "order-1"), [effect("order-1")]) for t in tenants]
        others = [(delivery(t, "order-1", amount=999), [effect("order-1")]) for t in tenants]
        answered = await asyncio.gather(*(batcher.claim([item]) for item in firsts))
        assert all(isinstance(o, Accepted) for [[o]] in answered)
        answered = await asyncio.gather(*(batcher.claim([item]) for item in seconds + others))
        kinds = [type(o) for [[o]] in answered]
        assert kinds == [Duplicate] * 12 + [Rejected] * 12
        assert (await batcher.topology()).claims_routed  # the batches above were routed calls
    finally:
        await batcher.close()
        await pool.close()
    conn = await db.connect(citus_url, schema=citus_schema)
    async with conn:
        [counts] = await rows(
            conn,
            "SELECT count(*) AS effects, sum(delivery_count) AS deliveries, sum(reject_count) AS rejects"
            " FROM effects WHERE tenant LIKE 'batch-%%'",
        )
    assert counts == {"effects": 12, "deliveries": 24, "rejects": 12}


@asynccontextmanager
async def observed_batcher(
    url: str,
    schema: str,
    *,
    connection_class: type[psycopg.AsyncConnection[DictRow]] = psycopg.AsyncConnection[DictRow],
    also: Callable[[db.Conn], Awaitable[None]] | None = None,
    min_size: int = 1,
) -> AsyncIterator[ClaimBatcher]:
    """The gateway's batcher on a pool of its own whose connections the test watches: of ``connection_class``,
    and each set up by ``also`` after the schema."""

    async def configure(c: db.Conn) -> None:
        await c.set_autocommit(True)
        await db.use_schema(c, schema)
        if also is not None:
            await also(c)

    pool = psycopg_pool.AsyncConnectionPool(
        url,
        connection_class=connection_class,
        kwargs={"row_factory": dict_row},
        configure=configure,
        min_size=min_size,
        max_size=8,
        open=False,
    )
    await pool.open()
    batcher = ClaimBatcher(Ledger(pool))
    try:
        yield batcher
    finally:
        await batcher.close()
        await pool.close()


async def test_a_key_repeated_across_requests_is_claimed_by_routed_calls_alone(
    citus_url: str, citus_schema: str
) -> None:
    # The coordinator names every command it sends a worker node (citus.log_remote_commands, as NOTICEs): a
    # batch that repeats a key used to go through the coordinator in one multi-statement transaction, which
    # Citus commits with PREPARE TRANSACTION on both nodes even for one tenant. Now a key's repeat waits for the
    # next batch, and each batch is one delegated call.
    sent: ClassVar[list[str]] = []

    async def logging_remote_commands(c: db.Conn) -> None:
        await c.execute("SET citus.log_remote_commands TO on")
        c.add_notice_handler(lambda diag: sent.append(diag.message_primary or ""))

    async with observed_batcher(citus_url, citus_schema, also=logging_remote_commands) as batcher:
        assert (await batcher.topology()).claims_routed
        same = [(delivery("repeat", "order-1", request=f"r{n}"), [effect("order-1")]) for n in range(6)]
        other = [(delivery("repeat", "order-1", amount=999, request="x"), [effect("order-1")])]
        sent.clear()
        answered = await asyncio.gather(*(batcher.claim([item]) for item in same + other))
        assert [type(o) for [[o]] in answered] == [Accepted] + [Duplicate] * 5 + [Rejected]
    two_phase = [m for m in sent if "PREPARE TRANSACTION" in m or "COMMIT PREPARED" in m]
    assert not two_phase, two_phase
    calls = [m for m in sent if "effect_claim_tenant_v1" in m]
    assert len(calls) == len(same) + len(other), sent


class Counted(psycopg.AsyncConnection[DictRow]):
    """A connection that counts the statements sent through it (what the batcher sends), and is otherwise one."""

    sent: ClassVar[list[str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        Counted.sent.append(str(query))
        return await super().execute(query, params, **kwargs)


async def test_a_batch_for_many_tenants_is_one_call_each_and_one_wake_up(
    citus_url: str, citus_schema: str
) -> None:
    async with observed_batcher(citus_url, citus_schema, connection_class=Counted, min_size=4) as batcher:
        assert (await batcher.topology()).claims_routed
        items = [(delivery(f"wide-{n}", "order-1"), [effect("order-1")]) for n in range(32)]
        Counted.sent.clear()
        # One request naming 32 tenants' deliveries would take the statement; 32 requests at once fill one batch.
        answered = await asyncio.gather(*(batcher.claim([item]) for item in items))
        assert all(isinstance(o, Accepted) for [[o]] in answered)
    calls = [q for q in Counted.sent if q == Q["effect_claim_tenant"]]
    wakes = [q for q in Counted.sent if q == Q["jobs_notify"]]
    assert len(calls) == 32, Counted.sent
    # The first request is written alone (an idle batcher does not wait for company) and wakes its own kind.
    assert len(wakes) <= 2, Counted.sent
    # Nothing else but the pool's own set-up of the connections it opened meanwhile.
    others = [q for q in Counted.sent if q not in calls + wakes and "search_path" not in q]
    assert others == [], others
