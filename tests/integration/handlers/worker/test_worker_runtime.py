"""The worker's clocks and wake-ups: the hard per-slice deadline (a step that never returns is
abandoned), drain on stop, NOTIFY wake-ups and a LISTEN connection that is re-established."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from effectgate.handlers import HAND_BACK, EffectContext, Event, HandBack, TerminalError, TransientError
from effectgate.handlers.worker.listen import LISTEN_APPLICATION_NAME
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration.jobs_and_workers import (
    claim,
    job,
    kind,
    later,
    make_worker,
    registry,
    wait_for,
    wait_state,
)

pytestmark = pytest.mark.anyio

# Short clocks so the deadline fires in tenths of a second: abandoned at max_slice + min(5 s, lease_ttl).
DEADLINES: dict[str, Any] = {"slice_budget": 0.1, "max_slice": 0.2, "lease_ttl": 0.3}


async def stubborn_wait(done: asyncio.Future[None]) -> None:
    """Wait for ``done`` and ignore every cancellation: a step stuck where cancellation cannot reach."""
    while True:
        try:
            await asyncio.shield(done)
            return
        except asyncio.CancelledError:
            continue


class Listening(asyncio.Event):
    """The worker's ``listening`` event, counting each time a LISTEN connection is (re-)established."""

    def __init__(self) -> None:
        super().__init__()
        self.times = 0

    def set(self) -> None:
        self.times += 1
        super().set()


class FetchWatch:
    """Tells when a worker's loop has fetched since its LISTEN was last established and now waits.

    Establishing LISTEN sets the wake-up, and the loop clears it just before a fetch starts: so once a fetch
    that started after the latest LISTEN has finished and none is running, the loop is parked on the
    wake-up, and a job claimed now can only be started by a NOTIFY (or the poll).
    """

    def __init__(self, worker: Worker) -> None:
        self.listening = worker.listening = Listening()
        self.fetched_after = 0  # the LISTEN (by its count) that the last finished fetch started after
        self.in_flight = 0
        fetch = worker.fetch_and_start

        async def watched(limit: int) -> int:
            after = self.listening.times if self.listening.is_set() else 0
            self.in_flight += 1
            try:
                return await fetch(limit)
            finally:
                self.in_flight -= 1
                self.fetched_after = after

        worker.fetch_and_start = watched  # type: ignore[method-assign]

    async def waiting_on_the_wake_up(self) -> bool:
        return (
            self.listening.is_set() and self.fetched_after == self.listening.times > 0 and self.in_flight == 0
        )


def messages(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == name]


@pytest.mark.parametrize(("policy", "state"), [("redrive", "pending"), ("park", "parked")])
async def test_a_step_that_never_returns_is_abandoned_and_its_later_writes_refused(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture, policy: str, state: str
) -> None:
    after: list[str] = []
    # The step returns only when the test lets it: the slot must be free while it still blocks.
    release = threading.Event()

    async def handler(ctx: EffectContext, ev: Event) -> None:
        # A blocking call in a thread that cancellation cannot interrupt, awaited so it cannot be cancelled.
        # Its own bound only keeps a failed test from hanging the thread pool.
        await stubborn_wait(asyncio.ensure_future(asyncio.to_thread(release.wait, 120)))
        try:
            await ctx.save_checkpoint("written after the deadline")
        except LeaseLost:
            after.append("refused")
            raise

    job_id = await claim(conn, orphan_policy=policy)
    worker = make_worker(pool, registry(kind(handler, orphan_policy=policy, **DEADLINES)))
    try:
        with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
            await worker.run_until_idle()
            # The slot is free at max_slice + grace (0.2 + 0.3 s) while the step is still stuck.
            assert worker._running == {}
            assert messages(caplog, "worker.slice_overran") and messages(caplog, "worker.slice_abandoned")
            assert not messages(caplog, "worker.abandoned_step_settled")
            release.set()

            async def settled() -> bool:
                return bool(messages(caplog, "worker.abandoned_step_settled"))

            await wait_for(settled, 60, "the abandoned step to settle")
    finally:
        release.set()
    [record] = messages(caplog, "worker.abandoned_step_settled")
    outcome, error = record.outcome, record.error  # type: ignore[attr-defined]
    assert (outcome, error.startswith("LeaseLost")) == ("error", True)
    # Refused although the token is still the newest and the job still running: the slice was abandoned.
    assert after == ["refused"]
    row = await job(conn, job_id)
    assert (row["state"], row["checkpoint"]) == ("running", None)
    # No heartbeat any more: the lease expires and the reconciler takes the job by its policy.
    result = await Reconciler().run_once(conn, now=later(5))
    assert {"pending": result.redriven, "parked": result.parked}[state] == [job_id]
    assert (await job(conn, job_id))["state"] == state


