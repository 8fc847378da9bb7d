"""Benchmark: how fast workers drain no-op jobs, and how soon a claimed job starts.

    python -m tests.bench.worker [--jobs 5000] [--concurrency 16] [--latency-samples 200]

Drain: claims ``--jobs`` no-op jobs, then times one worker process leasing and finishing them (fencing
on: every finish matches the lease token). Latency: with the worker idle and listening, claims one job
at a time and measures commit → handler start (the LISTEN/NOTIFY wake-up path). Prints figures;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from effectgate.handlers.event import Event
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.handlers.worker import Worker, WorkerConfig
from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint

from .common import drop_database, fresh_database, percentile, server_url


async def claim_jobs(conn: db.Conn, n: int) -> None:
    for _ in range(n):
        key = uuid.uuid4().hex
        payload = {"id": key}
        delivery = Delivery(key, "default", "bench", key, "noop", payload, fingerprint(payload), 0)
        await claim_delivery(conn, delivery, [EffectRequest(f"k:{key}", "bench.noop", 3, "redrive")])


def make_registry(on_start: Any = None) -> Registry:
    async def noop(ctx: Any, ev: Event) -> None:
        if on_start is not None:
            on_start(ev)

    registry = Registry()
    registry.register(EffectKind(name="bench.noop", source="bench", events=("*",), fn=noop))
    return registry


async def drain(url: str, jobs: int, concurrency: int) -> float:
    conn = await db.connect(url)
    async with conn:
        await claim_jobs(conn, jobs)
    pool = db.make_pool(url, max_size=concurrency + 4)
    await pool.open(wait=True)
    done = 0
    all_done = asyncio.Event()

    finished = 0.0

    def count(ev: Event) -> None:
        nonlocal done, finished
        done += 1
        if done == jobs:
            finished = time.monotonic()
            all_done.set()

    config = WorkerConfig(concurrency=concurrency, backoff_base=0, run_reconciler=False)
    # The production loop (Worker.run), not run_until_idle: a finished job wakes a fetch for the
    # free slots, as it does in `effectgate worker`.
    worker = Worker(pool, make_registry(count), url=url, config=config)
    started = time.monotonic()
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(all_done.wait(), 600)
    worker.stop()
    await runner
    await pool.close()
    # Up to the last handler's start, as PgQueuer's drain is timed: shutting down is not draining.
    return jobs / (finished - started)


async def latency(url: str, samples: int) -> list[float]:
    claimed_at: dict[str, float] = {}
    delays: list[float] = []
    got = asyncio.Event()

    def on_start(ev: Event) -> None:
        delays.append(time.monotonic() - claimed_at[ev.id])
        got.set()

    pool = db.make_pool(url, max_size=8)
    await pool.open(wait=True)
    config = WorkerConfig(concurrency=4, backoff_base=0, run_reconciler=False, poll_interval=30)
    worker = Worker(pool, make_registry(on_start), url=url, config=config)
    runner = asyncio.create_task(worker.run())
    await asyncio.sleep(0.5)  # let it LISTEN
    conn = await db.connect(url)
    async with conn:
        for _ in range(samples):
            got.clear()
            key = uuid.uuid4().hex
            payload = {"id": key}
            claimed_at[key] = time.monotonic()
            delivery = Delivery(key, "default", "bench", key, "noop", payload, fingerprint(payload), 0)
            await claim_delivery(conn, delivery, [EffectRequest(f"k:{key}", "bench.noop", 3, "redrive")])
            await asyncio.wait_for(got.wait(), 10)
    worker.stop()
    await runner
    await pool.close()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-samples", type=int, default=200)
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        rate = asyncio.run(drain(url, args.jobs, args.concurrency))
        print(
            f"worker drain, no-op jobs, fencing on, concurrency {args.concurrency}: {rate:.0f} jobs/s ({args.jobs} jobs)"
        )
    finally:
        drop_database(server, url)
    url = fresh_database(server)
    try:
        delays = asyncio.run(latency(url, args.latency_samples))
        print(
            f"claim commit -> handler start ({len(delays)} samples): "
            f"p50 {percentile(delays, 50) * 1000:.1f} ms, p99 {percentile(delays, 99) * 1000:.1f} ms"
        )
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
