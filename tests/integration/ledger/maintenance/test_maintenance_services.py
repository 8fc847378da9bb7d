"""Each maintenance service on its own, through ``run_once(now=…)``, and the scheduler that runs them.

The clock is a parameter: a lease "expires" because the pass is told it is later, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime

import pytest

from effectgate.gateway.logs import JsonFormatter
from effectgate.handlers.registry import Registry
from effectgate.handlers.worker.maintenance import reconcile_forever
from effectgate.ledger import db, jobs
from effectgate.ledger.handle import Ledger
from effectgate.ledger.maintenance.rescuer import LeaseRescuer, Repaired, RescuerConfig
from effectgate.ledger.maintenance.retention import RetentionConfig
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig, service_lock_id
from effectgate.ledger.maintenance.sweeps import SweepConfig, SweepRunner
from effectgate.ledger.maintenance.waker import PendingWaker, WakerConfig
from tests.integration.jobs_and_workers import at, claim, connected, job, later, scalar, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def orphans(
    conn: db.Conn, n: int, *, kind: str = "k", policy: str = "redrive", at_s: float = 0
) -> list[int]:
    """``n`` jobs of ``kind`` leased at ``at_s`` for 10 s by a worker that then vanished."""
    ids = [await claim(conn, kind=kind, orphan_policy=policy, now=at(at_s)) for _ in range(n)]
    leased = await jobs.fetch_and_lease(conn, owner="gone", kinds={kind: 10}, limit=n, now=at(at_s))
    assert sorted(lease.job_id for lease in leased) == sorted(ids)
    return ids


async def test_the_rescuer_takes_many_expired_leases_in_one_batch_and_only_expired_ones(
    conn: db.Conn,
) -> None:
    expired = await orphans(conn, 25)
    alive = await orphans(conn, 3, at_s=100)  # leased later: still alive at 50
    result = await LeaseRescuer(RescuerConfig(batch=10)).run_once(conn, now=at(50))
    assert len(result.redriven) == 10 and set(result.redriven) <= set(expired)
    rest = await LeaseRescuer().run_once(conn, now=at(50))
    assert sorted(result.redriven + rest.redriven) == sorted(expired)
    assert [(await job(conn, j))["state"] for j in alive] == ["running"] * 3
    assert (await LeaseRescuer().run_once(conn, now=at(50))).changed is False


async def test_one_batch_applies_each_kinds_poison_threshold_and_orphan_policy(conn: db.Conn) -> None:
    strict = await orphans(conn, 2, kind="strict")
    park = await orphans(conn, 2, kind="parky", policy="park")
    lax = await orphans(conn, 2, kind="lax")
    rescuer = LeaseRescuer(RescuerConfig(poison_threshold=3), poison_thresholds={"strict": 1})
    result = await rescuer.run_once(conn, now=at(50))
    assert sorted(result.parked) == sorted(strict + park)
    assert sorted(result.redriven) == sorted(lax)
    reasons = {j: (await job(conn, j))["terminal_reason"] for j in strict + park}
    assert {reasons[j] for j in strict} == {"poison: orphaned 1 times without committing"}
    assert {reasons[j] for j in park} == {"orphaned: lease expired and orphan_policy is park"}


async def test_a_failing_hook_costs_its_own_job_nothing_and_the_others_theirs(conn: db.Conn) -> None:
    ids = await orphans(conn, 3, policy="park")
    await conn.execute("CREATE TEMP TABLE mirror (job_id bigint)")
    bad = ids[1]

    async def hook(c: db.Conn, repaired: Repaired) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s)", (repaired.job_id,))
        if repaired.job_id == bad:
            raise RuntimeError("mirror refused")

    result = await LeaseRescuer(on_transition=hook).run_once(conn, now=at(50))
    assert sorted(result.parked) == sorted(ids)
    assert set(result.hook_errors) == {bad}
    mirrored = await (await conn.execute("SELECT job_id FROM mirror ORDER BY job_id")).fetchall()
    assert [r["job_id"] for r in mirrored] == sorted(j for j in ids if j != bad)


async def test_hand_back_and_rescue_follow_the_one_release_rule(conn: db.Conn) -> None:
    # The rule is a function (migration 0006, named _v1 by 0017); both statements call it. Its table:
    cases = [
        # cancel, committed, releases so far, threshold, policy → verdict
        ((True, False, 5, 1, "park"), "cancelled"),
        ((False, False, 2, 3, "redrive"), "poison"),
        ((False, True, 2, 3, "redrive"), "redrive"),
        ((False, False, 0, 3, "park"), "park"),
        ((False, True, 9, 1, "park"), "park"),
    ]
    for args, verdict in cases:
        got = await scalar(conn, "SELECT job_release_verdict_v1(%s, %s, %s, %s, %s)", *args)
        assert got == verdict, args
    assert await scalar(conn, "SELECT job_release_count_v1(true, 4)") == 0
    assert await scalar(conn, "SELECT job_release_count_v1(false, 4)") == 5
    # And the hand-back reaches the same poison verdict as the rescuer at the same count.
    job_id = await claim(conn, now=at(0))
    for n in range(2):
        [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 10}, limit=1, now=at(n))
        reached = await jobs.hand_back(conn, job_id, lease.lease_token, poison_threshold=2, by="w", now=at(n))
    assert (reached.state, reached.reason) == ("parked", "poison: handed back 2 times without committing")


async def test_the_waker_wakes_due_jobs_past_their_kinds_ttl(conn: db.Conn) -> None:
    fast = await claim(conn, kind="fast", now=at(0))
    slow = await claim(conn, kind="slow", now=at(0))
    waker = PendingWaker(WakerConfig(pending_ttl=600), pending_ttls={"fast": 30})
    assert (await waker.run_once(conn, now=at(29))).woken == 0
    assert (await waker.run_once(conn, now=at(31))).woken == 1
    assert (await waker.run_once(conn, now=at(601))).woken == 2  # fast again (a TTL later) and slow
    assert {fast, slow}  # both still pending: a wake-up changes no state
    assert {(await job(conn, j))["state"] for j in (fast, slow)} == {"pending"}


async def test_sweeps_can_be_switched_off(conn: db.Conn) -> None:
    calls: list[int] = []

    async def sweep(_c: db.Conn) -> int:
        calls.append(1)
        return 1

    assert (await SweepRunner({"s": sweep}, SweepConfig(enabled=False)).run_once(conn)).acted == {}
    assert (await SweepRunner({"s": sweep}).run_once(conn)).acted == {"s": 1}
    assert calls == [1]


async def test_a_service_that_throws_is_one_error_and_the_others_still_run(conn: db.Conn) -> None:
    job_id = (await orphans(conn, 1))[0]
    ran: list[str] = []

    async def sweep(_c: db.Conn) -> int:
        ran.append("sweep")
        return 0

    reconciler = Reconciler(sweeps={"s": sweep})

    class Broken:
        async def run_once(self, conn: db.Conn, *, now: datetime | None = None) -> object:
            raise RuntimeError("retention bug")

    reconciler.keeper = Broken()  # type: ignore[assignment]
    result = await reconciler.run_once(conn, now=at(50))
    assert result.service_errors == {"retention": "RuntimeError: retention bug"}
    assert (result.redriven, ran, result.errors, result.changed) == ([job_id], ["sweep"], 1, True)


async def test_each_service_is_owned_by_one_process_at_a_time(db_url: str) -> None:
    async with connected(db_url) as conn, connected(db_url) as other:
        await orphans(conn, 1)
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(%s)", (service_lock_id("pending_waker"),))
            await other.execute("SELECT pg_advisory_xact_lock(%s)", (service_lock_id("retention"),))
            result = await Reconciler().run_once(conn, now=at(50))
        # The rescuer was free and ran; the two held services were left to their holder.
        assert (result.owned, len(result.redriven), result.skipped) == (
            True,
            1,
            ["pending_waker", "retention"],
        )


async def test_many_schedulers_at_once_rescue_each_job_once(db_url: str) -> None:
    async with connected(db_url) as conn:
        ids = await orphans(conn, 60)
        conns = [await db.connect(db_url) for _ in range(5)]
        start = asyncio.Event()
        try:

            async def ticks(c: db.Conn) -> list[int]:
                await start.wait()
                got: list[int] = []
                for _ in range(200):
                    result = await Reconciler(ReconcilerConfig(batch=7)).run_once(c, now=at(60))
                    got += result.redriven
                    if result.owned and not result.redriven:
                        return got
                    await asyncio.sleep(0)
                raise AssertionError("never finished")

            tasks = [asyncio.create_task(ticks(c)) for c in conns]
            start.set()
            results = await asyncio.gather(*tasks)
        finally:
            for c in conns:
                await c.close()
        assert sorted(j for r in results for j in r) == sorted(ids)
        assert await scalar(conn, "SELECT count(*) FROM job_attempts WHERE outcome = 'lease_expired'") == 60


def test_every_service_config_refuses_nonsense_at_construction() -> None:
    for make in (
        lambda: RescuerConfig(batch=0),
        lambda: RescuerConfig(poison_threshold=0),
        lambda: WakerConfig(pending_ttl=0),
        lambda: WakerConfig(batch=0),
        lambda: RetentionConfig(signature_failures=0),
        lambda: RetentionConfig(batch=0),
        lambda: ReconcilerConfig(batch=0),
    ):
        with pytest.raises(ValueError):
            make()


async def test_a_maintenance_failure_is_logged_at_error_under_its_own_name(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An unmigrated database: every service throws. That is a failure to alert on, not a repair.
    pool = db.make_pool(empty_db_url, min_size=1, max_size=2, name="effectgate-test")
    await pool.open(wait=True)
    stopping = asyncio.Event()
    try:
        with caplog.at_level(logging.INFO, logger="effectgate"):
            loop = asyncio.create_task(
                reconcile_forever(Ledger(pool), Registry(), ReconcilerConfig(tick=0.05), stopping)
            )

            async def failed() -> bool:
                return any(
                    r.getMessage() in ("reconciler.failed", "maintenance.failed") for r in caplog.records
                )

            await wait_for(failed, 30, "the failing pass to be logged")
            stopping.set()
            await loop
    finally:
        await pool.close()
    failures = [r for r in caplog.records if r.getMessage() in ("reconciler.failed", "maintenance.failed")]
    assert failures and all(r.levelno == logging.ERROR for r in failures)
    record = failures[0]
    errors = getattr(record, "service_errors", None) or {"loop": getattr(record, "error", "")}
    assert any("does not exist" in str(e) for e in errors.values()), errors
    assert "reconciler.repaired" not in caplog.messages


async def test_a_job_the_reconciler_parks_is_logged_at_error_with_its_kind_key_and_reason(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = db.make_pool(db_url, min_size=1, max_size=2, name="effectgate-test")
    await pool.open(wait=True)
    stopping = asyncio.Event()
    try:
        async with connected(db_url) as c:
            job_id = await claim(c, "order:7", kind="ship", orphan_policy="park", now=later(-100))
            await jobs.fetch_and_lease(c, owner="gone", kinds={"ship": 10}, limit=1, now=later(-100))
        with caplog.at_level(logging.INFO, logger="effectgate"):
            loop = asyncio.create_task(
                reconcile_forever(Ledger(pool), Registry(), ReconcilerConfig(tick=0.05), stopping)
            )

            async def parked() -> bool:
                return "reconciler.parked" in caplog.messages

            await wait_for(parked, 30, "the park to be logged")
            stopping.set()
            await loop
    finally:
        await pool.close()
    [record] = [r for r in caplog.records if r.getMessage() == "reconciler.parked"]
    assert record.levelno == logging.ERROR
    assert (record.job_id, record.kind, record.effect_key, record.reason) == (  # type: ignore[attr-defined]
        job_id,
        "ship",
        "order:7",
        "orphaned: lease expired and orphan_policy is park",
    )
    # The pass's own line is JSON all the way down: its result an object, not a Python repr inside a string.
    [repaired] = [r for r in caplog.records if r.getMessage() == "reconciler.repaired"]
    line = json.loads(JsonFormatter().format(repaired))
    assert line["result"]["parked"] == [job_id] and line["result"]["redriven"] == []
