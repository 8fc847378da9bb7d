"""A finish batch leases the next jobs in its own transaction (one commit per batch instead of two): the
worker still never runs more handlers than its concurrency, and a refill that fails costs the batch nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, TerminalError
from effectgate.handlers.worker import runtime as worker_module
from effectgate.ledger import db, jobs
from tests.integration import jobs_and_workers as jf
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry, wait_for

pytestmark = pytest.mark.anyio


async def states(conn: db.Conn) -> dict[str, int]:
    rows = await (
        await conn.execute("SELECT state::text AS state, count(*) AS n FROM jobs GROUP BY 1")
    ).fetchall()
    return {r["state"]: int(r["n"]) for r in rows}


async def test_refills_and_the_run_loop_never_run_more_handlers_than_the_concurrency(
    pool: db.Pool, db_url: str
) -> None:
    # 300 jobs through a worker of 4 slots whose handlers end at different moments, so finish batches (each
    # refilling the slots it frees) race the run loop's own fetches (woken by every finished job). At no
    # instant may more than 4 handlers run, and every job must succeed once.
    async with jf.connected(db_url) as conn:
        for _ in range(300):
            await claim(conn)
    running, most, seen = 0, 0, []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        seen.append(ctx.job_id)
        for _ in range(ctx.job_id % 3):
            await asyncio.sleep(0)
        running -= 1

    refills = 0
    refill = worker_module.Worker._refill

    def counting(self: Any, conn: db.Conn, finishing: int, guarded: bool = True) -> Any:
        nonlocal refills
        refills += 1
        return refill(self, conn, finishing, guarded)

    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=4)
    worker._refill = counting.__get__(worker)  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    async with jf.connected(db_url) as conn:

        async def all_done() -> bool:
            return (await states(conn)).get("succeeded", 0) == 300

        await wait_for(all_done, 120, "the 300 jobs to succeed")
    worker.stop()
    await task
    assert most <= 4
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 300
    assert refills > 0, "no finish batch refilled its slots"


async def test_a_refill_whose_fetch_fails_still_commits_the_batchs_finishes(
    pool: db.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refill's fetch runs in the finish batch's transaction. If it fails (here: every fetch from a
    # transaction is refused by Postgres itself, a division by zero), the jobs that finished must still be
    # recorded succeeded — not rolled back with the fetch and left to lease expiry to run again.
    async with jf.connected(db_url) as conn:
        for _ in range(20):
            await claim(conn)
    fetch = jobs.fetch_and_lease

    async def refused_in_a_transaction(conn: db.Conn, **kw: Any) -> list[jobs.Lease]:
        if conn.info.transaction_status:
            async with conn.transaction():
                await conn.execute("SELECT 1 / 0")
        return await fetch(conn, **kw)

    monkeypatch.setattr(jobs, "fetch_and_lease", refused_in_a_transaction)
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        ran.append(ctx.job_id)

    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=4)
    task = asyncio.create_task(worker.run())
    async with jf.connected(db_url) as conn:

        async def all_done() -> bool:
            return (await states(conn)).get("succeeded", 0) == 20

        await wait_for(all_done, 60, "the 20 jobs to succeed")
    worker.stop()
    await task
    assert len(ran) == 20 == len(set(ran))


async def test_a_batch_whose_connection_dies_in_the_refill_is_retried_not_answered_as_written(
    pool: db.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failover's view of the same: the batch's backend is terminated while the refill's fetch runs in the
    # batch's transaction. psycopg then leaves the transaction block without an error, nothing committed: were
    # the batch answered as written, its jobs would stay running until their leases expired (and then be
    # parked by the default orphan policy). Each must instead be retried and succeed, its handler run once.
    async with jf.connected(db_url) as conn:
        for _ in range(20):
            await claim(conn)
    fetch = jobs.fetch_and_lease
    killed: list[int] = []

    async def backend_killed_in_a_transaction(conn: db.Conn, **kw: Any) -> list[jobs.Lease]:
        if conn.info.transaction_status and not killed:
            killed.append(conn.info.backend_pid)
            async with jf.connected(db_url) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s, 10000)", (killed[0],))
        return await fetch(conn, **kw)

    monkeypatch.setattr(jobs, "fetch_and_lease", backend_killed_in_a_transaction)
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        ran.append(ctx.job_id)

    worker = make_worker(pool, registry(kind(handler, orphan_policy="park")), url=db_url, concurrency=4)
    task = asyncio.create_task(worker.run())
    async with jf.connected(db_url) as conn:

        async def all_done() -> bool:
            return (await states(conn)).get("succeeded", 0) == 20

        await wait_for(all_done, 50, "the 20 jobs to succeed (a lease runs 60 s)")
    worker.stop()
    await task
    assert killed and len(ran) == 20 == len(set(ran))


async def test_a_refill_that_leased_nothing_does_not_hold_back_a_woken_fetch(
    pool: db.Pool, db_url: str
) -> None:
    # A finish batch's refill found nothing due; its transaction has yet to commit (a WAL flush: milliseconds,
    # more on a loaded disk). A job claimed meanwhile wakes the run loop, whose fetch must not wait for that
    # commit: the refill leased no slot it could race for. (It did wait: measured as ~4 ms of the wake-up.)
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        ran.append(ctx.job_id)

    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=4)
    async with jf.connected(db_url) as batch, batch.transaction():
        # Nothing is due yet: the refill leases nothing.
        async with worker._refill(batch, []) as start:
            assert start is not None
            async with jf.connected(db_url) as conn:
                job_id = await claim(conn)
            leased = await asyncio.wait_for(worker.fetch_and_start(4), 5)
            start()
            assert leased == 1
            await asyncio.wait_for(asyncio.gather(*worker._running.values()), 5)
    assert ran == [job_id]


async def test_a_finished_job_whose_slot_a_refill_offered_does_not_wake_another_fetch(
    pool: db.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One job, then nothing. Its finish batch's refill asked for jobs for its slot and found none; the run
    # loop's fetch that its end used to wake would ask again, in the same instant, for nothing — a statement
    # per finish on an idle worker, and a wake-up arriving meanwhile waited for it. A NOTIFY wakes the one
    # fetch that leases the job; no other run-loop fetch follows (polling is every 30 s here).
    fetch = jobs.fetch_and_lease
    loop_fetches = 0

    async def counted(conn: db.Conn, **kw: Any) -> list[jobs.Lease]:
        nonlocal loop_fetches
        if not conn.info.transaction_status:  # the run loop's; a refill's runs in its finish batch
            loop_fetches += 1
        return await fetch(conn, **kw)

    monkeypatch.setattr(jobs, "fetch_and_lease", counted)
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        ran.append(ctx.job_id)

    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=4, poll_interval=30)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.listening.wait(), 10)
    await asyncio.sleep(0.3)  # the fetches of the start and of the LISTEN's first wake-up
    loop_fetches = 0
    async with jf.connected(db_url) as conn:
        job_id = await claim(conn)
        await jf.wait_state(conn, job_id, "succeeded")
    await asyncio.sleep(0.5)
    worker.stop()
    await task
    assert ran == [job_id]
    assert loop_fetches == 1


async def test_a_job_claimed_while_a_full_workers_refill_is_open_runs_when_the_slot_frees(
    pool: db.Pool, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One slot, held by a job whose finish batch is open: its refill asked for jobs and found none. A job is
    # claimed before that batch commits; its NOTIFY wakes the run loop, which still counts the finishing job
    # and finds no free slot. The refill's fetch did not see that job, so its slot was not offered to it: the
    # finishing job's end must wake the run loop, not leave the new job to the poll (30 s here).
    fetch = jobs.fetch_and_lease
    claimed: list[int] = []

    async def claim_after_the_refills_fetch(conn: db.Conn, **kw: Any) -> list[jobs.Lease]:
        leases = await fetch(conn, **kw)
        if conn.info.transaction_status and not claimed:  # the refill's, in its finish batch
            # Taken before the claim: its NOTIFY may wake the run loop before claim() returns.
            claiming = time.monotonic()
            async with jf.connected(db_url) as other:
                claimed.append(await claim(other))

            async def woken() -> bool:
                return worker.last_tick is not None and worker.last_tick > claiming

            await wait_for(woken, 5, "the NOTIFY to wake the full worker's run loop")
        return leases

    monkeypatch.setattr(jobs, "fetch_and_lease", claim_after_the_refills_fetch)
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        ran.append(ctx.job_id)

    async with jf.connected(db_url) as conn:
        first = await claim(conn)
    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=1, poll_interval=30)
    task = asyncio.create_task(worker.run())
    try:
        async with jf.connected(db_url) as conn:
            await jf.wait_state(conn, first, "succeeded")
            assert claimed, "the first job's finish batch did not refill"
            await jf.wait_state(conn, claimed[0], "succeeded", within=10)
    finally:
        worker.stop()
        await task
    assert ran == [first, claimed[0]]


async def test_a_batch_postgres_refuses_is_written_again_guarded_and_only_the_refused_job_fails(
    pool: db.Pool, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A finish batch and its refill go first without savepoints (four round trips fewer). Here Postgres itself
    # refuses one job's terminal row (a trigger of the test's, SQLSTATE 22023: a row's value, as a value over
    # an index's limit would be), which aborts that whole transaction: it must be rolled back and written
    # again guarded, where the refused row is split out and stored with a stand-in reason. Every job ends
    # once: the refused one failed, its batch-mates succeeded, none ran twice.
    async with jf.connected(db_url) as conn:
        await conn.execute(
            """
            CREATE FUNCTION refuse_marked() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
            END $$;
            CREATE TRIGGER refuse_marked BEFORE UPDATE ON jobs FOR EACH ROW
                WHEN (NEW.terminal_reason LIKE '%refuse-me%') EXECUTE FUNCTION refuse_marked();
            """
        )
        ids = [await claim(conn) for _ in range(8)]
    refused = ids[3]
    release = asyncio.Event()
    ran: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await release.wait()
        ran.append(ctx.job_id)
        if ctx.job_id == refused:
            raise TerminalError("refuse-me")

    caplog.set_level(logging.INFO, logger="effectgate.worker")
    worker = make_worker(pool, registry(kind(handler)), url=db_url, concurrency=8)
    task = asyncio.create_task(worker.run())
    async with jf.connected(db_url) as conn:

        async def all_leased() -> bool:
            return (await states(conn)).get("running", 0) == 8

        await wait_for(all_leased, 60, "the 8 jobs to be leased")
        release.set()

        async def all_done() -> bool:
            return sum(n for s, n in (await states(conn)).items() if s in ("succeeded", "failed")) == 8

        await wait_for(all_done, 60, "the 8 jobs to end")
        rows = {
            r["id"]: r
            for r in await (
                await conn.execute("SELECT id, state::text AS state, terminal_reason FROM jobs")
            ).fetchall()
        }
    worker.stop()
    await task
    assert sorted(ran) == sorted(ids)
    assert {i: r["state"] for i, r in rows.items()} == {
        i: "failed" if i == refused else "succeeded" for i in ids
    }
    assert "could not be stored" in rows[refused]["terminal_reason"]
    assert "worker.finish_batch_again_guarded" in caplog.messages
