"""Recorded steps (invariant 7): a step runs once per (effect, name); later attempts read its record."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, StepAlreadyRun, TerminalError, TransientError
from effectgate.handlers.idempotency import idempotency_key
from effectgate.ledger import db, jobs, reports
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry

pytestmark = pytest.mark.anyio


async def steps_of(conn: db.Conn) -> list[dict[str, Any]]:
    return await (
        await conn.execute("SELECT name, status, result, error, idempotency_key FROM steps")
    ).fetchall()


async def test_a_recorded_step_is_not_called_again_on_the_next_attempt(db_url: str, pool: db.Pool) -> None:
    calls: list[str] = []
    attempts: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        attempts.append(ctx.attempt)

        async def charge(key: str) -> dict[str, Any]:
            calls.append(key)
            return {"charge": "ch_1"}

        assert await ctx.step("charge", charge) == {"charge": "ch_1"}
        if ctx.attempt == 1:
            raise TransientError("the shipping API blinked")

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:1", max_attempts=3)
    worker = make_worker(pool, registry(kind(handler)))
    await worker.run_until_idle()

    async with pool.connection() as conn:
        assert (await jobs.get(conn, job_id) or {})["state"] == "succeeded"
        [step] = await steps_of(conn)
    assert attempts == [1, 2]
    assert calls == [idempotency_key("default", "order:1", "charge")]
    assert step["status"] == "succeeded" and step["result"] == {"charge": "ch_1"}
    assert step["idempotency_key"] == calls[0]


async def test_a_step_that_failed_transiently_is_retried_with_the_same_key(pool: db.Pool) -> None:
    keys: list[str] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def call(key: str) -> dict[str, Any]:
            keys.append(key)
            if len(keys) < 3:
                raise TransientError("503 from downstream")
            return {"ok": True}

        await ctx.step("call", call)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:2", max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "succeeded" and job["attempt"] == 3
    # Never the attempt number or the lease token: the same key every time.
    assert len(keys) == 3 and len(set(keys)) == 1


async def test_a_terminal_step_error_is_recorded_and_raised_again_without_calling(pool: db.Pool) -> None:
    calls = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def decline(key: str) -> None:
            nonlocal calls
            calls += 1
            raise TerminalError("card declined", code="card_declined")

        await ctx.step("charge", decline)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:3")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
        assert job is not None and job["state"] == "failed"
        [step] = await steps_of(conn)
        assert step["status"] == "failed"
        assert step["error"]["code"] == "card_declined"
        # The recorded decline would be replayed, not called again: a redrive says so and needs force.
        refused = await jobs.redrive(conn, job_id, by="test")
        assert refused is not None and refused.code == "recorded_failure_requires_force"
        assert "charge (card_declined: card declined)" in refused.detail
        assert await jobs.redrive(conn, job_id, by="test", force=True) is None
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "failed"
    assert "card declined" in (job["terminal_reason"] or "")
    assert calls == 1


async def test_a_step_name_used_twice_in_one_run_fails_the_job_as_a_bug(pool: db.Pool) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def noop(key: str) -> int:
            return 1

        await ctx.step("same", noop)
        await ctx.step("same", noop)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:4", max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None
    assert (job["state"], job["attempt"], job["unrecoverable"]) == ("failed", 1, True)
    assert StepAlreadyRun.__name__ in (job["terminal_reason"] or "")


@pytest.mark.parametrize(
    "result",
    [object(), {"amount": float("nan")}, {"note": "nul\x00inside"}, ["\ud800"]],
    # Fixed ids, not repr: an object()'s repr names its address, which differs between the suite's
    # parallel workers, and they must collect the same tests.
    ids=["object", "nan", "nul", "lone-surrogate"],
)
async def test_a_result_the_ledger_cannot_record_fails_unrecoverably_without_a_second_call(
    pool: db.Pool, result: object
) -> None:
    calls = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def weird(key: str) -> object:
            nonlocal calls
            calls += 1
            return result

        await ctx.step("weird", weird)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:5", max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and (job["state"], job["unrecoverable"]) == ("failed", True)
    # Retrying could only call the downstream again and fail to record again.
    assert calls == 1


async def test_an_error_message_holding_a_nul_still_reaches_a_terminal_state(pool: db.Pool) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        raise TerminalError("downstream said: \x00\ud800 garbage")

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:7")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "failed"
    assert "\\x00" in job["last_error"]["message"]


async def test_a_handler_reads_a_steps_key_without_running_it(pool: db.Pool) -> None:
    seen: list[str] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        seen.append(ctx.idempotency_key("refund"))

    async with pool.connection() as conn:
        await claim(conn, "order:6", tenant="acme")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert seen == [idempotency_key("acme", "order:6", "refund")]
    async with pool.connection() as conn:
        assert await steps_of(conn) == []


async def test_the_effect_view_shows_each_step_with_the_key_sent(pool: db.Pool) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def capture(key: str) -> dict[str, str]:
            return {"id": "pi_1", "status": "succeeded"}

        await ctx.step("capture", capture)

    async with pool.connection() as conn:
        await claim(conn, "order:1234")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        view = await reports.effect_view(conn, "order:1234")
    assert view is not None
    [step] = view.steps
    assert step["name"] == "capture"
    assert step["idempotency_key"] == idempotency_key("default", "order:1234", "capture")
    assert step["result"] == {"id": "pi_1", "status": "succeeded"}
    assert [a["outcome"] for a in view.attempts] == ["succeeded"]
    assert len(view.deliveries) == 1


async def test_a_connection_lost_before_the_terminal_transition_is_retried_not_left_to_expiry(
    db_url: str, pool: db.Pool
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        # Every other session on this database dies: the pooled connection the worker is about to
        # use for the terminal transition is gone when it tries.
        killer = await db.connect(db_url)
        async with killer:
            await killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:8")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "succeeded"
