"""Invariant 5: a worker that lost its lease cannot write. Every acquisition is a new token; every write
after a claim matches id and token; a stale one changes nothing and raises ``LeaseLost``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg import errors as pg_errors

from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.jobs import heartbeats, steps
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration.jobs_and_workers import at, claim, connected, job, lease_one, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def snapshot(conn: db.Conn, job_id: int) -> dict[str, Any]:
    """Everything a stale write could touch."""
    row = await (await conn.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))).fetchone()
    attempts = await jobs.attempts(conn, job_id)
    recorded = await (await conn.execute("SELECT * FROM steps ORDER BY name")).fetchall()
    mirror = await (await conn.execute("SELECT * FROM mirror ORDER BY note")).fetchall()
    return {"job": row, "attempts": attempts, "steps": recorded, "mirror": mirror}


async def reclaim(conn: db.Conn, *, expire_after: float, owner: str = "w2") -> jobs.Lease:
    """The first lease expires, the reconciler re-queues the job and another worker leases it."""
    result = await Reconciler().run_once(conn, now=at(expire_after))
    assert len(result.redriven) == 1
    return await lease_one(conn, owner=owner, now=at(expire_after + 1))


async def test_every_acquisition_gets_a_new_token_and_opens_an_attempt(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    tokens = []
    first = await lease_one(conn, ttl=10, now=at(0))
    tokens.append(first.lease_token)
    second = await reclaim(conn, expire_after=11)
    tokens.append(second.lease_token)
    await jobs.hand_back(conn, job_id, second.lease_token, poison_threshold=3, by="w2", now=at(13))
    third = await lease_one(conn, owner="w3", now=at(14))
    tokens.append(third.lease_token)
    assert len(set(tokens)) == 3 and all(0 < t < 2**62 + 1 for t in tokens)
    attempts = await jobs.attempts(conn, job_id)
    assert [(a["lease_token"], a["worker"], a["outcome"]) for a in attempts] == [
        (tokens[0], "w1", "lease_expired"),
        (tokens[1], "w2", "handed_back"),
        (tokens[2], "w3", None),
    ]


async def test_a_stale_worker_changes_nothing_and_gets_lease_lost(conn: db.Conn) -> None:
    await conn.execute("CREATE TABLE mirror (note text)")
    job_id = await claim(conn, now=at(0))
    stale = await lease_one(conn, ttl=10, now=at(0))
    current = await reclaim(conn, expire_after=11)
    assert current.lease_token != stale.lease_token
    await jobs.save_checkpoint(conn, job_id, current.lease_token, {"at": "current"}, now=at(12))
    before = await snapshot(conn, job_id)

    token = stale.lease_token
    writes = {
        "heartbeat": heartbeats.extend_lease(conn, job_id, token, ttl=10, now=at(13)),
        "checkpoint": jobs.save_checkpoint(conn, job_id, token, {"at": "stale"}, now=at(13)),
        "step": steps.record(
            conn, job_id=job_id, lease_token=token, name="charge", idempotency_key="k", status="succeeded"
        ),
        "finish": jobs.finish(conn, job_id, token, state="succeeded", by="w1", now=at(13)),
        "fail": jobs.finish(conn, job_id, token, state="failed", by="w1", error={"type": "X"}, now=at(13)),
        "retry": jobs.retry(conn, job_id, token, delay=0, error={"type": "X"}, now=at(13)),
        "hand_back": jobs.hand_back(conn, job_id, token, poison_threshold=3, by="w1", now=at(13)),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost):
            await write
        assert await snapshot(conn, job_id) == before, name

    async def mirror_write(c: db.Conn) -> None:
        await c.execute("INSERT INTO mirror VALUES ('stale')")

    with pytest.raises(LeaseLost):
        async with jobs.fenced_transaction(conn, job_id, token) as tx:
            await mirror_write(tx)
    assert await snapshot(conn, job_id) == before
    # The current holder's writes still go through.
    async with jobs.fenced_transaction(conn, job_id, current.lease_token) as tx:
        await mirror_write(tx)
    reached = await jobs.finish(conn, job_id, current.lease_token, state="succeeded", by="w2", now=at(14))
    assert reached.state == "succeeded"


async def test_a_lease_reissued_after_a_failover_lost_the_first_one_does_not_pass_the_old_holders_fence(
    conn: db.Conn,
) -> None:
    """An asynchronous standby promoted before the last WAL arrived: the job's row is back as it was before
    w1 leased it (pending, its old token, no attempt row), while w1 is alive and still holds its lease in
    memory. The next lease must not be w1's token again, or w1's writes would land on w2's run."""
    await conn.execute("CREATE TABLE mirror (note text)")
    job_id = await claim(conn, now=at(0))
    before_lease = await (await conn.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))).fetchone()
    assert before_lease is not None
    lost = await lease_one(conn, owner="w1", ttl=30, now=at(0))
    # What the promoted standby has: the row as committed before w1's lease, and none of w1's attempt.
    await conn.execute(
        "UPDATE jobs SET state = %s::job_state, lease_token = %s, lease_owner = NULL, lease_expires_at = NULL,"
        " attempt = %s, updated_at = %s WHERE id = %s",
        (
            before_lease["state"],
            before_lease["lease_token"],
            before_lease["attempt"],
            before_lease["updated_at"],
            job_id,
        ),
    )
    await conn.execute("DELETE FROM job_attempts WHERE job_id = %s", (job_id,))
    current = await lease_one(conn, owner="w2", ttl=30, now=at(1))
    assert (current.attempt, lost.attempt) == (1, 1)  # a counter would have reissued the same token here
    assert current.lease_token != lost.lease_token
    before = await snapshot(conn, job_id)
    token = lost.lease_token
    writes = {
        "heartbeat": heartbeats.extend_lease(conn, job_id, token, ttl=10, now=at(2)),
        "checkpoint": jobs.save_checkpoint(conn, job_id, token, {"at": "lost"}, now=at(2)),
        "step": steps.record(
            conn, job_id=job_id, lease_token=token, name="charge", idempotency_key="k", status="succeeded"
        ),
        "finish": jobs.finish(conn, job_id, token, state="succeeded", by="w1", now=at(2)),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost):
            await write
        assert await snapshot(conn, job_id) == before, name
    reached = await jobs.finish(conn, job_id, current.lease_token, state="succeeded", by="w2", now=at(3))
    assert reached.state == "succeeded"


