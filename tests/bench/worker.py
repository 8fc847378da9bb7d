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
from dataclasses import dataclass
from typing import Any

from effectgate.handlers.event import Event
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.handlers.worker.runtime import Worker, WorkerConfig
from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger

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
    worker = Worker(Ledger(pool), make_registry(count), url=url, config=config)
    started = time.monotonic()
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(all_done.wait(), 600)
    worker.stop()
    await runner
    await pool.close()
    # Up to the last handler's start, as PgQueuer's drain is timed: shutting down is not draining.
    return jobs / (finished - started)


@dataclass(frozen=True)
class Wakeups:
    """Per claimed job, seconds from the claim's commit (its answer read by the claimer) to the handler's
    start, and the claim's own round trip (sent to committed), which a loaded disk's WAL flush dominates."""

    from_commit: list[float]
    claim: list[float]


async def latency(url: str, samples: int) -> Wakeups:
    """One job at a time, each claimed as soon as the previous one's handler started (its finish batch still
    in flight, as on a busy worker), to an idle worker of 4 slots that polls only every 30 s: every start
    is a LISTEN/NOTIFY wake-up."""
    committed_at: dict[str, float] = {}
    from_commit: list[float] = []
    claim: list[float] = []
    started_at: dict[str, float] = {}
    got = asyncio.Event()

    def on_start(ev: Event) -> None:
        started_at[ev.id] = time.monotonic()
        got.set()

    pool = db.make_pool(url, max_size=8)
    await pool.open(wait=True)
    config = WorkerConfig(concurrency=4, backoff_base=0, run_reconciler=False, poll_interval=30)
    worker = Worker(Ledger(pool), make_registry(on_start), url=url, config=config)
    runner = asyncio.create_task(worker.run())
    await asyncio.sleep(0.5)  # let it LISTEN
    conn = await db.connect(url)
    async with conn:
        for _ in range(samples):
            got.clear()
            key = uuid.uuid4().hex
            payload = {"id": key}
            sent = time.monotonic()
            delivery = Delivery(key, "default", "bench", key, "noop", payload, fingerprint(payload), 0)
            await claim_delivery(conn, delivery, [EffectRequest(f"k:{key}", "bench.noop", 3, "redrive")])
            # Postgres sends the NOTIFY and the claim's answer once the commit is flushed, so the answer's
            # arrival is the commit as this process can see it. The handler cannot start before it: the
            # fetch that leases the job waits for a flush of its own.
            committed_at[key] = time.monotonic()
            claim.append(committed_at[key] - sent)
            await asyncio.wait_for(got.wait(), 10)
            from_commit.append(started_at[key] - committed_at[key])
    worker.stop()
    await runner
    await pool.close()
    return Wakeups(from_commit, claim)


def wakeups_line(w: Wakeups) -> str:
    return (
        f"claim commit -> handler start ({len(w.from_commit)} samples): p50 {percentile(w.from_commit, 50) * 1000:.1f} ms, "
        f"p99 {percentile(w.from_commit, 99) * 1000:.1f} ms; the claim itself, sent -> committed: "
        f"p50 {percentile(w.claim, 50) * 1000:.1f} ms, p99 {percentile(w.claim, 99) * 1000:.1f} ms"
    )


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
        wakeups = asyncio.run(latency(url, args.latency_samples))
        print(wakeups_line(wakeups))
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
