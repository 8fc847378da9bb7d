"""Fencing and leasing races on the cluster: a reclaimed lease's old token writes nothing; racing workers lease
each job of one tenant once (deploy/README.md, "Past one Postgres")."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, EffectRequest, claim_deliveries
from effectgate.ledger.cluster.topology import SINGLE_NODE
from effectgate.ledger.errors import LeaseLost, StepAlreadyRecorded
from effectgate.ledger.jobs import steps
from effectgate.ledger.jobs.finishes import Finish, finish_many
from effectgate.ledger.maintenance.rescuer import LeaseRescuer
from effectgate.ledger.maintenance.waker import PendingWaker, WakerConfig
from effectgate.ledger.vocabulary import JobState, StepStatus
from tests.topologies import CITUS

from .ledger import delivery, rows

pytestmark = pytest.mark.anyio

KIND = "fence"


async def claim(conn: db.Conn, tenant: str, key: str) -> int:
    [[outcome]] = await claim_deliveries(
        conn, [(delivery(tenant, key), [EffectRequest(key, KIND, 5, "redrive")])], topology=CITUS
    )
    assert isinstance(outcome, Accepted)
    return outcome.job_id


async def test_a_reclaimed_lease_fences_out_the_first_worker(conn: db.Conn) -> None:
    tenant = "fence-tenant"
    job_id = await claim(conn, tenant, "fence-1")
    [first] = await jobs.fetch_and_lease(conn, owner="worker-a", kinds={KIND: 30.0}, limit=1, topology=CITUS)
    assert first.job_id == job_id
    # Worker A stalls past its lease (a GC pause, a partition): the rescuer re-queues the job, B leases it.
    await conn.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE tenant = %s AND id = %s",
        (tenant, job_id),
    )
    rescued = await LeaseRescuer(topology=CITUS).run_once(conn)
    assert rescued.redriven == [job_id]
    [second] = await jobs.fetch_and_lease(conn, owner="worker-b", kinds={KIND: 30.0}, limit=1, topology=CITUS)
    # Tokens are random (never the last one + 1): a new one, not a larger one.
    assert second.job_id == job_id and second.lease_token != first.lease_token
    # A wakes up: every write under its old token is refused, on the shard.
    with pytest.raises(LeaseLost):
        await jobs.save_checkpoint(conn, job_id, first.lease_token, {"a": 1}, tenant=tenant)
    stale = Finish(job_id, first.lease_token, JobState.SUCCEEDED, "worker-a", tenant=tenant)
    assert await finish_many(conn, [stale], topology=CITUS) == [None]
    fresh = Finish(job_id, second.lease_token, JobState.SUCCEEDED, "worker-b", tenant=tenant)
    [reached] = await finish_many(conn, [fresh], topology=CITUS)
    assert reached is not None and not isinstance(reached, Exception) and reached.state == JobState.SUCCEEDED
    [job] = await rows(
        conn,
        "SELECT state::text, checkpoint, lease_token FROM jobs WHERE tenant = %s AND id = %s",
        tenant,
        job_id,
    )
    assert job == {"state": "succeeded", "checkpoint": None, "lease_token": second.lease_token}
    attempts = await rows(
        conn,
        "SELECT worker, outcome::text FROM job_attempts WHERE tenant = %s AND job_id = %s ORDER BY attempt",
        tenant,
        job_id,
    )
    assert attempts == [
        {"worker": "worker-a", "outcome": "lease_expired"},
        {"worker": "worker-b", "outcome": "succeeded"},
    ]


async def test_racing_workers_lease_each_job_of_one_tenant_once(citus_url: str, citus_schema: str) -> None:
    tenant = "race-lease"
    setup = await db.connect(citus_url, schema=citus_schema)
    async with setup:
        wanted = {await claim(setup, tenant, f"lease-{n}") for n in range(24)}
    start, connected, ready = asyncio.Event(), asyncio.Event(), [0]

    async def worker(n: int) -> list[int]:
        c = await db.connect(citus_url, schema=citus_schema)
        leased: list[int] = []
        async with c:
            ready[0] += 1
            if ready[0] == 6:
                connected.set()
            await start.wait()
            while True:
                got = await jobs.fetch_and_lease(
                    c, owner=f"w{n}", kinds={KIND: 30.0}, limit=3, topology=CITUS
                )
                if not got:
                    return leased
                leased += [lease.job_id for lease in got]

    tasks = [asyncio.create_task(worker(n)) for n in range(6)]
    # Every connection made before any fetch, so the six meet on the shard at once.
    await asyncio.wait_for(connected.wait(), 60)
    start.set()
    leased = [job for per in await asyncio.gather(*tasks) for job in per]
    counts = Counter(leased)
    assert set(counts) == wanted and max(counts.values()) == 1, counts


async def test_the_rescuer_and_the_waker_run_per_tenant_on_both_nodes(citus_url: str, conn: db.Conn) -> None:
    tenants = [f"rescue-{n}" for n in range(12)]
    ids = {t: await claim(conn, t, f"rescue-{t}") for t in tenants}
    leased = await jobs.fetch_and_lease(conn, owner="gone", kinds={KIND: 30.0}, limit=12, topology=CITUS)
    assert {lease.job_id for lease in leased} == set(ids.values())
    # The worker that held them died: every lease ran out.
    await conn.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE tenant = ANY(%s) AND state = 'running'",
        (tenants,),
    )
    nodes = await rows(
        conn,
        "SELECT DISTINCT s.nodeport FROM citus_shards s WHERE s.table_name = 'jobs'::regclass"
        " AND s.shardid = ANY(ARRAY(SELECT get_shard_id_for_distribution_column('jobs', t) FROM unnest(%s::text[]) t))",
        tenants,
    )
    assert len(nodes) >= 2, nodes  # the tenants' jobs sit on more than one worker node
    listener = await db.connect(citus_url)
    async with listener:
        await listener.execute("LISTEN effectgate_jobs")
        result = await LeaseRescuer(topology=CITUS).run_once(conn)
        assert sorted(result.redriven) == sorted(ids.values())
        heard = [n.payload async for n in listener.notifies(timeout=2.0, stop_after=1)]
        assert heard == [KIND]
    # A second pass finds nothing: each lease was rescued once.
    assert (await LeaseRescuer(topology=CITUS).run_once(conn)).repaired == []
    states = await rows(
        conn, "SELECT state::text, count(*) AS n FROM jobs WHERE tenant = ANY(%s) GROUP BY 1", tenants
    )
    assert states == [{"state": "pending", "n": 12}]
    # Pending past a (tiny) TTL: the waker wakes them, tenant by tenant.
    await conn.execute(
        "UPDATE jobs SET run_at = now() - interval '1 hour', updated_at = now() - interval '1 hour'"
        " WHERE tenant = ANY(%s)",
        (tenants,),
    )
    woken = await PendingWaker(WakerConfig(pending_ttl=60.0), topology=CITUS).run_once(conn)
    assert woken.woken >= 12
    assert (await PendingWaker(WakerConfig(pending_ttl=60.0), topology=CITUS).run_once(conn)).woken == 0


async def test_a_retry_due_at_once_wakes_the_coordinators_listeners(citus_url: str, conn: db.Conn) -> None:
    tenant, kind = "retry-wake", "retry-wake"  # a kind of its own: other tests leave fence jobs due
    for n, distributed in enumerate((False, True)):
        [[claimed]] = await claim_deliveries(
            conn,
            [(delivery(tenant, f"retry-wake-{n}"), [EffectRequest(f"retry-wake-{n}", kind, 5, "redrive")])],
            topology=CITUS,
        )
        assert isinstance(claimed, Accepted)
        job_id = claimed.job_id
        [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={kind: 30.0}, limit=1, topology=CITUS)
        assert lease.job_id == job_id
        listener = await db.connect(citus_url)
        async with listener:
            await listener.execute("LISTEN effectgate_jobs")
            reached = await jobs.retry(
                conn,
                job_id,
                lease.lease_token,
                delay=0.0,
                error={"type": "E"},
                tenant=tenant,
                topology=CITUS if distributed else SINGLE_NODE,
            )
            assert reached.state == JobState.PENDING
            heard = [x.payload async for x in listener.notifies(timeout=1.5, stop_after=1)]
        # The statement alone runs on the tenant's worker node: its own NOTIFY fires there, unheard. With
        # Distributed, the wake-up is sent again from the coordinator.
        assert heard == ([kind] if distributed else []), (distributed, heard)
        # Leave nothing due for the next round's fetch.
        [again] = await jobs.fetch_and_lease(conn, owner="w", kinds={kind: 30.0}, limit=1, topology=CITUS)
        done = Finish(again.job_id, again.lease_token, JobState.SUCCEEDED, "w", tenant=tenant)
        assert (await finish_many(conn, [done], topology=CITUS))[0] is not None


async def test_a_steps_write_on_the_cluster_is_fenced_and_recorded_once(conn: db.Conn) -> None:
    tenant = kind = "step-fence"  # a kind of its own: other tests leave fence jobs due
    [[claimed]] = await claim_deliveries(
        conn,
        [(delivery(tenant, "step-fence-1"), [EffectRequest("step-fence-1", kind, 5, "redrive")])],
        topology=CITUS,
    )
    assert isinstance(claimed, Accepted)
    job_id = claimed.job_id
    [first] = await jobs.fetch_and_lease(conn, owner="a", kinds={kind: 30.0}, limit=1, topology=CITUS)
    assert first.job_id == job_id
    step = {"job_id": job_id, "tenant": tenant, "name": "charge", "idempotency_key": "k", "topology": CITUS}
    await steps.mark_started(conn, lease_token=first.lease_token, **step)
    await steps.record(
        conn, lease_token=first.lease_token, status=StepStatus.SUCCEEDED, result={"id": 1}, **step
    )
    with pytest.raises(StepAlreadyRecorded):
        await steps.record(
            conn, lease_token=first.lease_token, status=StepStatus.SUCCEEDED, result={"id": 2}, **step
        )
    await conn.execute(
        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE tenant = %s AND id = %s",
        (tenant, job_id),
    )
    assert (await LeaseRescuer(topology=CITUS).run_once(conn)).redriven == [job_id]
    with pytest.raises(LeaseLost):
        await steps.mark_started(conn, lease_token=first.lease_token, **{**step, "name": "ship"})
    recorded = await steps.for_effect(conn, first.effect_id, tenant=tenant)
    assert {n: (r.status, r.result) for n, r in recorded.items()} == {
        "charge": (StepStatus.SUCCEEDED, {"id": 1})
    }