async def test_a_fenced_write_that_fails_rolls_back_with_the_lease_check(conn: db.Conn) -> None:
    await conn.execute("CREATE TABLE mirror (note text)")
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    with pytest.raises(RuntimeError):
        async with jobs.fenced_transaction(conn, job_id, lease.lease_token) as tx:
            await tx.execute("INSERT INTO mirror VALUES ('half')")
            raise RuntimeError("the handler's own write failed")
    assert await scalar(conn, "SELECT count(*) FROM mirror") == 0
    # A failed fenced write is not progress: the poison counter still sees no commit.
    assert (await job(conn, job_id))["committed_since_release"] is False


async def test_a_reclaim_cannot_slip_between_a_fenced_check_and_its_commit(db_url: str) -> None:
    async with connected(db_url) as conn:
        await _reclaim_waits_for_fenced_write(db_url, conn)


async def _reclaim_waits_for_fenced_write(db_url: str, conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, ttl=10, now=at(0))
    writer = await db.connect(db_url)
    async with writer:
        entered, release = asyncio.Event(), asyncio.Event()

        async def slow_fenced_write() -> None:
            async with jobs.fenced_transaction(writer, job_id, lease.lease_token):
                entered.set()
                await release.wait()

        task = asyncio.create_task(slow_fenced_write())
        await entered.wait()
        # The lease expired meanwhile, but the worker is inside a fenced write holding the row: the
        # reconciler passes over it rather than reclaiming under the write's feet.
        skipped = await Reconciler().run_once(conn, now=at(60))
        assert skipped.redriven == [] and (await job(conn, job_id))["state"] == "running"
        release.set()
        await task
    repaired = await Reconciler().run_once(conn, now=at(61))
    assert repaired.redriven == [job_id]


