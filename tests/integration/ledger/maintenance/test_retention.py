"""Retention: every window purges exactly what has outlived it and nothing inside it; tombstones keep a late
retry a duplicate. The clock is a parameter: a pass is told it is later, nothing sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import (
    Accepted,
    Duplicate,
    Rejected,
    record_signature_failure,
)
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.maintenance import retention
from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig
from tests.integration.jobs_and_workers import scalar
from tests.integration.ledger.maintenance.retention_rows import day, deliver, effect, finished

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

NOW = datetime(2031, 1, 31, 12, 0, tzinfo=UTC)


async def count(conn: db.Conn, table: str) -> int:
    return int(await scalar(conn, f"SELECT count(*) FROM {table}"))


async def test_payloads_and_answers_go_at_their_window_and_the_key_stays_a_tombstone(conn: db.Conn) -> None:
    await finished(conn, "old", day(0))
    await finished(conn, "young", day(10))
    running = await deliver(conn, "running", day(0))
    assert isinstance(running, Accepted)
    keeper = RetentionKeeper(RetentionConfig(payloads=30 * DAY))

    inside = await keeper.run_once(conn, now=day(30) - timedelta(seconds=1))
    assert inside.purged["effects.payload"] == 0
    result = await keeper.run_once(conn, now=day(30) + timedelta(seconds=1))
    assert (result.purged["effects.payload"], result.purged["steps.answer"]) == (1, 1)

    old = await effect(conn, "old")
    assert old is not None
    assert (old["payload"], old["purged_at"], old["outcome"]) == (
        None,
        day(30) + timedelta(seconds=1),
        "succeeded",
    )
    assert (old["tenant"], old["fingerprint"], old["first_seen_at"]) == (
        "default",
        fingerprint({"key": "old", "card": "4242"}),
        day(0),
    )
    step = await (await conn.execute("SELECT * FROM steps WHERE effect_id = %s", (old["id"],))).fetchone()
    assert step is not None and (step["result"], step["status"], step["idempotency_key"]) == (
        None,
        "succeeded",
        "idem-old",
    )
    # Inside its window, and a job not finished (whatever its age): untouched.
    young, live = await effect(conn, "young"), await effect(conn, "running")
    assert young is not None and young["payload"] is not None
    assert live is not None and live["payload"] is not None
    assert (await keeper.run_once(conn, now=day(30) + timedelta(seconds=2))).changed is False


async def test_a_late_retry_after_the_payload_purge_is_still_a_duplicate(conn: db.Conn) -> None:
    await finished(conn, "order-1", day(0))
    await RetentionKeeper(RetentionConfig(payloads=1 * DAY)).run_once(conn, now=day(2))
    late = await deliver(conn, "order-1", day(2.5))
    assert isinstance(late, Duplicate) and late.delivery_count == 2
    assert await count(conn, "jobs") == 1
    # A different payload under the purged key is still a conflict: the fingerprint outlives the payload.
    other = await deliver(conn, "order-1", day(2.6), payload={"key": "order-1", "card": "0000"})
    assert isinstance(other, Rejected)
    assert await count(conn, "jobs") == 1


async def test_per_source_payload_windows(conn: db.Conn) -> None:
    await finished(conn, "pci", day(0), source="cards")
    await finished(conn, "plain", day(0), source="stripe")
    keeper = RetentionKeeper(RetentionConfig(payloads=30 * DAY, source_payloads={"cards": 1 * DAY}))
    assert (await keeper.run_once(conn, now=day(2))).purged["effects.payload"] == 1
    pci, plain = await effect(conn, "pci"), await effect(conn, "plain")
    assert pci is not None and pci["payload"] is None
    assert plain is not None and plain["payload"] is not None


async def test_history_goes_at_its_window_and_the_tombstone_stays_without_opt_in(conn: db.Conn) -> None:
    job_id = await finished(conn, "k1", day(0))
    await deliver(conn, "k1", day(1))  # a duplicate: a second delivery row
    await deliver(conn, "k1", day(1), payload={"conflict": True})  # a reject row
    await finished(conn, "k2", day(50))
    keeper = RetentionKeeper(RetentionConfig(payloads=10 * DAY, history=60 * DAY))
    await keeper.run_once(conn, now=day(20))
    assert await scalar(conn, "SELECT rejected_payload IS NULL FROM effect_rejects") is True
    assert await count(conn, "deliveries") == 4
    inside = await keeper.run_once(conn, now=day(60) - timedelta(seconds=1))
    assert sum(inside.purged[w] for w in ("deliveries", "effect_rejects", "jobs")) == 0
    result = await keeper.run_once(conn, now=day(61) + timedelta(seconds=1))
    assert {
        w: result.purged[w] for w in ("deliveries", "effect_rejects", "jobs", "job_attempts", "steps")
    } == {
        "deliveries": 3,
        "effect_rejects": 1,
        "jobs": 1,
        "job_attempts": 1,
        "steps": 1,
    }
    assert await jobs.get(conn, job_id) is None
    tomb = await effect(conn, "k1")
    assert tomb is not None and tomb["outcome"] == "succeeded"  # kept: no dedupe window was opted in to
    assert result.purged["effects"] == 0
    # Years later, still a duplicate.
    assert isinstance(await deliver(conn, "k1", day(3000)), Duplicate)
    assert await count(conn, "jobs") == 1  # k2's


async def test_an_expired_tombstone_lets_the_key_be_claimed_again_when_opted_in(conn: db.Conn) -> None:
    await finished(conn, "k1", day(0))
    await deliver(conn, "k1", day(1))  # last seen at day 1
    await finished(conn, "cards-1", day(0), source="cards")
    config = RetentionConfig(
        payloads=1 * DAY, history=2 * DAY, tombstones=5 * DAY, source_tombstones={"cards": None}
    )
    keeper = RetentionKeeper(config)
    await keeper.run_once(conn, now=day(3))
    inside = await keeper.run_once(conn, now=day(6) - timedelta(seconds=1))
    assert inside.purged["effects"] == 0
    result = await keeper.run_once(conn, now=day(6) + timedelta(seconds=1))
    assert result.purged["effects"] == 1
    assert await effect(conn, "k1") is None
    assert await effect(conn, "cards-1") is not None  # its source keeps tombstones forever
    # Counts as new: documented in docs/configuration.md.
    assert isinstance(await deliver(conn, "k1", day(7)), Accepted)


async def test_a_tombstone_with_history_still_attached_goes_with_it(conn: db.Conn) -> None:
    # Dedupe window shorter than history: the tombstone takes its remaining rows along, in one statement.
    await finished(conn, "k1", day(0))
    await deliver(conn, "k1", day(0.5), payload={"conflict": True})
    keeper = RetentionKeeper(RetentionConfig(payloads=1 * DAY, history=90 * DAY, tombstones=3 * DAY))
    result = await keeper.run_once(conn, now=day(4))
    assert (result.purged["effects"], result.purged["deliveries"], result.purged["effect_rejects"]) == (
        1,
        2,
        1,
    )
    assert (result.purged["jobs"], result.purged["job_attempts"], result.purged["steps"]) == (1, 1, 1)
    for table in ("effects", "deliveries", "effect_rejects", "jobs", "job_attempts", "steps"):
        assert await count(conn, table) == 0, table


async def test_a_failed_job_past_its_payload_window_cannot_be_redriven(conn: db.Conn) -> None:
    job_id = await finished(conn, "k1", day(0), state="failed")
    await RetentionKeeper(RetentionConfig(payloads=1 * DAY)).run_once(conn, now=day(2))
    refused = await jobs.redrive(conn, job_id, by="test", now=day(2))
    assert refused is not None and refused.code == "payload_purged"


async def test_counters_older_than_the_retention_are_forgotten_by_the_reconciler(conn: db.Conn) -> None:
    for days_ago in (40, 31, 29, 1):
        for _ in range(3):  # the same minute: one row, counted three times
            await record_signature_failure(
                conn,
                source="stripe",
                reason="signature_invalid",
                size=10,
                body_sha256="0" * 64,
                detail="no secret matched",
                now=NOW - timedelta(days=days_ago),
            )
    assert await count(conn, "signature_failures") == 4
    result = await Reconciler(ReconcilerConfig(signature_failure_retention=30 * 86400)).run_once(
        conn, now=NOW
    )
    assert result.expired_signature_failures == 2 and result.changed
    assert await count(conn, "signature_failures") == 2
    again = await Reconciler(ReconcilerConfig(signature_failure_retention=30 * 86400)).run_once(conn, now=NOW)
    assert again.expired_signature_failures == 0


async def test_what_was_purged_is_counted_for_every_process_and_reported(conn: db.Conn) -> None:
    await finished(conn, "a", day(0))
    await finished(conn, "b", day(0))
    keeper = RetentionKeeper(RetentionConfig(payloads=1 * DAY, history=2 * DAY))
    await keeper.run_once(conn, now=day(1.5))
    await keeper.run_once(conn, now=day(3))
    totals = await retention.purge_totals(conn)
    assert {w: totals[w] for w in ("effects.payload", "steps.answer", "deliveries", "jobs")} == {
        "effects.payload": 2,
        "steps.answer": 2,
        "deliveries": 2,
        "jobs": 2,
    }
    lines, tombstones = await retention.report(conn, keeper.config)
    by = {line.what: line for line in lines}
    assert tombstones == 2
    assert (by["deliveries"].purged_total, by["deliveries"].last_purged_at) == (2, day(3))
    assert by["effects.payload"].last_purged_at == day(1.5)
    assert by["deliveries"].oldest_held is None and by["effects"].window_seconds is None
    assert by["effects"].oldest_held == day(0)
    assert not any(retention.overdue(line, day(3)) for line in lines)


async def test_a_batch_at_a_time_until_done(conn: db.Conn) -> None:
    for n in range(7):
        await finished(conn, f"k{n}", day(0))
    keeper = RetentionKeeper(RetentionConfig(payloads=1 * DAY, batch=2, batches_per_pass=2))
    first = await keeper.run_once(conn, now=day(2))
    assert first.purged["effects.payload"] == 4  # two batches of two
    second = await keeper.run_once(conn, now=day(2))
    assert second.purged["effects.payload"] == 3


def test_windows_are_validated_at_construction() -> None:
    for bad in (
        {"payloads": 0},
        {"payloads": 100 * DAY, "history": 90 * DAY},
        {"source_payloads": {"s": 91 * DAY}},
        {"tombstones": 0},
        {"source_tombstones": {"s": -1.0}},
        {"batch": 0},
    ):
        with pytest.raises(ValueError):
            RetentionConfig(**bad)
