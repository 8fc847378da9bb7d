"""A lost worker node stops only its own tenants (issue 41): the fetch, the lease rescuer and retention go on for
the tenants on the nodes that answer, and take up the lost node's tenants again when it returns.

Run by `make citus-check` against ``CITUS_URL`` (deploy/README.md, "Past one Postgres"). It stops a worker node
of the cluster with ``pg_ctl stop -m immediate`` (as tests/citus/chaos_run.py does, so it runs as root or as the
nodes' owner) and starts it again, in a ``finally``. The ledger is a schema of its own: its retention pass runs at
a clock weeks ahead, which must not purge the rows of the other tests' schema.

Before ledger/cluster/shards.py, each of these passes began with one read over every shard, which Citus fails whole while
any node is down: the fetch below raised ``ConnectionFailure`` and leased nothing, for every tenant.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta

import pytest

from effectgate.gateway import metrics
from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, EffectRequest, claim_delivery
from effectgate.ledger.cluster import shards
from effectgate.ledger.jobs.finishes import Finish, finish_many
from effectgate.ledger.maintenance.rescuer import LeaseRescuer
from effectgate.ledger.maintenance.retention import RetentionConfig, RetentionKeeper
from effectgate.ledger.maintenance.waker import PendingWaker
from effectgate.ledger.queries import Q
from effectgate.ledger.vocabulary import JobState
from tests.prometheus import value
from tests.topologies import CITUS

from .chaos_run import node_data_dir, pg_ctl
from .ledger import delivery, own_ledger_fixtures

pytestmark = pytest.mark.anyio

KIND = "lost-node-work"
SKIPPED = "effectgate_shard_reads_skipped_total"
DONE = "lost-node-done"  # finished before the stop: retention's rows
TTL = 30.0
DAY = 86400.0


own_schema, conn = own_ledger_fixtures("lost")


async def node_of(conn: db.Conn, tenant: str) -> str:
    """The worker node holding ``tenant``'s shard of jobs, as ``host:port``."""
    row = await (
        await conn.execute(
            "SELECT nodename || ':' || nodeport AS node FROM citus_shards"
            " WHERE shardid = get_shard_id_for_distribution_column('jobs', %s::text)",
            (tenant,),
        )
    ).fetchone()
    assert row is not None
    return str(row["node"])


async def tenants_on(conn: db.Conn, healthy: str, lost: str) -> tuple[list[str], list[str]]:
    """Two tenants whose shards are on ``healthy`` and two on ``lost``."""
    on: dict[str, list[str]] = {healthy: [], lost: []}
    for n in range(200):
        tenant = f"lost-{n}"
        node = await node_of(conn, tenant)
        if node in on and len(on[node]) < 2:
            on[node].append(tenant)
        if all(len(t) == 2 for t in on.values()):
            return on[healthy], on[lost]
    raise AssertionError(f"no two tenants on each of {healthy} and {lost}: {on}")


async def claim(conn: db.Conn, tenant: str, key: str, kind: str) -> int:
    [outcome] = await claim_delivery(conn, delivery(tenant, key), [EffectRequest(key, kind, 5, "redrive")])
    assert isinstance(outcome, Accepted), outcome
    return outcome.job_id


async def clock(conn: db.Conn) -> datetime:
    row = await (await conn.execute("SELECT now() AS now")).fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


async def fetch(conn: db.Conn, kind: str, now: datetime) -> dict[int, str]:
    """The jobs of ``kind`` leased at ``now``, and their tenants."""
    leases = await jobs.fetch_and_lease(
        conn, owner="lost-node-test", kinds={kind: TTL}, limit=100, now=now, topology=CITUS
    )
    return {lease.job_id: lease.tenant for lease in leases}


