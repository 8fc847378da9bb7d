"""A hot tenant's neighbour on the cluster, timed (issue 41, part 2): prints figures, asserts nothing.

    CITUS_URL=postgresql://postgres@127.0.0.1:9700/postgres python -m tests.citus.hot_tenant_bench

In a fresh schema migrated and distributed by `effectgate migrate`: a neighbour's per-tenant fetch (the statement the
worker sends on Citus, ``_ROUTED_FETCH``, in a transaction rolled back so every round leases the same jobs) timed
quiet, then beside a hot tenant with ``--backlog`` due jobs in the same shard, then the same without
jobs_tenant_kind_due_idx (the cluster as the previous release distributed it); and the fetch's discovery
(``tenants_due``) quiet and with the hot tenant. Medians of ``--rounds`` from the client, one run; the schema is
dropped at the end. tests/citus/test_hot_tenant.py asserts the plans behind these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import psycopg

from effectgate.ledger import db, jobs
from effectgate.ledger.cluster import shards
from effectgate.ledger.jobs import leases
from tests.topologies import CITUS

from .hot_tenant import HOT, KIND, TTL, claim, hot_backlog, nodes, tenants
from .ledger import distributed_ledger


async def median_ms(rounds: int, op: Callable[[], Awaitable[object]]) -> float:
    await op()  # the first one warms the node's caches and the connection's plans
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        await op()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


async def run(url: str, backlog: int, rounds: int) -> None:
    schema = f"effectgate_hotbench_{uuid.uuid4().hex[:8]}"
    await distributed_ledger(url, schema)
    try:
        conn = await db.connect(url, schema=schema)
        async with conn:
            near, _ = await tenants(conn)
            row = await (await conn.execute("SELECT now() AS now")).fetchone()
            assert row is not None
            now: datetime = row["now"]
            for i in range(3):
                await claim(conn, near, f"{near}-{i}")
            later = now + timedelta(minutes=1)
            params = {
                "tenant": near,
                "hooked": [],
                "owner": "bench",
                "kinds": [KIND],
                "ttls": [TTL],
                "limit": 10,
                "scan_limit": jobs.FETCH_SCAN_LIMIT,
                "now": later,
            }

            async def fetch() -> None:
                async with conn.transaction(force_rollback=True):
                    rows = await (await conn.execute(leases._ROUTED_FETCH, params)).fetchall()
                assert len(rows) == 3, rows

            async def walk() -> str:
                """The fetch's walk of jobs for the neighbour: index, rows returned, rows discarded."""
                async with conn.transaction(force_rollback=True):
                    cur = await conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + leases._ROUTED_FETCH, params
                    )  # type: ignore[operator]
                    row = await cur.fetchone()
                assert row is not None
                return "; ".join(
                    f"{n['Node Type']} on {n['Index Name']}: {n['Actual Rows'] * n['Actual Loops']} rows,"
                    f" {n.get('Rows Removed by Filter', 0)} removed, {n['Shared Hit Blocks'] + n['Shared Read Blocks']} buffers"
                    for n in nodes(next(iter(row.values())))
                    if n.get("Relation Name", "").startswith("jobs_") and n.get("Alias") in ("w", "j")
                )

            async def discover() -> None:
                await jobs.tenants_due(conn, kinds={KIND: TTL}, limit=10, now=later, topology=CITUS)

            quiet = await median_ms(rounds, fetch)
            quiet_due = await median_ms(rounds, discover)
            await hot_backlog(conn, HOT, backlog, now - timedelta(hours=1))
            hot = await median_ms(rounds, fetch)
            hot_walk = await walk()
            hot_due = await median_ms(rounds, discover)
            found = await jobs.tenants_due(conn, kinds={KIND: TTL}, limit=10, now=later, topology=CITUS)

            async def node_by_node() -> None:
                await shards.tenants_on_live_nodes(
                    conn,
                    "job_tenants_due_on_shard",
                    table="jobs",
                    params={"kinds": [KIND]},
                    limit=10,
                    now=later,
                )

            nodes_alone = await median_ms(rounds, node_by_node)
            await conn.execute("DROP INDEX jobs_tenant_kind_due_idx")
            without = await median_ms(rounds, fetch)
            without_walk = await walk()
        print(
            f"neighbour's fetch, median of {rounds}, 3 jobs leased (rolled back), hot tenant {backlog:,} due jobs:"
        )
        print(f"  quiet                                  {quiet:6.1f} ms")
        print(
            f"  beside the hot tenant                  {hot:6.1f} ms  ({hot / quiet:.2f}x quiet; target <= 1.5x)"
        )
        print(f"  beside it, without the tenant index    {without:6.1f} ms  ({without / quiet:.2f}x quiet)")
        print(f"  walk beside the hot tenant: {hot_walk}")
        print(f"  walk without the tenant index: {without_walk}")
        print(f"discovery (tenants_due, limit 10), median of {rounds}:")
        print(f"  quiet (one read over the shards)       {quiet_due:6.1f} ms")
        print(f"  hot tenant first (node-by-node read)   {hot_due:6.1f} ms  -> {found}")
        print(f"  of which the node-by-node read alone   {nodes_alone:6.1f} ms")
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    url = os.environ.get("CITUS_URL")
    if not url:
        raise SystemExit("set CITUS_URL to a Citus coordinator (deploy/README.md, Past one Postgres)")
    asyncio.run(run(url, args.backlog, args.rounds))


if __name__ == "__main__":
    main()
