"""Batched heartbeats and terminal transitions: many jobs per statement, every row still fenced by its own
token. A stale row is refused on its own (``LeaseLost`` for that job alone), never the whole batch; a cancel
requested while a job ran still wins inside the statement; and a worker finishing many jobs at once runs each
kind's ``on_transition`` in the batch's transaction, a failing hook costing only its own writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, Transition
from effectgate.ledger import db, jobs
from effectgate.ledger.reconciler import Reconciler
from tests.integration import jobs_fixtures as jf
from tests.integration.jobs_fixtures import (
    at,
    claim,
    job,
    kind,
    lease_one,
    make_worker,
    module_db_url,  # noqa: F401  (single-connection tests run in a rolled-back transaction
    registry,
    rolled_back_conn,  # noqa: F401   on one database per module)
)

pytestmark = pytest.mark.anyio
pool = jf.pool


async def three_leased(conn: db.Conn) -> list[jobs.Lease]:
    for _ in range(3):
        await claim(conn, now=at(0))
    return await jobs.fetch_and_lease(conn, owner="w1", kinds={"k": 10}, limit=3, now=at(0))


async def test_a_stale_row_is_refused_alone_and_the_others_finish(conn: db.Conn) -> None:
    a, b, c = await three_leased(conn)
    # b's lease expires and another worker holds it now: w1's token for b is stale.
    await conn.execute("UPDATE jobs SET lease_expires_at = %s WHERE id <> %s", (at(100), b.job_id))
    await Reconciler().run_once(conn, now=at(11))
    b2 = await lease_one(conn, owner="w2", now=at(12))
    assert b2.job_id == b.job_id
    answers = await jobs.finish_many(
        conn,
        [
            jobs.Finish(a.job_id, a.lease_token, "succeeded", "w1"),
            jobs.Finish(b.job_id, b.lease_token, "succeeded", "w1"),
            jobs.Finish(c.job_id, c.lease_token, "failed", "w1", "boom", {"type": "E", "message": "m"}),
        ],
        now=at(13),
    )
    assert answers == [jobs.Reached("succeeded", None), None, jobs.Reached("failed", "boom")]
    assert (await job(conn, b.job_id))["state"] == "running"  # untouched: still w2's
    assert (await job(conn, b.job_id))["lease_owner"] == "w2"
    [attempt] = [x for x in await jobs.attempts(conn, c.job_id)]
    assert (attempt["outcome"], attempt["error_type"], attempt["error_message"]) == ("failed", "E", "m")


async def test_a_cancel_wins_inside_the_batch_for_its_job_only(conn: db.Conn) -> None:
    a, b, _ = await three_leased(conn)
    assert await jobs.cancel(conn, b.job_id, by="op") == "running"
    answers = await jobs.finish_many(
        conn,
        [
            jobs.Finish(a.job_id, a.lease_token, "succeeded", "w1"),
            jobs.Finish(b.job_id, b.lease_token, "succeeded", "w1"),
        ],
        now=at(2),
    )
    assert answers == [jobs.Reached("succeeded", None), jobs.Reached("cancelled", "cancelled while running")]


async def test_one_heartbeat_extends_every_held_lease_by_its_own_ttl(conn: db.Conn) -> None:
    a, b, c = await three_leased(conn)
    await jobs.cancel(conn, c.job_id, by="op")
    stale_token = b.lease_token + 7
    held = await jobs.extend_leases(
        conn,
        [(a.job_id, a.lease_token, 30), (b.job_id, stale_token, 30), (c.job_id, c.lease_token, 5)],
        now=at(3),
    )
    assert held == jobs.Extended({a.job_id: False, c.job_id: True})
    assert held.lost(b.job_id)
    assert (await job(conn, a.job_id))["lease_expires_at"] == at(33)
    assert (await job(conn, b.job_id))["lease_expires_at"] == at(10)  # stale: unchanged
    assert (await job(conn, c.job_id))["lease_expires_at"] == at(8)


async def test_finishing_together_runs_each_hook_in_the_batch_and_a_failing_one_costs_only_its_own_writes(
    pool: db.Pool, db_url: str
) -> None:
    async with jf.connected(db_url) as conn:
        await conn.execute("CREATE TABLE mirror (job_id bigint, state text)")
        good_ids = [await claim(conn, kind="good") for _ in range(6)]
        bad_ids = [await claim(conn, kind="bad") for _ in range(6)]
    release = asyncio.Event()

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await release.wait()  # every slice ends at once: their finishes queue together

    async def mirror(c: db.Conn, t: Transition) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s, %s)", (t.job_id, t.state))

    async def broken(c: db.Conn, t: Transition) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s, %s)", (t.job_id, "from a broken hook"))
        raise RuntimeError("hook bug")

    reg = registry(
        kind(handler, name="good", on_transition=mirror), kind(handler, name="bad", on_transition=broken)
    )
    worker = make_worker(pool, reg, concurrency=12)
    assert await worker.fetch_and_start(12) == 12
    release.set()
    assert await worker.run_until_idle() == 0
    async with jf.connected(db_url) as conn:
        states = {
            r["id"]: r["state"]
            for r in await (await conn.execute("SELECT id, state::text FROM jobs")).fetchall()
        }
        rows = await (await conn.execute("SELECT job_id, state FROM mirror ORDER BY job_id")).fetchall()
    assert states == dict.fromkeys(good_ids + bad_ids, "succeeded")
    assert [(r["job_id"], r["state"]) for r in rows] == [(j, "succeeded") for j in sorted(good_ids)]


async def test_concurrent_finish_batches_and_heartbeats_of_shared_jobs_never_deadlock(db_url: str) -> None:
    # Two connections, each batch naming the same 30 jobs in opposite orders, racing many times: rows are
    # locked in id order in both statements, so neither waits on the other in a cycle.
    async with jf.connected(db_url) as conn:
        for _ in range(30):
            await claim(conn)
        leases = await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 60}, limit=30)
    start = asyncio.Event()

    async def beat(order: list[jobs.Lease]) -> jobs.Extended:
        async with jf.connected(db_url) as c:
            await start.wait()
            held = jobs.Extended({})
            for _ in range(20):
                held = await jobs.extend_leases(c, [(x.job_id, x.lease_token, 60) for x in order])
            return held

    async def finish(order: list[jobs.Lease]) -> list[Any]:
        async with jf.connected(db_url) as c:
            await start.wait()
            await asyncio.sleep(0)
            return await jobs.finish_many(
                c, [jobs.Finish(x.job_id, x.lease_token, "succeeded", "w") for x in order]
            )

    tasks = [
        asyncio.create_task(beat(leases)),
        asyncio.create_task(beat(leases[::-1])),
        asyncio.create_task(finish(leases[::-1])),
    ]
    start.set()
    _, _, finished = await asyncio.gather(*tasks)
    assert finished == [jobs.Reached("succeeded", None)] * 30
