"""Benchmark: what a shared pace (`pace_scope = "ledger"`) costs a call, and how many turns its one row gives.

    python -m tests.bench.pace_cost [--calls 4000] [--slots 1,16,64] [--pools 2] [--connections 16]

Each of ``--pools`` connection pools (as many worker processes, each with ``--connections``, the default
``handler_connections``) runs ``slots`` callers taking turns of one downstream through ``LedgerTurns.take``, until
``--calls`` turns are taken between them. The rate is far above what they reach, so no turn is waited for: what is
timed is the reservation itself, its wait for a pooled connection and for the row's lock included. Prints, per slot
count, the reservations a second and each one's p50 and p99 in ms. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from effectgate.ledger import db
from effectgate.ledger.paces import LedgerTurns

from .common import drop_database, fresh_database, percentile, server_url

# A rate no caller reaches: every turn is free at once, so only the statement is timed.
UNREACHED = 1e-9


async def run(url: str, calls: int, slot_counts: list[int], pool_count: int, connections: int) -> None:
    pools = [db.make_pool(url, min_size=connections, max_size=connections) for _ in range(pool_count)]
    for pool in pools:
        await pool.open(wait=True)
    try:
        turns = [LedgerTurns(pool) for pool in pools]
        for slots in slot_counts:
            samples: list[float] = []
            left = calls

            async def caller(schedule: LedgerTurns, samples: list[float] = samples) -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    start = time.perf_counter()
                    reserved, _ = await schedule.take("bench-api", UNREACHED, 10.0)
                    samples.append((time.perf_counter() - start) * 1000)
                    assert reserved

            began = time.perf_counter()
            await asyncio.gather(*(caller(schedule) for schedule in turns for _ in range(slots)))
            took = time.perf_counter() - began
            print(
                f"{pool_count} pools x {slots:>3} slots: {len(samples) / took:8,.0f} reservations/s, "
                f"p50 {statistics.median(samples):6.2f} ms, p99 {percentile(samples, 99):6.2f} ms"
            )
    finally:
        for pool in pools:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--slots", default="1,16,64", help="comma-separated slot counts per pool")
    parser.add_argument("--pools", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        asyncio.run(
            run(url, args.calls, [int(s) for s in args.slots.split(",")], args.pools, args.connections)
        )
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
