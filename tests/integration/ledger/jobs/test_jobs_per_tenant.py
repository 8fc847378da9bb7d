"""Leasing and fenced writes one tenant at a time (the Citus path), run on one node so CI covers it.

On Citus the worker leases per tenant and writes each batch per tenant (deploy/README.md, "Past one Postgres");
`make citus-check` runs that on a cluster. Here the same calls on plain Postgres must give the answers the
one-statement path gives: the earliest due jobs, every tenant's, each fenced by its own token.
"""

from __future__ import annotations

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.cluster import topology
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.jobs import heartbeats
from effectgate.ledger.vocabulary import JobState
from tests.integration.jobs_and_workers import claim, later
from tests.topologies import ROUTED_ON_ONE_NODE

pytestmark = pytest.mark.anyio


async def test_one_node_is_not_distributed(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        assert (await topology.read(conn)).distributed is False


async def test_a_per_tenant_fetch_leases_the_earliest_due_jobs_of_every_tenant(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        # Claimed in time order: a1, b1, c1, a2, b2, c2 (the clock passed in, one second apart).
        ids = {}
        for n, (tenant, key) in enumerate((t, f"{t}-{i}") for i in (1, 2) for t in ("a", "b", "c")):
            ids[key] = await claim(conn, key, tenant=tenant, now=later(n - 60))
        assert await jobs.tenants_due(conn, kinds={"k": 30.0}, limit=4, topology=ROUTED_ON_ONE_NODE) == [
            "a",
            "b",
            "c",
        ]
        leases = await jobs.fetch_and_lease(
            conn, owner="w", kinds={"k": 30.0}, limit=4, topology=ROUTED_ON_ONE_NODE
        )
        # Tenant a first (its earliest job is the oldest), both of its jobs, then b's two: the limit is reached.
        assert [lease.job_id for lease in leases] == [ids["a-1"], ids["a-2"], ids["b-1"], ids["b-2"]]
        assert {lease.tenant for lease in leases} == {"a", "b"}

        beat = await heartbeats.extend_leases(
            conn,
            [(lease.job_id, lease.lease_token, 30.0) for lease in leases],
            tenants=[lease.tenant for lease in leases],
        )
        assert set(beat.held) == {lease.job_id for lease in leases} and not beat.busy

        # One stale token among them: that row alone changes nothing, the others finish, answers in order.
        finishes = [
            jobs.Finish(
                lease.job_id,
                lease.lease_token + (1 if n == 1 else 0),
                JobState.SUCCEEDED,
                "w",
                tenant=lease.tenant,
            )
            for n, lease in enumerate(leases)
        ]
        answers = await jobs.finish_many(conn, finishes, topology=ROUTED_ON_ONE_NODE)
        assert [a.state if isinstance(a, jobs.Reached) else a for a in answers] == [
            JobState.SUCCEEDED,
            None,
            JobState.SUCCEEDED,
            JobState.SUCCEEDED,
        ]
        given_up = await heartbeats.abandon_leases(
            conn, [(leases[1].job_id, leases[1].lease_token)], tenants=[leases[1].tenant]
        )
        assert given_up == [leases[1].job_id]


async def test_a_tenants_backlog_takes_one_place_and_a_share_of_the_batch(pool: db.Pool) -> None:
    """A hot tenant's six jobs, all older than another tenant's one: that one is found and leased in the first
    fetch of four (the earliest four due jobs are all the hot tenant's), beside three of the hot tenant's."""
    async with pool.connection() as conn:
        hot = [await claim(conn, f"hot-{n}", tenant="hot", now=later(n - 60)) for n in range(6)]
        cool = await claim(conn, "cool-1", tenant="cool", now=later(-30))
        assert await jobs.tenants_due(conn, kinds={"k": 30.0}, limit=4, topology=ROUTED_ON_ONE_NODE) == [
            "hot",
            "cool",
        ]
        leases = await jobs.fetch_and_lease(
            conn, owner="w", kinds={"k": 30.0}, limit=4, topology=ROUTED_ON_ONE_NODE
        )
        assert [lease.job_id for lease in leases] == [*hot[:2], cool, hot[2]]


async def test_a_fenced_write_with_another_tenant_changes_nothing(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        await claim(conn, "x-1", tenant="x")
        [lease] = await jobs.fetch_and_lease(
            conn, owner="w", kinds={"k": 30.0}, limit=1, topology=ROUTED_ON_ONE_NODE
        )
        with pytest.raises(LeaseLost):
            await jobs.save_checkpoint(conn, lease.job_id, lease.lease_token, {"at": 1}, tenant="not-x")
        await jobs.save_checkpoint(conn, lease.job_id, lease.lease_token, {"at": 1}, tenant="x")
