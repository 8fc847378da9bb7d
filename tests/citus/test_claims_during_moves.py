"""Claims while a shard moves (issue 41, "Shards move without 503s").

A shard move takes the shard group's metadata lock on every worker node (``lock_shard_metadata``; block_writes for
the whole copy, a logical move for its switch-over), and a routed claim of a tenant on that shard waits for it on
the worker node, where the claim pool's lock_timeout does not reach. Here the lock is held exactly as a move holds
it, so the wait is as long as the test says. The gateway's batcher, one batch in flight, used to wait for that
one call while every other tenant's claims expired in its queue (``503 claim_timeout``, reason ``deadline``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import Accepted
from effectgate.ledger.handle import Ledger

from .ledger import delivery, effect

pytestmark = pytest.mark.anyio


def shard_group(url: str, schema: str, tenant: str) -> tuple[list[int], list[tuple[str, int]]]:
    """The shards colocated with ``tenant``'s effects shard (what a move of it moves), and the worker nodes."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        shards = [
            int(r[0])
            for r in c.execute(
                "SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_partition p USING (logicalrelid),"
                " pg_dist_shard e JOIN pg_dist_partition ep USING (logicalrelid)"
                " WHERE e.shardid = get_shard_id_for_distribution_column('effects', %s::text)"
                " AND p.colocationid = ep.colocationid AND s.shardminvalue = e.shardminvalue ORDER BY 1",
                (tenant,),
            ).fetchall()
        ]
        nodes = [
            (str(h), int(p))
            for h, p in c.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
            ).fetchall()
        ]
    return shards, nodes


def other_shard_tenants(url: str, schema: str, held: str, n: int) -> list[str]:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        [(mine,)] = c.execute(
            "SELECT get_shard_id_for_distribution_column('effects', %s::text)", (held,)
        ).fetchall()
        found: list[str] = []
        for k in range(1000):
            t = f"beside-{k}"
            [(shard,)] = c.execute(
                "SELECT get_shard_id_for_distribution_column('effects', %s::text)", (t,)
            ).fetchall()
            if shard != mine:
                found.append(t)
            if len(found) == n:
                return found
    raise AssertionError("no tenants on other shards")


async def wait_for_lock_waiter(nodes: list[tuple[str, int]], within: float = 10.0) -> None:
    """Poll the nodes until a backend waits on a lock there (the held tenant's routed claim); fail after ``within``.
    Each poll on a new connection: pg_stat_activity is a snapshot per transaction."""
    deadline = time.monotonic() + within
    while True:
        for host, port in nodes:
            with psycopg.connect(
                host=host, port=port, user="postgres", dbname="postgres", autocommit=True
            ) as c:
                row = c.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                if row and row[0] > 0:
                    return
        if time.monotonic() > deadline:
            pytest.fail(f"no claim waited on the move's lock within {within:g} s")
        await asyncio.sleep(0.02)


async def test_a_tenant_whose_shard_is_moving_holds_back_no_other_tenant(
    citus_url: str, citus_schema: str
) -> None:
    shards, nodes = shard_group(citus_url, citus_schema, "moving")
    beside = other_shard_tenants(citus_url, citus_schema, "moving", 6)
    pool = db.make_pool(
        citus_url,
        max_size=ClaimBatcher.connections(),
        lock_timeout=0.5,
        statement_timeout=30,
        schema=citus_schema,
    )
    await pool.open(wait=True)
    batcher = ClaimBatcher(Ledger(pool), deadline=1.0)
    holders: list[psycopg.Connection[Any]] = []
    try:
        assert (await batcher.topology()).claims_routed
        # The move's lock, on every worker node, held until the test lets go.
        for host, port in nodes:
            h = psycopg.connect(host=host, port=port, user="postgres", dbname="postgres")
            h.execute("SELECT lock_shard_metadata(7, %s::bigint[])", (shards,))
            holders.append(h)
        held = asyncio.create_task(batcher.claim([(delivery("moving", "m-1"), [effect("m-1")])]))
        # Sent once the moving tenant's claim waits on a node for the move's lock.
        await wait_for_lock_waiter(nodes)
        # The other tenants' claims, sent while the moving tenant's call waits: none may wait for it.
        started = time.monotonic()
        answers = await asyncio.gather(
            *(batcher.claim([(delivery(t, f"{t}-1"), [effect(f"{t}-1")])]) for t in beside),
            return_exceptions=True,
        )
        took = time.monotonic() - started
        assert not held.done(), "the moving tenant's claim was answered while its shard was held"
        assert all(isinstance(a, list) and isinstance(a[0][0], Accepted) for a in answers), answers
        assert took < 1.0, took
        # The move ends: the claim that waited for it is written, not refused.
        for h in holders:
            h.rollback()
        [[outcome]] = await asyncio.wait_for(held, 10)
        assert isinstance(outcome, Accepted)
    finally:
        for h in holders:
            h.close()
        await batcher.close()
        await pool.close()
