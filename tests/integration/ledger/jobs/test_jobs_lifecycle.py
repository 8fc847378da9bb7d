"""Jobs' transitions in the ledger: hand-back and poison, cancellation, redrive and its refusal codes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import Refused, heartbeats
from tests.integration.jobs_and_workers import at, claim, connected, job, lease_one

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def test_a_hand_back_requeues_at_once_without_using_up_an_attempt(conn: db.Conn) -> None:
    job_id = await claim(conn, max_attempts=1, now=at(0))
    lease = await lease_one(conn, now=at(0))
    await jobs.save_checkpoint(conn, job_id, lease.lease_token, {"done": 1}, now=at(1))
    reached = await jobs.hand_back(conn, job_id, lease.lease_token, poison_threshold=3, by="w1", now=at(2))
    assert reached == jobs.Reached("pending", None)
    row = await job(conn, job_id)
    assert (row["run_at"], row["attempt"], row["lease_owner"], row["lease_expires_at"]) == (
        at(2),
        0,
        None,
        None,
    )
    again = await lease_one(conn, now=at(2))
    assert (again.attempt, again.checkpoint) == (1, {"done": 1})


async def test_hand_backs_without_a_commit_park_the_job_as_poison(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    states = []
    for second in range(3):
        lease = await lease_one(conn, now=at(second))
        reached = await jobs.hand_back(
            conn, job_id, lease.lease_token, poison_threshold=3, by="w", now=at(second)
        )
        states.append(reached.state)
    assert states == ["pending", "pending", "parked"]
    row = await job(conn, job_id)
    assert row["terminal_reason"] == "poison: handed back 3 times without committing"
    assert (row["terminal_by"], row["finished_at"]) == ("w", at(2))


async def test_a_commit_between_hand_backs_resets_the_poison_count(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    states = []
    for second in range(6):
        lease = await lease_one(conn, now=at(second))
        if second == 2:
            await jobs.save_checkpoint(conn, job_id, lease.lease_token, {"progress": second}, now=at(second))
        reached = await jobs.hand_back(
            conn, job_id, lease.lease_token, poison_threshold=3, by="w", now=at(second)
        )
        states.append(reached.state)
    # Two without a commit, one with (counts as progress, resets), then three more without: parked.
    assert states == ["pending", "pending", "pending", "pending", "pending", "parked"]


async def test_a_fenced_write_counts_as_a_commit_for_poison(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    for second in range(5):
        lease = await lease_one(conn, now=at(second))
        async with jobs.fenced_transaction(conn, job_id, lease.lease_token):
            pass
        reached = await jobs.hand_back(
            conn, job_id, lease.lease_token, poison_threshold=2, by="w", now=at(second)
        )
        assert reached.state == "pending"


async def test_cancelling_a_pending_job_is_immediate(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    assert await jobs.cancel(conn, job_id, by="alice", now=at(1)) == "cancelled"
    row = await job(conn, job_id)
    assert (row["state"], row["terminal_by"], row["terminal_reason"], row["finished_at"]) == (
        "cancelled",
        "alice",
        "cancelled by operator",
        at(1),
    )
    assert await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 30}, limit=1, now=at(2)) == []
    refused = await jobs.cancel(conn, job_id, by="alice")
    assert isinstance(refused, Refused) and refused.code == "not_cancellable"
    missing = await jobs.cancel(conn, 10_000, by="alice")
    assert isinstance(missing, Refused) and missing.code == "not_found"


@pytest.mark.parametrize("ending", ["succeeded", "failed", "parked", "retry", "hand_back"])
async def test_a_cancel_on_a_running_job_wins_over_every_ending(conn: db.Conn, ending: str) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    assert await jobs.cancel(conn, job_id, by="alice", now=at(1)) == "running"
    # The worker learns of it from its next heartbeat.
    assert await heartbeats.extend_lease(conn, job_id, lease.lease_token, ttl=30, now=at(2)) is True
    token = lease.lease_token
    if ending == "retry":
        reached = await jobs.retry(conn, job_id, token, delay=0, error={"type": "X"}, now=at(3))
    elif ending == "hand_back":
        reached = await jobs.hand_back(conn, job_id, token, poison_threshold=3, by="w", now=at(3))
    else:
        state: Any = ending
        reached = await jobs.finish(conn, job_id, token, state=state, by="w", now=at(3))
    assert reached == jobs.Reached("cancelled", "cancelled while running")
    row = await job(conn, job_id)
    assert (row["state"], row["terminal_by"], row["finished_at"]) == ("cancelled", "alice", at(3))


async def test_redrive_puts_a_failed_job_back_with_fresh_attempts(conn: db.Conn) -> None:
    job_id = await claim(conn, max_attempts=2, now=at(0))
    lease = await lease_one(conn, now=at(0))
    await jobs.finish(conn, job_id, lease.lease_token, state="failed", by="w", reason="boom", now=at(1))
    assert await jobs.redrive(conn, job_id, by="test", now=at(2)) is None
    row = await job(conn, job_id)
    assert (row["state"], row["attempt"], row["run_at"], row["terminal_reason"], row["finished_at"]) == (
        "pending",
        0,
        at(2),
        None,
        None,
    )
    again = await lease_one(conn, now=at(3))
    assert again.attempt == 1 and again.lease_token != lease.lease_token


@pytest.mark.parametrize("state", ["pending", "running", "succeeded", "cancelled"])
async def test_only_failed_and_parked_jobs_can_be_redriven(conn: db.Conn, state: str) -> None:
    job_id = await claim(conn, now=at(0))
    if state != "pending":
        lease = await lease_one(conn, now=at(0))
        if state == "succeeded":
            await jobs.finish(conn, job_id, lease.lease_token, state="succeeded", by="w", now=at(1))
        elif state == "cancelled":
            await jobs.cancel(conn, job_id, by="alice", now=at(1))
            await jobs.finish(conn, job_id, lease.lease_token, state="succeeded", by="w", now=at(1))
    refused = await jobs.redrive(conn, job_id, by="test", now=at(2))
    assert isinstance(refused, Refused) and refused.code == "not_redrivable", refused
    assert (await job(conn, job_id))["state"] == state
    missing = await jobs.redrive(conn, 10_000, by="test")
    assert isinstance(missing, Refused) and missing.code == "not_found"


async def test_an_unrecoverable_failure_needs_force_to_redrive(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    await jobs.finish(conn, job_id, lease.lease_token, state="failed", by="w", unrecoverable=True, now=at(1))
    refused = await jobs.redrive(conn, job_id, by="test", now=at(2))
    assert isinstance(refused, Refused) and refused.code == "unrecoverable_requires_force"
    assert (await job(conn, job_id))["state"] == "failed"
    assert await jobs.redrive(conn, job_id, by="test", force=True, now=at(3)) is None
    row = await job(conn, job_id)
    assert (row["state"], row["unrecoverable"]) == ("pending", False)


async def test_of_many_racing_redrives_exactly_one_wins(db_url: str) -> None:
    async with connected(db_url) as conn:
        await _racing_redrives(db_url, conn)


async def _racing_redrives(db_url: str, conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    await jobs.finish(conn, job_id, lease.lease_token, state="parked", by="w", now=at(1))
    conns = [await db.connect(db_url) for _ in range(12)]
    try:
        # Each redrive holds the row between its UPDATE and its commit, so they genuinely contend.
        results = await asyncio.gather(*(jobs.redrive(c, job_id, by="test") for c in conns))
    finally:
        for c in conns:
            await c.close()
    assert results.count(None) == 1, results
    assert {r.code for r in results if r is not None} == {"not_redrivable"}
    assert (await job(conn, job_id))["state"] == "pending"


async def test_a_redrive_wakes_workers(db_url: str) -> None:
    async with connected(db_url) as conn:
        await _redrive_wakes(db_url, conn)


async def _redrive_wakes(db_url: str, conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    lease = await lease_one(conn, now=at(0))
    await jobs.finish(conn, job_id, lease.lease_token, state="failed", by="w", now=at(1))
    listener = await db.connect(db_url)
    async with listener:
        await jobs.listen(listener)
        assert await jobs.redrive(conn, job_id, by="test", now=at(2)) is None
        notes = [n async for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert [(n.channel, n.payload) for n in notes] == [("effectgate_jobs", "k")]


async def test_a_hand_back_and_an_immediate_retry_wake_other_workers(db_url: str) -> None:
    async with connected(db_url) as conn, connected(db_url) as listener:
        job_id = await claim(conn, now=at(0))
        await jobs.listen(listener)
        lease = await lease_one(conn, now=at(0))
        await jobs.hand_back(conn, job_id, lease.lease_token, poison_threshold=3, by="w", now=at(1))
        lease = await lease_one(conn, now=at(2))
        await jobs.retry(conn, job_id, lease.lease_token, delay=0, error={"type": "X"}, now=at(3))
        lease = await lease_one(conn, now=at(4))
        # A retry after a backoff is due later: a wake-up now would only find nothing to do.
        await jobs.retry(conn, job_id, lease.lease_token, delay=30, error={"type": "X"}, now=at(5))
        notes = [n.payload async for n in listener.notifies(timeout=0.5)]
    # The hand-back and the immediate retry; not the delayed one.
    assert notes == ["k", "k"]
