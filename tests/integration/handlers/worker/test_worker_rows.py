"""One bad row never fails its neighbours, on the worker's side: a job whose row another transaction holds
locked does not stall the heartbeats of the others (and is not taken for lost), and a job whose error record
Postgres cannot store fails only its own finish, still reaching a terminal state that says why."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError
from effectgate.ledger import db, jobs
from tests.integration import jobs_and_workers as jf
from tests.integration.jobs_and_workers import claim, job, kind, make_worker, registry, wait_for

pytestmark = pytest.mark.anyio


async def expiries(conn: db.Conn) -> dict[int, datetime]:
    rows = await (
        await conn.execute("SELECT id, lease_expires_at FROM jobs WHERE state = 'running'")
    ).fetchall()
    return {r["id"]: r["lease_expires_at"] for r in rows}


async def test_one_locked_job_row_does_not_stall_the_heartbeats_of_the_others(
    pool: db.Pool, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Ten leases, heartbeats every 0.5 s. Another connection holds one job's row lock (as a long fenced
    # write or an operator's bulk action would): the other nine must still be extended — read from the
    # database — and the locked one must not be declared lost; once released it is extended too. Before
    # SKIP LOCKED the one heartbeat statement waited on that row and extended nobody.
    caplog.set_level(logging.WARNING, logger="effectgate.worker")
    async with jf.connected(db_url) as conn:
        ids = [await claim(conn) for _ in range(10)]
    release = asyncio.Event()

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await release.wait()

    worker = make_worker(pool, registry(kind(handler, lease_ttl=1.5)), concurrency=10)
    assert await worker.fetch_and_start(10) == 10
    locked, others = ids[3], [i for i in ids if i != ids[3]]
    async with jf.connected(db_url) as holder, jf.connected(db_url) as read:
        async with holder.transaction():
            await holder.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (locked,))
            before = await expiries(read)

            async def others_extended() -> bool:
                now = await expiries(read)
                return all(now[i] > before[i] for i in others)

            await wait_for(others_extended, 20, "the nine unlocked leases to be extended")
            assert (await expiries(read))[locked] == before[locked]

        # Released (the holder committed): the next heartbeat extends it as well.
        async def locked_extended() -> bool:
            return (await expiries(read))[locked] > before[locked]

        await wait_for(locked_extended, 20, "the released lease to be extended")
    assert "worker.lease_lost" not in caplog.messages
    release.set()
    assert await worker.run_until_idle() == 0
    async with jf.connected(db_url) as conn:
        assert [(await job(conn, i))["state"] for i in ids] == ["succeeded"] * 10


class NotJson:
    def __repr__(self) -> str:
        return "NotJson()"


async def test_one_job_with_an_unstorable_error_code_fails_alone_and_its_batch_mates_finish(
    pool: db.Pool, db_url: str
) -> None:
    # Twelve slices end at once, so their finishes go in one batch. Three fail with an error record Postgres
    # cannot store (an object, a nested NUL, a lone surrogate); one retries with such a record first. Every
    # job reaches its terminal state, and the bad records say they were rewritten.
    async with jf.connected(db_url) as conn:
        ids = [await claim(conn, max_attempts=2) for _ in range(12)]
    bad: dict[int, Any] = {ids[2]: NotJson(), ids[5]: {"nested": "a\x00b"}, ids[8]: ["\udc80"]}
    retried = ids[10]
    release = asyncio.Event()

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await release.wait()
        if ctx.job_id in bad:
            error = TerminalError("declined")
            error.code = bad[ctx.job_id]  # what a careless handler might attach
            raise error
        if ctx.job_id == retried and ctx.attempt == 1:
            error = TransientError("flaky")
            error.code = NotJson()
            raise error

    worker = make_worker(pool, registry(kind(handler)), concurrency=12)
    assert await worker.fetch_and_start(12) == 12
    release.set()
    assert await worker.run_until_idle() == 1  # the retry's second attempt
    async with jf.connected(db_url) as conn:
        rows = {i: await job(conn, i) for i in ids}
        attempts = await jobs.attempts(conn, retried)
    assert {i: r["state"] for i, r in rows.items()} == {i: "failed" if i in bad else "succeeded" for i in ids}
    for i in bad:
        assert rows[i]["terminal_reason"] == "TerminalError: declined"
        assert rows[i]["last_error"]["type"] == "TerminalError"
        assert "could not be stored as it was" in rows[i]["last_error"]["unstorable"]
    assert [r["last_error"]["code"] for i, r in rows.items() if i in bad] == [
        "NotJson()",
        {"nested": "a\\x00b"},
        ["\\udc80"],
    ]
    assert [(a["outcome"], a["error_type"]) for a in attempts] == [
        ("retry", "TransientError"),
        ("succeeded", None),
    ]


class Unprintable(TerminalError):
    def __str__(self) -> str:
        raise RuntimeError("__str__ bug")


async def test_an_exception_whose_message_cannot_be_read_still_fails_its_job(
    pool: db.Pool, db_url: str
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        raise Unprintable()

    async with jf.connected(db_url) as conn:
        job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with jf.connected(db_url) as conn:
        row = await job(conn, job_id)
    assert (row["state"], row["terminal_reason"]) == ("failed", "Unprintable: <Unprintable.__str__ raised>")
    assert row["last_error"]["message"] == "<Unprintable.__str__ raised>"