async def test_a_reclaimed_job_resumes_from_the_last_committed_checkpoint(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    first = await lease_one(conn, ttl=10, now=at(0))
    assert first.checkpoint is None
    await jobs.save_checkpoint(conn, job_id, first.lease_token, {"done": 1}, now=at(1))
    await jobs.save_checkpoint(conn, job_id, first.lease_token, {"done": 2}, now=at(2))
    second = await reclaim(conn, expire_after=20)
    assert second.checkpoint == {"done": 2}
    assert (await job(conn, job_id))["checkpoint"] == {"done": 2}


async def test_each_kind_is_leased_for_its_own_ttl(conn: db.Conn) -> None:
    short = await claim(conn, kind="short", now=at(0))
    long = await claim(conn, kind="long", now=at(0))
    leases = await jobs.fetch_and_lease(conn, owner="w", kinds={"short": 5, "long": 120}, limit=10, now=at(0))
    assert {lease.job_id for lease in leases} == {short, long}
    # One short-TTL kind must not shorten the other's lease: its heartbeats come at a third of 120 s.
    assert (await job(conn, short))["lease_expires_at"] == at(5)
    assert (await job(conn, long))["lease_expires_at"] == at(120)


async def test_fetch_takes_only_due_jobs_of_the_kinds_asked_for(conn: db.Conn) -> None:
    mine = await claim(conn, kind="mine", now=at(0))
    await claim(conn, kind="theirs", now=at(0))
    assert await jobs.fetch_and_lease(conn, owner="w", kinds={"mine": 5}, limit=10, now=at(-1)) == []
    [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={"mine": 5}, limit=10, now=at(0))
    assert lease.job_id == mine
    assert await jobs.fetch_and_lease(conn, owner="w", kinds={"mine": 5}, limit=10, now=at(1)) == []


async def test_concurrent_fetchers_never_lease_one_job_twice(db_url: str) -> None:
    async with connected(db_url) as conn:
        ids = {await claim(conn, now=at(0)) for _ in range(40)}
    conns = [await db.connect(db_url) for _ in range(6)]
    try:
        batches = await asyncio.gather(
            *(
                jobs.fetch_and_lease(c, owner=f"w{i}", kinds={"k": 30}, limit=10, now=at(0))
                for i, c in enumerate(conns)
            )
        )
    finally:
        for c in conns:
            await c.close()
    leased = [lease.job_id for batch in batches for lease in batch]
    assert len(leased) == len(set(leased))
    assert set(leased) <= ids
    assert len({lease.lease_token for batch in batches for lease in batch}) == len(leased)


async def test_a_step_is_recorded_once_per_effect(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    record: dict[str, Any] = {
        "job_id": job_id,
        "lease_token": lease.lease_token,
        "name": "charge",
        "idempotency_key": "k",
    }
    await steps.record(conn, **record, status="succeeded", result={"id": "ch_1"})
    with pytest.raises(Exception, match="already recorded"):
        await steps.record(conn, **record, status="succeeded", result={"id": "ch_2"})
    recorded = await steps.for_effect(conn, lease.effect_id)
    assert recorded["charge"].result == {"id": "ch_1"}


async def test_the_running_lock_key_index_exists(conn: db.Conn) -> None:
    a = await claim(conn, now=at(0))
    b = await claim(conn, now=at(0))
    for job_id in (a, b):
        await conn.execute("UPDATE jobs SET lock_key = 'order-1' WHERE id = %s", (job_id,))
    await conn.execute("UPDATE jobs SET state = 'running' WHERE id = %s", (a,))
    with pytest.raises(pg_errors.UniqueViolation, match="jobs_lock_key_running_unique"):
        await conn.execute("UPDATE jobs SET state = 'running' WHERE id = %s", (b,))
