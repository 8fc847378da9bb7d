"""A worker's two pools: its own statements never wait on its handlers, and more slots than handler connections
run every job, each step once.

The worker's own statements (fetch, heartbeat, finish batch) are on one pool and its running jobs' writes on
another (``Ledger(pool, handler_pool=…)``, ``config.worker_connections``): with the handlers' pool exhausted, leases
are still renewed and finished jobs still committed, and slots beyond the handlers' connections wait for one
instead of failing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import timedelta

import pytest

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.worker.config import WORKER_OWN_CONNECTIONS, WorkerConfig, worker_connections
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger
from tests.integration.jobs_and_workers import claim, job, kind, registry, wait_for, wait_state, worker_config

pytestmark = pytest.mark.anyio


def test_the_worker_s_ceiling_no_longer_grows_with_its_slots() -> None:
    assert worker_connections(WorkerConfig(concurrency=64)) == (WORKER_OWN_CONNECTIONS, 16)
    assert worker_connections(WorkerConfig(concurrency=4)) == (WORKER_OWN_CONNECTIONS, 4)
    assert worker_connections(WorkerConfig(concurrency=64, handler_connections=40)) == (
        WORKER_OWN_CONNECTIONS,
        40,
    )
    with pytest.raises(ValueError, match="handler_connections"):
        WorkerConfig(handler_connections=0)


async def test_leases_are_renewed_and_jobs_finished_while_the_handlers_pool_is_exhausted(
    pool: db.Pool, db_url: str
) -> None:
    release = asyncio.Event()

    async def waits(ctx: EffectContext, ev: Event) -> None:
        await release.wait()

    async def quick(ctx: EffectContext, ev: Event) -> None:
        return None

    # A heartbeat every 0.2 s; the slice may run far longer than the test needs.
    reg = registry(
        kind(waits, name="waits", lease_ttl=0.6, slice_budget=30, max_slice=60),
        kind(quick, name="quick"),
    )
    handler_pool = db.make_pool(db_url, min_size=1, max_size=1, name="effectgate-test-handlers")
    await handler_pool.open(wait=True)
    worker = Worker(
        Ledger(pool, handler_pool=handler_pool),
        reg,
        url=db_url,
        config=worker_config(concurrency=4),
        owner=f"test-{uuid.uuid4().hex[:6]}",
    )
    try:
        # The handlers' only connection is held for the whole run: a statement of the worker's own that used
        # it would wait for it, and the lease of the running job would lapse.
        async with handler_pool.connection(), pool.connection() as conn:
            waiting = await claim(conn, kind="waits")
            quick_job = await claim(conn, kind="quick")
            running = asyncio.create_task(worker.run())
            first = (await wait_state(conn, waiting, "running"))["lease_expires_at"]
            await wait_state(conn, quick_job, "succeeded")

            async def renewed_twice() -> bool:
                row = await job(conn, waiting)
                return bool(
                    row["state"] == "running"
                    and row["lease_expires_at"] >= first + timedelta(seconds=2 * 0.6 / 3)
                )

            await wait_for(renewed_twice, 5.0, "two heartbeats of the waiting job's lease")
            release.set()
            await wait_state(conn, waiting, "succeeded")
        worker.stop()
        await running
    finally:
        release.set()
        await handler_pool.close()


async def test_more_slots_than_handler_connections_run_every_job_each_step_once(
    pool: db.Pool, db_url: str
) -> None:
    calls: Counter[str] = Counter()

    async def two_steps(ctx: EffectContext, ev: Event) -> None:
        for name in ("charge", "ship"):

            async def call(key: str, name: str = name) -> str:
                calls[f"{ev.id}/{name}"] += 1
                await asyncio.sleep(0.01)  # a downstream call: no connection held meanwhile
                return key

            await ctx.step(name, call)

    handler_pool = db.make_pool(db_url, min_size=1, max_size=2, name="effectgate-test-handlers")
    await handler_pool.open(wait=True)
    worker = Worker(
        Ledger(pool, handler_pool=handler_pool),
        registry(kind(two_steps)),
        config=worker_config(concurrency=8, handler_connections=2),
        owner=f"test-{uuid.uuid4().hex[:6]}",
    )
    try:
        async with pool.connection() as conn:
            ids = [await claim(conn) for _ in range(24)]
        assert await worker.run_until_idle() == 24
        stats = handler_pool.get_stats()
    finally:
        await handler_pool.close()
    async with pool.connection() as conn:
        states = Counter([(await job(conn, i))["state"] for i in ids])
    print(f"states {dict(states)}; handlers' pool {stats}")
    assert states == {"succeeded": 24}
    assert len(calls) == 48 and set(calls.values()) == {1}
    # Eight slots shared two connections: some writes waited for one, none failed for it.
    assert stats.get("requests_queued", 0) > 0
    assert stats.get("requests_errors", 0) == 0