async def test_a_step_that_honours_cancellation_at_the_deadline_is_retried(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        if ctx.attempt == 1:
            await asyncio.Event().wait()  # never returns: only the deadline's cancellation ends it

    job_id = await claim(conn, max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
        await make_worker(pool, registry(kind(handler, **DEADLINES))).run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    first = (await jobs.attempts(conn, job_id))[0]
    assert (first["outcome"], first["error_type"]) == ("retry", "TransientError")
    assert "exceeded max_slice" in first["error_message"]
    assert messages(caplog, "worker.slice_overran") and not messages(caplog, "worker.slice_abandoned")


async def test_a_step_that_hangs_every_time_is_parked_as_poison(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await stubborn_wait(release)

    job_id = await claim(conn, orphan_policy="redrive", max_attempts=10)
    worker = make_worker(pool, registry(kind(handler, orphan_policy="redrive", **DEADLINES)))
    states = []
    with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
        for _ in range(3):
            await worker.run_until_idle()
            await Reconciler().run_once(conn, now=later(5))
            states.append((await job(conn, job_id))["state"])
        release.set_result(None)

        async def all_settled() -> bool:
            return len(messages(caplog, "worker.abandoned_step_settled")) == 3

        await wait_for(all_settled, 5, "the three abandoned steps to settle")
    assert states == ["pending", "pending", "parked"]
    assert (await job(conn, job_id))["terminal_reason"] == "poison: orphaned 3 times without committing"
    assert len(messages(caplog, "worker.slice_abandoned")) == 3


async def test_stop_drains_slices_that_yield_and_leaves_the_rest_to_lease_expiry(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    entered: set[str] = set()
    saw_yield: list[bool] = []

    async def polite(ctx: EffectContext, ev: Event) -> HandBack | None:
        if ctx.checkpoint == "half":
            return None
        entered.add("polite")
        for _ in range(1000):  # units of work, asking at each boundary whether to stop
            if ctx.should_yield():
                break
            await asyncio.sleep(0.01)
        saw_yield.append(ctx.draining)
        await ctx.save_checkpoint("half")
        return HAND_BACK

    deaf_contexts: list[EffectContext] = []
    stopped: list[str] = []

    async def deaf(ctx: EffectContext, ev: Event) -> None:
        if ctx.checkpoint == "begun":
            return
        await ctx.save_checkpoint("begun")
        deaf_contexts.append(ctx)
        entered.add("deaf")
        try:
            for _ in range(1000):  # units of work, never asking should_yield()
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            stopped.append("deaf")
            raise

    polite_job = await claim(conn, kind="polite")
    deaf_job = await claim(conn, kind="deaf")
    reg = registry(kind(polite, name="polite", lease_ttl=0.6), kind(deaf, name="deaf", lease_ttl=0.6))
    worker = make_worker(pool, reg, concurrency=2, drain_timeout=0.3)
    running = asyncio.create_task(worker.run())

    async def both_running() -> bool:
        return entered == {"polite", "deaf"}

    with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
        await wait_for(both_running, 5, "both slices to start")
        worker.stop()
        await asyncio.wait_for(running, 5)
    assert saw_yield == [True]
    assert (await job(conn, polite_job))["state"] == "pending"  # handed back at once
    assert (await job(conn, deaf_job))["state"] == "running"  # left to lease expiry
    [drained] = messages(caplog, "worker.drain_timeout")
    assert drained.left_to_lease_expiry == [deaf_job]  # type: ignore[attr-defined]
    # The slice left behind is stopped, and fenced off although its token is still the newest.
    assert stopped == ["deaf"]
    with pytest.raises(LeaseLost):
        await deaf_contexts[0].save_checkpoint("after the drain")
    # Nothing is lost: the reconciler repairs the one left behind and the next worker finishes both.
    assert (await Reconciler().run_once(conn, now=later(10))).redriven == [deaf_job]
    await make_worker(pool, reg).run_until_idle()
    assert (await job(conn, polite_job))["state"] == "succeeded"
    assert (await job(conn, deaf_job))["state"] == "succeeded"


async def test_a_claim_wakes_a_waiting_worker_through_notify_and_after_a_lost_listen(
    pool: db.Pool, conn: db.Conn, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    # Polling once an hour: only a NOTIFY can start these jobs within the minute allowed.
    worker = make_worker(pool, registry(kind(handler)), url=db_url, poll_interval=3600.0)
    fetches = FetchWatch(worker)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.listening.wait(), 60)
        # Claimed before that fetch, the job would be found without any NOTIFY.
        await wait_for(fetches.waiting_on_the_wake_up, 60, "the worker to wait on its wake-up")
        await wait_state(conn, await claim(conn), "succeeded", within=60)

        async def listen_pids() -> list[int]:
            rows = await (
                await conn.execute(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE application_name = %s AND datname = current_database()",
                    (LISTEN_APPLICATION_NAME,),
                )
            ).fetchall()
            return [r["pid"] for r in rows]

        [old] = await listen_pids()
        with caplog.at_level(logging.WARNING, logger="effectgate.worker"):
            await conn.execute("SELECT pg_terminate_backend(%s)", (old,))

            async def relistening() -> bool:
                pids = await listen_pids()
                return worker.listening.is_set() and bool(pids) and old not in pids

            await wait_for(relistening, 60, "the LISTEN connection to be re-established")
        assert "worker.listen_lost" in caplog.messages
        await wait_for(fetches.waiting_on_the_wake_up, 60, "the worker to wait on its wake-up again")
        await wait_state(conn, await claim(conn), "succeeded", within=60)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 60)


async def test_retry_failure_and_park_lines_name_the_error_the_step_and_the_attempt(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    async def declined(idempotency_key: str) -> None:
        raise TransientError("502 from provider")

    async def flaky(ctx: EffectContext, ev: Event) -> None:
        if ctx.attempt == 1:
            await ctx.step("capture", declined)
        # Raised from the step's error, outside the step: still the capture's failure.
        try:
            await ctx.step("capture-again", declined)
        except TransientError as exc:
            raise TerminalError("card declined") from exc

    async def outside(ctx: EffectContext, ev: Event) -> None:
        raise ValueError("no order id in the payload")

    async def idle(ctx: EffectContext, ev: Event) -> HandBack:
        return HAND_BACK  # commits nothing, every time: poison after the threshold

    flaky_job = await claim(conn, kind="flaky", key="order:1")
    outside_job = await claim(conn, kind="outside", key="order:2", max_attempts=1)
    idle_job = await claim(conn, kind="idle", key="order:3")
    reg = registry(
        kind(flaky, name="flaky"), kind(outside, name="outside"), kind(idle, name="idle", poison_threshold=2)
    )
    with caplog.at_level(logging.INFO, logger="effectgate.worker"):
        await make_worker(pool, reg).run_until_idle()
    assert (await job(conn, flaky_job))["state"] == "failed"
    assert (await job(conn, idle_job))["state"] == "parked"

    def fields(record: logging.LogRecord, *names: str) -> dict[str, Any]:
        return {n: getattr(record, n) for n in names}

    keys = ("job_id", "kind", "effect_key", "attempt", "max_attempts", "step", "error_class", "error")
    [retry] = messages(caplog, "worker.retry")
    assert retry.levelno == logging.WARNING
    assert fields(retry, *keys) == {
        "job_id": flaky_job,
        "kind": "flaky",
        "effect_key": "order:1",
        "attempt": 1,
        "max_attempts": 3,
        "step": "capture",
        "error_class": "TransientError",
        "error": "502 from provider",
    }
    failed = {r.job_id: r for r in messages(caplog, "worker.failed")}  # type: ignore[attr-defined]
    assert failed[flaky_job].levelno == logging.ERROR
    assert fields(failed[flaky_job], "attempt", "step", "error_class", "error", "reason") == {
        "attempt": 2,
        "step": "capture-again",
        "error_class": "TerminalError",
        "error": "card declined",
        "reason": "TerminalError: card declined",
    }
    assert fields(failed[outside_job], "attempt", "max_attempts", "step", "error_class", "error") == {
        "attempt": 1,
        "max_attempts": 1,
        "step": None,
        "error_class": "ValueError",
        "error": "no order id in the payload",
    }
    [parked] = messages(caplog, "worker.parked")
    assert parked.levelno == logging.ERROR
    assert fields(parked, "job_id", "kind", "attempt", "reason") == {
        "job_id": idle_job,
        "kind": "idle",
        "attempt": 1,  # a hand-back is not a failed attempt
        "reason": "poison: handed back 2 times without committing",
    }


async def test_a_second_stop_hands_back_now_fenced_and_the_leases_are_reclaimable_at_once(
    pool: db.Pool, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[EffectContext] = []

    async def deaf(ctx: EffectContext, ev: Event) -> None:
        if ctx.checkpoint == "begun":
            return
        await ctx.save_checkpoint("begun")
        started.append(ctx)
        await asyncio.Event().wait()  # never asks should_yield(), never returns on its own

    first = await claim(conn, kind="deaf")
    second = await claim(conn, kind="deaf")
    reg = registry(kind(deaf, name="deaf", lease_ttl=600))
    # A drain that would wait ten minutes: only the second stop can end it in time.
    worker = make_worker(pool, reg, concurrency=2, drain_timeout=600)
    running = asyncio.create_task(worker.run())

    async def both_running() -> bool:
        return len(started) == 2

    with caplog.at_level(logging.INFO, logger="effectgate.worker"):
        await wait_for(both_running, 5, "both slices to start")
        worker.stop()
        [draining] = messages(caplog, "worker.draining")
        assert (draining.jobs, draining.kinds, draining.job_ids) == (2, {"deaf": 2}, sorted([first, second]))  # type: ignore[attr-defined]
        assert draining.drain_timeout == 600 and draining.deadline  # type: ignore[attr-defined]
        worker.stop()
        await asyncio.wait_for(running, 10)
    [now] = messages(caplog, "worker.stopping_now")
    assert now.job_ids == sorted([first, second])  # type: ignore[attr-defined]
    [abandoned] = messages(caplog, "worker.leases_abandoned")
    assert abandoned.job_ids == sorted([first, second])  # type: ignore[attr-defined]
    assert not messages(caplog, "worker.drain_timeout")
    # Fenced: the stopped slices can write nothing more, although their tokens are still the newest.
    for ctx in started:
        with pytest.raises(LeaseLost):
            await ctx.save_checkpoint("after the stop")
    # The leases expired at the stop, not in ten minutes: the next reconciler pass hands the jobs on.
    for job_id in (first, second):
        row = await job(conn, job_id)
        assert row["state"] == "running" and row["checkpoint"] == "begun"
    assert sorted((await Reconciler().run_once(conn, now=later(1))).redriven) == sorted([first, second])