async def test_a_lost_node_stops_only_its_own_tenants_and_they_resume_when_it_returns(
    conn: db.Conn, citus_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    workers = [
        f"{r['nodename']}:{r['nodeport']}"
        for r in await (
            await conn.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
                " ORDER BY nodeport"
            )
        ).fetchall()
    ]
    assert len(workers) >= 2, workers
    healthy_node, lost_node = workers[0], workers[-1]
    healthy, lost = await tenants_on(conn, healthy_node, lost_node)
    everyone = healthy + lost
    _, data_dir = node_data_dir(citus_url, lost_node)
    # A clock a minute ahead: every job claimed below is due at it.
    now = await clock(conn) + timedelta(minutes=1)

    # Retention's rows: one finished job per tenant, its payload due for purging a day after it finished.
    for tenant in everyone:
        await claim(conn, tenant, f"done-{tenant}", DONE)
    done = await jobs.fetch_and_lease(
        conn, owner="lost-node-test", kinds={DONE: TTL}, limit=100, now=now, topology=CITUS
    )
    assert sorted(lease.tenant for lease in done) == sorted(everyone)
    reached = await finish_many(
        conn,
        [
            Finish(lease.job_id, lease.lease_token, JobState.SUCCEEDED, "test", tenant=lease.tenant)
            for lease in done
        ],
        now=now,
        topology=CITUS,
    )
    assert all(r is not None and not isinstance(r, Exception) for r in reached), reached
    # The rescuer's: one job per tenant leased now, its lease expired TTL seconds on.
    first = {await claim(conn, tenant, f"first-{tenant}", KIND): tenant for tenant in everyone}
    assert await fetch(conn, KIND, now) == first
    # The fetch's: one job per tenant pending, leased at that later clock (so not yet expired at it).
    second = {await claim(conn, tenant, f"second-{tenant}", KIND): tenant for tenant in everyone}
    later = now + timedelta(seconds=TTL + 1)
    retention = RetentionKeeper(RetentionConfig(payloads=DAY), topology=CITUS)
    purge_at = now + timedelta(seconds=2 * DAY)

    counted_before = metrics.render()
    unlisten = shards.SKIPS.listen(metrics.shard_reads_skipped)  # as `serve` and `worker` do
    pg_ctl(data_dir, "-m", "immediate", "stop")
    try:
        caplog.set_level(logging.WARNING, logger="effectgate.ledger")
        started = time.monotonic()
        # The healthy node's tenants' jobs are leased, and nothing of the lost node's.
        assert await fetch(conn, KIND, later) == {j: t for j, t in second.items() if t in healthy}
        # The healthy tenants' expired leases are rescued; the lost node is named, its tenants wait.
        rescued = await LeaseRescuer(topology=CITUS).run_once(conn, now=later)
        assert sorted(rescued.redriven) == sorted(j for j, t in first.items() if t in healthy)
        assert [s.node for s in rescued.unreached] == [lost_node]
        # The waker's pass reads past the lost node too.
        await PendingWaker(topology=CITUS).run_once(conn, now=later)
        # Retention purges the healthy tenants' payloads (its counters are on the coordinator).
        purged = await retention.run_once(conn, now=purge_at)
        assert purged.purged["effects.payload"] == len(healthy)
        assert time.monotonic() - started < 30, "a lost node held the passes"
        skipped = [r for r in caplog.records if r.getMessage() == "shards.skipped"]
        # Once per pass (the fetch, the rescuer, the waker, and retention over its many reads), no traceback.
        assert [r.__dict__["pass"] for r in skipped] == [
            "fetch",
            "lease_rescuer",
            "pending_waker",
            "retention",
        ]
        assert all(r.__dict__["nodes"] == [lost_node] and r.exc_info is None for r in skipped)
        # And on /metrics, each pass once against the lost node (EffectgateCitusNodeUnreachable).
        counted = metrics.render()
        for pass_name in ("fetch", "lease_rescuer", "pending_waker", "retention"):
            grew = value(counted, SKIPPED, pass_name=pass_name, node=lost_node) - value(
                counted_before, SKIPPED, pass_name=pass_name, node=lost_node
            )
            assert grew == 1, pass_name
    finally:
        unlisten()
        if not (data_dir / "postmaster.pid").exists():
            pg_ctl(data_dir, "-l", f"{data_dir}.log", "-w", "start")

    # The node is back: its tenants simply appear again in each pass's read, on the same session.
    caplog.clear()
    rescued = await LeaseRescuer(topology=CITUS).run_once(conn, now=later)
    assert sorted(rescued.redriven) == sorted(j for j, t in first.items() if t in lost)
    assert rescued.unreached == []
    # The lost tenants' pending jobs, and every rescued job (re-queued, due again).
    assert await fetch(conn, KIND, later) == {**first, **{j: t for j, t in second.items() if t in lost}}
    purged = await retention.run_once(conn, now=purge_at)
    assert purged.purged["effects.payload"] == len(lost)
    assert not [r for r in caplog.records if r.getMessage() == "shards.skipped"]


async def test_the_fetchs_discovery_stops_after_the_batch_in_each_shards_plan(conn: db.Conn) -> None:
    """``job_tenants_due`` at 40,000 due jobs: each shard's task is a walk of an index under a Limit, with no
    Sort and no subplan (the read grouped by tenant sorted every due row of each shard, and a subquery for the
    clock or the paused kinds was a distributed subplan sent to every shard)."""
    await conn.execute(
        "INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint,"
        " first_seen_at, last_seen_at)"
        " SELECT 'plan-' || (g % 64), 'plan-' || g, 'stripe', 'h', 'e' || g, 't', 'f', now(), now()"
        " FROM generate_series(1, 40000) g"
    )
    await conn.execute(
        "INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, run_at, created_at, updated_at)"
        " SELECT id, tenant, 'plan', 5, 'redrive', now() - interval '1 hour', now(), now() FROM effects"
        " WHERE tenant LIKE 'plan-%'"
    )
    await conn.execute("ANALYZE jobs")
    cur = await conn.execute(
        "EXPLAIN (FORMAT JSON) " + Q["job_tenants_due"],  # type: ignore[operator]
        {"kinds": ["plan"], "limit": 10, "now": None},
    )
    row = await cur.fetchone()
    assert row is not None
    plan = json.dumps(next(iter(row.values())))
    assert "read_intermediate_result" not in plan, plan  # no distributed subplan
    task = plan[plan.index('"Remote Plan"') :]
    assert '"Node Type": "Limit"' in task and '"Node Type": "Sort"' not in task, task
    assert "Index" in task, task
