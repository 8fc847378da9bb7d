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
from effectgate.ledger.errors import LeaseBusy, LedgerError
from effectgate.ledger.jobs import heartbeats
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration import jobs_and_workers as jf
from tests.integration.jobs_and_workers import at, claim, job, kind, lease_one, make_worker, registry

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


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
    held = await heartbeats.extend_leases(
        conn,
        [(a.job_id, a.lease_token, 30), (b.job_id, stale_token, 30), (c.job_id, c.lease_token, 5)],
        now=at(3),
    )
    assert held == heartbeats.Extended({a.job_id: False, c.job_id: True})
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

    async def beat(order: list[jobs.Lease]) -> heartbeats.Extended:
        async with jf.connected(db_url) as c:
            await start.wait()
            held = heartbeats.Extended({})
            for _ in range(20):
                held = await heartbeats.extend_leases(c, [(x.job_id, x.lease_token, 60) for x in order])
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


async def test_a_heartbeat_skips_a_locked_row_reports_it_busy_not_lost_and_extends_it_once_released(
    db_url: str,
) -> None:
    # Another transaction holds one job's row (a slow fenced write, an operator's bulk action) while the
    # worker's heartbeat names all ten: the nine others are extended at once, the locked one is neither
    # extended nor lost. The heartbeat's connection would wait for ever without SKIP LOCKED; lock_timeout
    # turns that into a failure instead of a hang.
    async with jf.connected(db_url) as conn:
        for _ in range(10):
            await claim(conn, now=at(0))
        leases = await jobs.fetch_and_lease(conn, owner="w1", kinds={"k": 10}, limit=10, now=at(0))
    assert len(leases) == 10
    locked = leases[4]
    beats = [(x.job_id, x.lease_token, 30.0) for x in leases]
    async with jf.connected(db_url) as holder, jf.connected(db_url) as beat, jf.connected(db_url) as read:
        await beat.execute("SET lock_timeout = '5s'")
        async with holder.transaction():
            await holder.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (locked.job_id,))
            answer = await heartbeats.extend_leases(beat, beats, now=at(3))
            assert answer.busy == {locked.job_id}
            assert answer.held == {x.job_id: False for x in leases if x is not locked}
            assert not answer.lost(locked.job_id)
            with pytest.raises(LeaseBusy):
                await heartbeats.extend_lease(beat, locked.job_id, locked.lease_token, ttl=30, now=at(3))
            expiries = await lease_expiries(read)
            assert expiries == {x.job_id: at(10) if x is locked else at(33) for x in leases}
        answer = await heartbeats.extend_leases(beat, beats, now=at(4))
        assert (answer.held, answer.busy) == (dict.fromkeys(expiries, False), frozenset())
        assert (await lease_expiries(read))[locked.job_id] == at(34)


async def test_a_locked_row_whose_lease_the_locker_takes_is_busy_and_then_lost(db_url: str) -> None:
    # Busy means "undecided", never "held": the locker may be taking the lease (a reclaim in flight).
    async with jf.connected(db_url) as conn:
        await claim(conn, now=at(0))
        lease = await lease_one(conn, ttl=10, now=at(0))
    async with jf.connected(db_url) as holder, jf.connected(db_url) as beat:
        await beat.execute("SET lock_timeout = '5s'")  # fails rather than hangs without SKIP LOCKED
        beats = [(lease.job_id, lease.lease_token, 30.0)]
        async with holder.transaction():
            await holder.execute(
                "UPDATE jobs SET lease_token = lease_token + 1 WHERE id = %s", (lease.job_id,)
            )
            answer = await heartbeats.extend_leases(beat, beats, now=at(3))
            assert (answer.held, answer.busy) == ({}, {lease.job_id})
        answer = await heartbeats.extend_leases(beat, beats, now=at(4))
        assert (answer.held, answer.busy, answer.lost(lease.job_id)) == ({}, frozenset(), True)


async def lease_expiries(conn: db.Conn) -> dict[int, Any]:
    rows = await (await conn.execute("SELECT id, lease_expires_at FROM jobs")).fetchall()
    return {r["id"]: r["lease_expires_at"] for r in rows}


class Unserialisable:
    """A handler's error code that is not JSON."""

    def __repr__(self) -> str:
        return "Unserialisable()"


UNSTORABLE_CODES: dict[str, Any] = {
    "an object": Unserialisable(),
    "a nested NUL": {"detail": "a\x00b"},
    "a nested lone surrogate": ["\ud800"],
    "NaN": float("nan"),
    "a circular list": (lambda loop: (loop.append(loop), loop)[1])([]),
}


