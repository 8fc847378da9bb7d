"""A hot tenant on the cluster (issue 41, part 2): a tenant with 10^5 due jobs, older than anyone else's, neither
slows its shard-neighbours' fetch nor keeps them out of a worker's batch.

Run by `make citus-check` against ``CITUS_URL`` (deploy/README.md, "Past one Postgres"). A schema of its own: the
hot tenant's backlog would otherwise sit at the head of every other test's fetch. Asserted on plans and rows read,
never on time; tests/citus/hot_tenant_bench.py measures the neighbour's fetch time.

Before the distribution made jobs_tenant_kind_due_idx, a neighbour's fetch walked the hot tenant's rows on
jobs_kind_due_tenant_idx (kind, run_at, id) and discarded them (100,000 rows removed by its filter); and before the
fair discovery, a fetch of 10 found only the hot tenant (the tenants of the earliest 10 due jobs) and leased none of
the neighbours' jobs until its backlog drained.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import leases
from effectgate.ledger.queries import Q
from tests.topologies import CITUS

from .hot_tenant import HOT, KIND, TTL, claim, hot_backlog, nodes, shard_of, tenants
from .ledger import own_ledger_fixtures

pytestmark = pytest.mark.anyio

BACKLOG = 100_000


own_schema, conn = own_ledger_fixtures("hot")


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    return {}


async def setup(conn: db.Conn, world: dict[str, Any]) -> dict[str, Any]:
    """Once per module: the hot tenant's backlog (due an hour ago), then three jobs of its neighbour and two of
    a tenant in another shard, claimed now; every job is due at a clock a minute ahead."""
    if world:
        return world
    near, far = await tenants(conn)
    row = await (await conn.execute("SELECT now() AS now")).fetchone()
    assert row is not None
    now: datetime = row["now"]
    await hot_backlog(conn, HOT, BACKLOG, now - timedelta(hours=1))
    world.update(
        near=near,
        far=far,
        later=now + timedelta(minutes=1),
        near_jobs={await claim(conn, near, f"{near}-{i}") for i in range(3)},
        far_jobs={await claim(conn, far, f"{far}-{i}") for i in range(2)},
    )
    return world


async def test_a_neighbours_fetch_reads_only_its_own_rows_beside_a_hot_tenant(
    conn: db.Conn, world: dict[str, Any]
) -> None:
    w = await setup(conn, world)
    params = {
        "tenant": w["near"],
        "hooked": [],
        "owner": "plan",
        "kinds": [KIND],
        "ttls": [TTL],
        "limit": 10,
        "scan_limit": jobs.FETCH_SCAN_LIMIT,
        "now": w["later"],
    }
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + leases._ROUTED_FETCH,  # type: ignore[operator]
            params,
        )
        row = await cur.fetchone()
    assert row is not None
    plan = next(iter(row.values()))
    text = json.dumps(plan)
    # Index names on a shard end in its shard id.
    walks = [n for n in nodes(plan) if n.get("Index Name", "").startswith("jobs_tenant_kind_due_idx_")]
    print("neighbour's walks:", [(n["Node Type"], n["Actual Rows"], n["Actual Loops"]) for n in walks])
    # The walk is on the tenant-keyed index, and it reads the neighbour's three rows and nothing of the hot tenant's.
    assert walks, text
    assert all(n["Actual Rows"] <= 3 and n.get("Rows Removed by Filter", 0) == 0 for n in walks), walks
    # Its index condition starts with the tenant, and it touches a few pages: the hot tenant's 10^5 entries span
    # hundreds (a plan that filters the tenant inside a whole index scan removes no rows but reads every page).
    assert all(n["Index Cond"].lstrip("(").startswith("tenant = ") for n in walks), walks
    assert all(n["Shared Hit Blocks"] + n["Shared Read Blocks"] <= 4 * n["Actual Loops"] for n in walks), (
        walks
    )
    assert not [n for n in nodes(plan) if n.get("Index Name", "").startswith("jobs_kind_due_tenant_idx")], (
        text
    )
    assert max(n.get("Rows Removed by Filter", 0) for n in nodes(plan)) < 10, text


async def test_the_fair_discovery_steps_over_the_hot_tenants_rows(
    conn: db.Conn, world: dict[str, Any]
) -> None:
    """One shard's fair read, run on the node that holds the hot tenant's shard: the hot tenant's backlog costs
    it one index probe, not 10^5 rows (EXPLAIN ANALYZE there: no node of its plan returns or removes more than a
    handful of rows)."""
    w = await setup(conn, world)
    shard = await shard_of(conn, HOT)
    row = await (
        await conn.execute(
            "SELECT format(%(cmd)s, shard_name('jobs'::regclass, %(shard)s), NULL,"
            " jsonb_build_object('kinds', ARRAY[%(kind)s], 'limit', 10, 'now', %(now)s::timestamptz)::text) AS cmd,"
            " n.nodename, n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid"
            " WHERE p.shardid = %(shard)s",
            {"cmd": Q["job_tenants_due_on_shard"], "shard": shard, "kind": KIND, "now": w["later"]},
        )
    ).fetchone()
    assert row is not None
    search_path = (await (await conn.execute("SHOW search_path")).fetchone() or {}).get("search_path")
    async with await psycopg.AsyncConnection.connect(
        host=row["nodename"], port=row["nodeport"], user="postgres", dbname=conn.info.dbname, autocommit=True
    ) as node:
        await node.execute(f"SET search_path TO {search_path}")  # type: ignore[arg-type]
        found = await (await node.execute(row["cmd"])).fetchall()
        [(plan,)] = await (
            await node.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + row["cmd"])
        ).fetchall()
    assert [r[0] for r in found] == [HOT, w["near"]]
    print(
        "fair read:",
        [(n["Node Type"], n.get("Index Name"), n["Actual Rows"], n["Actual Loops"]) for n in nodes(plan)],
    )
    assert max(n["Actual Rows"] for n in nodes(plan)) <= 3, plan
    assert max(n.get("Rows Removed by Filter", 0) for n in nodes(plan)) == 0, plan
    assert not [n for n in nodes(plan) if n["Node Type"] == "Sort" and n.get("Actual Rows", 0) > 3], plan


async def test_a_neighbours_jobs_are_leased_in_the_first_fetch_beside_a_hot_tenant(
    conn: db.Conn, world: dict[str, Any]
) -> None:
    w = await setup(conn, world)
    assert await jobs.tenants_due(conn, kinds={KIND: TTL}, limit=10, now=w["later"], topology=CITUS) == [
        HOT,
        w["near"],
        w["far"],
    ]
    leases = await jobs.fetch_and_lease(
        conn, owner="hot-test", kinds={KIND: TTL}, limit=10, now=w["later"], topology=CITUS
    )
    leased = {lease.job_id for lease in leases}
    # Every neighbour's job in the first fetch, the rest of the batch from the hot tenant's backlog.
    assert w["near_jobs"] | w["far_jobs"] <= leased, leases
    assert len(leases) == 10 and sum(lease.tenant == HOT for lease in leases) == 5
