"""The worker's observer wired to the process metrics, against real Postgres: slices timed by kind and
outcome, retries, and reclaims by the reconciler — through ``Worker.reconcile_once`` with the clock moved,
and through the loop workers and gateways tick."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from effectgate.gateway import metrics
from effectgate.handlers import EffectContext, Event, TerminalError, TransientError
from effectgate.handlers.observe import WorkerObserver
from effectgate.handlers.worker.maintenance import reconcile_forever
from effectgate.ledger import db, jobs
from effectgate.ledger.handle import Ledger
from effectgate.ledger.maintenance.scheduler import ReconcilerConfig
from tests.integration.jobs_and_workers import claim, job, kind, later, make_worker, registry, wait_for
from tests.prometheus import value

pytestmark = pytest.mark.anyio


def unique(prefix: str) -> str:
    # The registry is process-wide: a kind of its own per test keeps the counts this test reads its own.
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def runs(kind_name: str, outcome: str) -> float:
    return value(metrics.render(), "effectgate_job_run_seconds_count", kind=kind_name, outcome=outcome)


def retries(kind_name: str) -> float:
    return value(metrics.render(), "effectgate_job_retries_total", kind=kind_name)


def reclaims(kind_name: str) -> float:
    return value(metrics.render(), "effectgate_job_reclaims_total", kind=kind_name)


async def test_each_slice_is_timed_by_kind_and_outcome(pool: db.Pool, conn: db.Conn) -> None:
    name = unique("metrics_run")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        if ev.payload["fail"]:
            raise TerminalError("card declined")

    for fail in (False, False, True):
        await claim(conn, kind=name, payload={"fail": fail, "n": uuid.uuid4().hex})
    worker = make_worker(pool, registry(kind(handler, name)), observer=metrics.WORKER_OBSERVER)
    assert await worker.run_until_idle() == 3
    assert (runs(name, "succeeded"), runs(name, "failed"), retries(name)) == (2, 1, 0)


async def test_every_retry_is_counted_and_its_slice_ends_as_retry(pool: db.Pool, conn: db.Conn) -> None:
    name = unique("metrics_retry")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        raise TransientError(f"provider 503 on attempt {ctx.attempt}")

    job_id = await claim(conn, kind=name, max_attempts=3)
    worker = make_worker(pool, registry(kind(handler, name)), observer=metrics.WORKER_OBSERVER)
    await worker.run_until_idle()
    assert (await job(conn, job_id))["state"] == "failed"
    assert (retries(name), runs(name, "retry"), runs(name, "failed")) == (2, 2, 1)


@pytest.mark.parametrize(("policy", "state"), [("redrive", "pending"), ("park", "parked")])
async def test_a_job_taken_back_after_its_lease_expired_is_a_reclaim(
    pool: db.Pool, conn: db.Conn, policy: str, state: str
) -> None:
    name = unique("metrics_reclaim")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    job_id = await claim(conn, kind=name, orphan_policy=policy)
    await jobs.fetch_and_lease(conn, owner="gone", kinds={name: 30}, limit=1)
    worker = make_worker(
        pool, registry(kind(handler, name, orphan_policy=policy)), observer=metrics.WORKER_OBSERVER
    )
    early = await worker.reconcile_once()
    assert (early.redriven, early.parked, reclaims(name)) == ([], [], 0)
    # The reconciler is told it is a minute later: the 30 s lease has expired without anyone sleeping.
    result = await worker.reconcile_once(now=later(60))
    assert {"pending": result.redriven, "parked": result.parked}[state] == [job_id]
    assert reclaims(name) == 1


async def test_the_reconciler_loop_reports_reclaims_too(pool: db.Pool, conn: db.Conn) -> None:
    name = unique("metrics_loop")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    # Claimed and leased two minutes ago for 10 s: expired on the real clock the loop runs on.
    ago = datetime.now(UTC) - timedelta(seconds=120)
    job_id = await claim(conn, kind=name, orphan_policy="redrive", now=ago)
    await jobs.fetch_and_lease(conn, owner="gone", kinds={name: 10}, limit=1, now=ago)
    reg = registry(kind(handler, name, orphan_policy="redrive"))
    stopping = asyncio.Event()
    loop = asyncio.create_task(
        reconcile_forever(
            Ledger(pool), reg, ReconcilerConfig(tick=0.05), stopping, observer=metrics.WORKER_OBSERVER
        )
    )
    try:

        async def reclaimed() -> bool:
            return reclaims(name) == 1

        await wait_for(reclaimed, 5, "the loop to reclaim the job")
    finally:
        stopping.set()
        await loop
    assert (await job(conn, job_id))["state"] == "pending"
    # The pass that reclaimed it was noted as the reconciler's latest tick.
    tick = value(metrics.render(), "effectgate_reconciler_last_tick_timestamp_seconds")
    assert tick >= ago.timestamp() + 120 - 1


async def test_an_observer_that_raises_changes_no_outcome(pool: db.Pool, conn: db.Conn) -> None:
    seen: list[tuple[str, str]] = []

    def broken(kind_name: str, outcome: str, seconds: float) -> None:
        seen.append((kind_name, outcome))
        raise RuntimeError("metrics backend down")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        return None

    job_id = await claim(conn)
    worker = make_worker(pool, registry(kind(handler)), observer=WorkerObserver(on_slice=broken))
    await worker.run_until_idle()
    assert (await job(conn, job_id))["state"] == "succeeded"
    assert seen == [("k", "succeeded")]