async def test_one_unstorable_error_record_fails_only_its_own_job_and_every_job_ends_terminal(
    conn: db.Conn,
) -> None:
    # One batch: jobs that succeeded, jobs that failed with a storable record, and one job per kind of
    # record Postgres (or json) refuses. Every one reaches its terminal state; the bad ones say why.
    n = 4 + len(UNSTORABLE_CODES)
    for _ in range(n):
        await claim(conn, now=at(0))
    leases = await jobs.fetch_and_lease(conn, owner="w1", kinds={"k": 10}, limit=n, now=at(0))
    good = [
        jobs.Finish(leases[0].job_id, leases[0].lease_token, "succeeded", "w1"),
        jobs.Finish(
            leases[1].job_id, leases[1].lease_token, "failed", "w1", "E: m", {"type": "E", "code": 7}
        ),
        jobs.Finish(leases[2].job_id, leases[2].lease_token, "succeeded", "w1"),
        jobs.Finish(leases[3].job_id, leases[3].lease_token, "parked", "w1", "poison", {"type": "P"}),
    ]
    bad = [
        jobs.Finish(
            lease.job_id,
            lease.lease_token,
            "failed",
            "w1",
            f"BadCode: {name}",
            {"type": "BadCode", "message": f"code is {name}", "code": code, "traceback": "tb"},
        )
        for lease, (name, code) in zip(leases[4:], UNSTORABLE_CODES.items(), strict=True)
    ]
    answers = await jobs.finish_many(conn, [*good, *bad], now=at(1))
    assert answers == [
        jobs.Reached("succeeded", None),
        jobs.Reached("failed", "E: m"),
        jobs.Reached("succeeded", None),
        jobs.Reached("parked", "poison"),
        *(jobs.Reached("failed", f"BadCode: {name}") for name in UNSTORABLE_CODES),
    ]
    assert (await job(conn, good[1].job_id))["last_error"] == {"type": "E", "code": 7}
    for finish, name in zip(bad, UNSTORABLE_CODES, strict=True):
        row = await job(conn, finish.job_id)
        assert row["state"] == "failed", name
        assert (row["last_error"]["type"], row["last_error"]["message"]) == ("BadCode", f"code is {name}")
        assert "could not be stored as it was" in row["last_error"]["unstorable"], name
        [attempt] = await jobs.attempts(conn, finish.job_id)
        assert (attempt["outcome"], attempt["error_type"], attempt["traceback"]) == (
            "failed",
            "BadCode",
            "tb",
        )
    codes = [(await job(conn, f.job_id))["last_error"]["code"] for f in bad]
    assert codes == ["Unserialisable()", {"detail": "a\\x00b"}, ["\\ud800"], "nan", ["<circular reference>"]]


async def test_a_row_postgres_still_refuses_is_split_out_and_ends_with_a_stand_in_record(db_url: str) -> None:
    # What no check foresees (here a trigger refusing one job's error message; in life a value over some
    # limit): the batch is split until the row stands alone, the others finish, and that job still reaches
    # its state, with a reason and record naming Postgres's refusal. Inside a caller's transaction too.
    async with jf.connected(db_url) as conn:
        await conn.execute(
            """
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.last_error ->> 'message' = 'poison' THEN
                    RAISE EXCEPTION 'value refused for job %', NEW.id USING ERRCODE = '22023';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_poison BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_poison();
            """
        )
        for _ in range(7):
            await claim(conn)
        leases = await jobs.fetch_and_lease(conn, owner="w1", kinds={"k": 60}, limit=7)
    poisoned = {leases[2].job_id, leases[5].job_id}
    batch = [
        jobs.Finish(
            x.job_id,
            x.lease_token,
            "failed",
            "w1",
            "E: poison" if x.job_id in poisoned else "E: fine",
            {"type": "E", "message": "poison" if x.job_id in poisoned else "fine"},
        )
        for x in leases
    ]
    async with jf.connected(db_url) as conn:
        answers = await jobs.finish_many(conn, batch[:4])  # autocommit
        async with conn.transaction():
            await conn.execute("CREATE TABLE caller_work (n int)")
            answers += await jobs.finish_many(conn, batch[4:])  # inside the caller's transaction
            await conn.execute("INSERT INTO caller_work VALUES (1)")
        assert await jf.scalar(conn, "SELECT count(*) FROM caller_work") == 1
        for finish, reached in zip(batch, answers, strict=True):
            assert reached is not None
            row = await job(conn, finish.job_id)
            assert (row["state"], reached.state) == ("failed", "failed")
            if finish.job_id in poisoned:
                assert reached.reason == row["terminal_reason"]
                assert row["terminal_reason"].startswith(
                    "failed; its reason or error record could not be stored"
                )
                assert "SQLSTATE 22023" in row["terminal_reason"]
                assert row["last_error"]["type"] == "UnstorableOutcome"
                assert f"value refused for job {finish.job_id}" in row["last_error"]["message"]
            else:
                assert (row["terminal_reason"], row["last_error"]) == (
                    "E: fine",
                    {"type": "E", "message": "fine"},
                )


async def test_a_row_refused_even_with_a_stand_in_gets_its_own_error_and_the_others_finish(
    db_url: str,
) -> None:
    # Postgres refuses any terminal update of one job (a trigger; in life a constraint on the job itself):
    # that job alone gets a LedgerError answer; its batch-mates, committed before and after the split, finish.
    async with jf.connected(db_url) as conn:
        for _ in range(5):
            await claim(conn)
        leases = await jobs.fetch_and_lease(conn, owner="w1", kinds={"k": 60}, limit=5)
        stuck = leases[3].job_id
        await conn.execute(
            f"""
            CREATE FUNCTION refuse_job() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.id = {stuck} AND NEW.state <> 'running' THEN
                    RAISE EXCEPTION 'job refused' USING ERRCODE = '23514';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_job BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_job();
            """
        )
        answers = await jobs.finish_many(
            conn, [jobs.Finish(x.job_id, x.lease_token, "succeeded", "w1") for x in leases]
        )
        refused = answers.pop(3)
        assert isinstance(refused, LedgerError) and "job refused" in str(refused)
        assert answers == [jobs.Reached("succeeded", None)] * 4
        assert (await job(conn, stuck))[
            "state"
        ] == "running"  # left to lease expiry, as a lost connection would
        with pytest.raises(LedgerError, match="job refused"):
            await jobs.finish(conn, stuck, leases[3].lease_token, state="succeeded", by="w1")
