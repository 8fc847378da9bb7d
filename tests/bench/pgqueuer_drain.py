"""PgQueuer's drain of no-op jobs, the figure the worker benchmark compares effectgate's worker with.

    python -m tests.bench.pgqueuer_drain [--jobs 5000] [--batch-size 10]

Needs the ``bench`` extra (``pip install -e '.[bench]'``). One process, PgQueuer's own defaults but for
the batch size, jobs enqueued before the clock starts, the clock stopped when the last handler ran.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import psycopg

from .common import drop_database, fresh_database, server_url


async def drain(
    url: str,
    jobs: int,
    batch_size: int = 10,
    *,
    payload: bytes | None = None,
    before: Callable[[], None] | None = None,
    after: Callable[[], None] | None = None,
) -> float | None:
    """Jobs per second, or ``None`` when PgQueuer is not installed. Each job carries ``payload``; ``before``
    runs once the jobs are enqueued, before the clock starts (an ANALYZE, say), ``after`` once the consumer
    stopped, its connection still open."""
    try:
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
    except ImportError:
        return None
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    async with conn:
        driver = PsycopgDriver(conn)
        queries = Queries(driver)
        await queries.install()
        for start in range(0, jobs, 1000):
            n = min(1000, jobs - start)
            await queries.enqueue(["noop"] * n, [payload] * n, [0] * n)
        if before is not None:
            before()
        manager = QueueManager(queries)
        done = 0
        finished = 0.0

        @manager.entrypoint("noop")
        async def noop(job: object) -> None:
            nonlocal done, finished
            done += 1
            if done == jobs:
                finished = time.monotonic()
                manager.shutdown.set()

        started = time.monotonic()
        await asyncio.wait_for(manager.run(batch_size=batch_size), 600)
        if after is not None:
            after()
        # Up to the last handler's start, as effectgate's drain is timed: shutting down is not draining.
        return jobs / (finished - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        rate = asyncio.run(drain(url, args.jobs, args.batch_size))
    finally:
        drop_database(server, url)
    if rate is None:
        print("pgqueuer drain: no figure — pgqueuer is not installed (pip install -e '.[bench]')")
    else:
        print(f"pgqueuer drain, no-op jobs, batch {args.batch_size}: {rate:.0f} jobs/s ({args.jobs} jobs)")


if __name__ == "__main__":
    main()
