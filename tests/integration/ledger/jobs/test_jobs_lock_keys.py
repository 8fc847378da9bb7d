"""Lock keys: at most one running job per (tenant, lock key), enforced by a partial unique index.

A claim is never refused for a held key (the delivery must be acknowledged); later jobs with the key
wait pending, and a redrive is refused with ``lock_key_held`` while another live job has the key.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import Refused
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration.jobs_and_workers import at, claim, connected, job, lease_one

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def keyed(conn: db.Conn, lock_key: str, *, tenant: str = "default", now_s: float = 0) -> int:
    return await claim(conn, tenant=tenant, now=at(now_s), lock_key=lock_key)


async def fetch(conn: db.Conn, now_s: float, limit: int = 10) -> list[int]:
    leases = await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 30}, limit=limit, now=at(now_s))
    return [lease.job_id for lease in leases]


async def test_later_jobs_with_a_held_key_wait_pending_until_the_holder_ends(conn: db.Conn) -> None:
    first = await keyed(conn, "order-1", now_s=0)
    second = await keyed(conn, "order-1", now_s=1)
    free = await claim(conn, now=at(2))
    # One batch takes one job per key, and the job without a key alongside it.
    assert await fetch(conn, 3) == [first, free]
    assert await fetch(conn, 4) == []
    assert (await job(conn, second))["state"] == "pending"
    # The waiting job is passed over, not tripped over: it does not hold up jobs queued behind it.
    free_later = await claim(conn, now=at(5))
    assert await fetch(conn, 6) == [free_later]
    holder = await job(conn, first)
    await jobs.finish(conn, first, holder["lease_token"], state="succeeded", by="w", now=at(7))
    assert await fetch(conn, 8) == [second]


async def test_a_lock_key_is_per_tenant(conn: db.Conn) -> None:
    a = await keyed(conn, "order-1", tenant="acme")
    b = await keyed(conn, "order-1", tenant="globex")
    assert sorted(await fetch(conn, 1)) == sorted([a, b])


async def test_an_orphaned_job_keeps_its_key_until_the_reconciler_takes_it(conn: db.Conn) -> None:
    first = await keyed(conn, "order-1")
    second = await keyed(conn, "order-1", now_s=1)
    assert await fetch(conn, 2) == [first]
    # The first worker vanished and its lease expired, but nobody has repaired it yet: a step that may
    # still be running somewhere must not overlap its successor.
    assert await fetch(conn, 100) == []
    result = await Reconciler().run_once(conn, now=at(100))
    assert result.redriven == [first]
    # Re-queued, the orphan is again first in line for its key.
    assert await fetch(conn, 101) == [first]
    assert (await job(conn, second))["state"] == "pending"


async def test_a_redrive_is_refused_while_another_live_job_holds_the_key(conn: db.Conn) -> None:
    failed = await keyed(conn, "order-1")
    lease = await lease_one(conn, now=at(0))
    await jobs.finish(conn, failed, lease.lease_token, state="failed", by="w", now=at(1))
    waiting = await keyed(conn, "order-1", now_s=2)
    refused = await jobs.redrive(conn, failed, by="test", now=at(3))
    assert isinstance(refused, Refused) and refused.code == "lock_key_held"
    assert str(waiting) in refused.detail
    assert (await job(conn, failed))["state"] == "failed"
    # Once the holder is done (here: cancelled by an operator), the redrive goes through.
    assert await jobs.cancel(conn, waiting, by="alice", now=at(4)) == "cancelled"
    assert await jobs.redrive(conn, failed, by="test", now=at(5)) is None


async def test_racing_fetchers_never_run_two_jobs_of_one_key(db_url: str) -> None:
    async with connected(db_url) as conn:
        keys = [f"order-{n}" for n in range(8)]
        for round_ in range(4):
            for key in keys:
                await keyed(conn, key, now_s=round_)
        fetchers = [await db.connect(db_url) for _ in range(6)]
        try:
            batches = await asyncio.gather(
                *(
                    jobs.fetch_and_lease(c, owner=f"w{i}", kinds={"k": 30}, limit=6, now=at(10))
                    for i, c in enumerate(fetchers)
                )
            )
        finally:
            for c in fetchers:
                await c.close()
        leased = [lease for batch in batches for lease in batch]
        per_key = Counter(lease.lock_key for lease in leased)
        assert per_key and max(per_key.values()) == 1, per_key
        running = await (
            await conn.execute(
                "SELECT lock_key, count(*) AS n FROM jobs WHERE state = 'running' GROUP BY lock_key"
            )
        ).fetchall()
        assert all(r["n"] == 1 for r in running)
        assert {r["lock_key"] for r in running} == set(per_key)
