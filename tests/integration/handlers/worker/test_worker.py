"""The worker runtime against real Postgres: outcomes, recorded steps, checkpoints and hand-backs, the
transition hook, heartbeats, cancellation and a lost lease."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from effectgate.handlers import (
    HAND_BACK,
    EffectContext,
    Event,
    HandBack,
    TerminalError,
    TransientError,
    Transition,
    UnrecoverableError,
)
from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.maintenance.rescuer import LeaseRescuer
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration import jobs_and_workers as jf
from tests.integration.jobs_and_workers import claim, job, kind, later, make_worker, registry, wait_for

pytestmark = pytest.mark.anyio


async def test_a_returning_handler_succeeds_and_each_step_runs_once(pool: db.Pool, conn: db.Conn) -> None:
    calls: list[tuple[str, str]] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def charge(idem: str) -> dict[str, Any]:
            calls.append(("charge", idem))
            return {"id": "ch_1"}

        assert await ctx.step("charge", charge) == {"id": "ch_1"}
        assert ctx.idempotency_key("charge") == calls[0][1]

    job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    row = await job(conn, job_id)
    assert (row["state"], row["attempt"], row["finished_at"] is not None) == ("succeeded", 1, True)
    [attempt] = await jobs.attempts(conn, job_id)
    assert (attempt["outcome"], attempt["error_type"]) == ("succeeded", None)
    assert [name for name, _ in calls] == ["charge"]


async def test_transient_errors_retry_up_to_max_attempts_then_fail(pool: db.Pool, conn: db.Conn) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        raise TransientError(f"provider 503 on attempt {ctx.attempt}")

    job_id = await claim(conn, max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    row = await job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("failed", 3)
    assert row["terminal_reason"] == "attempts exhausted (3/3): TransientError: provider 503 on attempt 3"
    assert row["last_error"]["type"] == "TransientError"
    attempts = await jobs.attempts(conn, job_id)
    assert [(a["outcome"], a["error_type"], a["error_message"]) for a in attempts] == [
        ("retry", "TransientError", "provider 503 on attempt 1"),
        ("retry", "TransientError", "provider 503 on attempt 2"),
        ("failed", "TransientError", "provider 503 on attempt 3"),
    ]
    assert all("raise TransientError" in a["traceback"] for a in attempts)


async def test_an_unrecognised_exception_is_retried_like_a_transient_one(
    pool: db.Pool, conn: db.Conn
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        if ctx.attempt == 1:
            raise KeyError("flaky")

    job_id = await claim(conn, max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    attempts = await jobs.attempts(conn, job_id)
    assert [(a["outcome"], a["error_type"]) for a in attempts] == [("retry", "KeyError"), ("succeeded", None)]


async def test_a_terminal_error_fails_the_job_at_once(pool: db.Pool, conn: db.Conn) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        raise TerminalError("card declined", code="card_declined")

    job_id = await claim(conn, max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    row = await job(conn, job_id)
    assert (row["state"], row["attempt"], row["unrecoverable"]) == ("failed", 1, False)
    assert row["terminal_reason"] == "TerminalError: card declined"
    assert row["last_error"]["code"] == "card_declined"
    assert await jobs.redrive(conn, job_id, by="test") is None


async def test_an_unrecoverable_error_fails_and_stays_unrecoverable_on_replay(
    pool: db.Pool, conn: db.Conn
) -> None:
    calls = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def refund(idem: str) -> None:
            nonlocal calls
            calls += 1
            raise UnrecoverableError("refund exceeds the charge")

        await ctx.step("refund", refund)

    job_id = await claim(conn, max_attempts=5)
    worker = make_worker(pool, registry(kind(handler)))
    await worker.run_until_idle()
    row = await job(conn, job_id)
    assert (row["state"], row["unrecoverable"]) == ("failed", True)
    refused = await jobs.redrive(conn, job_id, by="test")
    assert isinstance(refused, jobs.Refused) and refused.code == "unrecoverable_requires_force"
    assert await jobs.redrive(conn, job_id, by="test", force=True) is None
    await worker.run_until_idle()
    # The recorded failure is replayed, not re-run, and keeps its class: a redrive still needs force.
    row = await job(conn, job_id)
    assert (row["state"], row["unrecoverable"], calls) == ("failed", True, 1)


async def test_a_recorded_step_is_not_rerun_by_a_retry(pool: db.Pool, conn: db.Conn) -> None:
    keys: list[str] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def capture(idem: str) -> str:
            keys.append(idem)
            return "captured"

        assert await ctx.step("capture", capture) == "captured"
        if ctx.attempt < 3:
            raise TransientError("shipping API down")

    job_id = await claim(conn, max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    assert len(keys) == 1


async def test_a_handler_handing_back_resumes_from_its_checkpoint(pool: db.Pool, conn: db.Conn) -> None:
    done: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> HandBack | None:
        item = (ctx.checkpoint or {"next": 0})["next"]
        done.append(item)
        await ctx.save_checkpoint({"next": item + 1})
        return HAND_BACK if item < 4 else None

    job_id = await claim(conn, max_attempts=1)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    row = await job(conn, job_id)
    # Five slices, each item once; hand-backs used up none of the single attempt.
    assert (row["state"], row["attempt"], row["checkpoint"], done) == (
        "succeeded",
        1,
        {"next": 5},
        [0, 1, 2, 3, 4],
    )
    outcomes = [a["outcome"] for a in await jobs.attempts(conn, job_id)]
    assert outcomes == ["handed_back"] * 4 + ["succeeded"]


async def test_a_handler_that_hands_back_without_committing_is_parked_as_poison(
    pool: db.Pool, conn: db.Conn
) -> None:
    seen: list[Transition] = []

    async def hook(c: db.Conn, transition: Transition) -> None:
        seen.append(transition)

    async def handler(ctx: EffectContext, ev: Event) -> HandBack:
        return HAND_BACK

    job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler, poison_threshold=2, on_transition=hook))).run_until_idle()
    row = await job(conn, job_id)
    assert (row["state"], row["terminal_reason"]) == (
        "parked",
        "poison: handed back 2 times without committing",
    )
    assert [(t.job_id, t.state) for t in seen] == [(job_id, "parked")]


async def test_the_old_budget_string_fails_the_job_instead_of_succeeding_it(
    pool: db.Pool, conn: db.Conn
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> str:
        return "budget"

    job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    row = await job(conn, job_id)
    assert row["state"] == "failed"
    assert "return effectgate.HAND_BACK" in row["terminal_reason"]


async def test_the_transition_hook_commits_in_the_terminal_transaction(
    pool: db.Pool, conn: db.Conn, db_url: str
) -> None:
    await conn.execute("CREATE TABLE mirror (job_id bigint, state text)")
    seen_inside: list[str] = []
    seen_outside: list[str] = []

    async def hook(c: db.Conn, transition: Transition) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s, %s)", (transition.job_id, transition.state))
        seen_inside.append((await job(c, transition.job_id))["state"])
        # Not committed yet: another connection still sees the job running.
        async with jf.connected(db_url) as other:
            seen_outside.append((await job(other, transition.job_id))["state"])

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler, on_transition=hook))).run_until_idle()
    assert (seen_inside, seen_outside) == (["succeeded"], ["running"])
    rows = await (await conn.execute("SELECT * FROM mirror")).fetchall()
    assert rows == [{"job_id": job_id, "state": "succeeded"}]


async def test_a_failing_transition_hook_never_leaves_the_job_running(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    await conn.execute("CREATE TABLE mirror (job_id bigint)")

    async def hook(c: db.Conn, transition: Transition) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s)", (transition.job_id,))
        raise RuntimeError("mirror is read-only")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    job_id = await claim(conn)
    with caplog.at_level(logging.ERROR, logger="effectgate.worker"):
        await make_worker(pool, registry(kind(handler, on_transition=hook))).run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    assert await jf.scalar(conn, "SELECT count(*) FROM mirror") == 0
    assert "worker.transition_hook_failed" in caplog.messages


async def test_heartbeats_keep_a_slice_longer_than_the_ttl_alive(pool: db.Pool, conn: db.Conn) -> None:
    rescued: list[int] = []
    passes: list[int] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async with db.connection(pool) as c:
            first = await jf.scalar(c, "SELECT lease_expires_at FROM jobs WHERE id = %s", ctx.job_id)
            deadline = time.monotonic() + 120
            # The slice runs until the database's own clock is a second past its first lease's expiry: only
            # the heartbeats can have kept it. A reconciler pass on the real clock at every look finds the
            # lease alive. The TTL leaves two heartbeats' slack for a starved event loop.
            while not await jf.scalar(c, "SELECT clock_timestamp() > %s + interval '1 second'", first):
                if time.monotonic() > deadline:
                    raise AssertionError("the database clock never passed the first lease's expiry")
                rescued.extend((await Reconciler().run_once(c)).redriven)
                passes.append(1)
                await asyncio.sleep(0.05)
            rescued.extend((await Reconciler().run_once(c)).redriven)
        await ctx.save_checkpoint("done")

    job_id = await claim(conn)
    await make_worker(pool, registry(kind(handler, lease_ttl=3))).run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    assert rescued == []
    assert passes


async def test_a_cancel_during_a_running_step_ends_cancelled_even_if_the_step_then_returns(
    pool: db.Pool, conn: db.Conn
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    contexts: list[EffectContext] = []
    seen: list[str] = []

    async def hook(c: db.Conn, transition: Transition) -> None:
        seen.append(transition.state)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        contexts.append(ctx)

        async def slow(idem: str) -> str:
            entered.set()
            await release.wait()
            return "done"

        await ctx.step("slow", slow)

    job_id = await claim(conn)
    worker = make_worker(pool, registry(kind(handler, lease_ttl=0.3, on_transition=hook)))
    running = asyncio.create_task(worker.run_until_idle())
    await asyncio.wait_for(entered.wait(), 5)
    assert await jobs.cancel(conn, job_id, by="alice") == "running"
    [ctx] = contexts

    async def flag_seen() -> bool:
        return ctx.cancel_requested

    await wait_for(flag_seen, 3, "the heartbeat to carry the cancel to the context")
    assert ctx.should_yield()
    release.set()  # the step completes after the cancel, and the handler returns normally
    await asyncio.wait_for(running, 5)
    row = await job(conn, job_id)
    assert (row["state"], row["terminal_by"], row["terminal_reason"]) == (
        "cancelled",
        "alice",
        "cancelled while running",
    )
    assert seen == ["cancelled"]
    [attempt] = await jobs.attempts(conn, job_id)
    assert attempt["outcome"] == "cancelled"


async def test_a_slice_whose_lease_was_taken_is_stopped_and_its_writes_refused(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    entered = asyncio.Event()
    outcome: list[str] = []
    contexts: list[EffectContext] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        contexts.append(ctx)
        entered.set()
        try:
            await asyncio.Event().wait()  # runs until the lost lease stops it
        except asyncio.CancelledError:
            outcome.append("stopped")
            raise

    job_id = await claim(conn)
    # Heartbeats come every second (a third of the TTL); nothing here waits for the lease to run out on the
    # real clock, so a starved event loop only makes the test slower, never wrong.
    worker = make_worker(pool, registry(kind(handler, lease_ttl=3)))
    with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
        running = asyncio.create_task(worker.run_until_idle())
        await asyncio.wait_for(entered.wait(), 60)
        # A partition: the reconciler thinks the lease expired and another worker takes the job.
        # The lease rescuer alone (not a whole reconciler pass, which may also make history partitions), told
        # it is a minute later. Rescue and theft commit together, so this worker's own loop never sees the job
        # pending and cannot fetch it back; its heartbeat meanwhile skips the locked row and asks again.
        async with conn.transaction():
            assert (await LeaseRescuer().run_once(conn, now=later(60))).redriven == [job_id]
            [thief] = await jobs.fetch_and_lease(conn, owner="thief", kinds={"k": 60}, limit=1)
        await asyncio.wait_for(running, 60)
    assert outcome == ["stopped"]
    [ctx] = contexts
    with pytest.raises(LeaseLost):
        await ctx.save_checkpoint("from the stale slice")
    row = await job(conn, job_id)
    assert (row["state"], row["lease_owner"], row["lease_token"], row["checkpoint"]) == (
        "running",
        "thief",
        thief.lease_token,
        None,
    )
    assert "worker.lease_lost" in caplog.messages


async def test_register_sweep_and_kind_settings_reach_the_workers_reconciler(
    pool: db.Pool, conn: db.Conn
) -> None:
    swept: list[int] = []
    parked: list[Transition] = []

    async def sweep(c: db.Conn) -> int:
        swept.append(1)
        return 1

    async def hook(c: db.Conn, transition: Transition) -> None:
        parked.append(transition)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    reg = registry(kind(handler, orphan_policy="park", on_transition=hook))
    reg.register_sweep("count", sweep)
    job_id = await claim(conn, orphan_policy="park")
    await jobs.fetch_and_lease(conn, owner="gone", kinds={"k": 30}, limit=1)
    # The pass is told it is a minute later: the 30 s lease has expired without anyone sleeping.
    result = await make_worker(pool, reg).reconcile_once(now=later(60))
    assert (result.parked, result.sweep_acted, swept) == ([job_id], {"count": 1}, [1])
    assert [(t.job_id, t.state) for t in parked] == [(job_id, "parked")]
