"""Benchmark: what one heartbeat of many leases costs, and what one locked job row does to it.

    python -m tests.bench.heartbeat [--leases 16 256] [--rounds 200]

Compares, per heartbeat of N leases: the shipped statement (``lease_extend_if_held``: one statement,
``SKIP LOCKED``), the statement it replaced (one statement that waits for every row lock), and one statement
per lease (the same block with one row each, as ``NOWAIT`` per row would need). Then holds one job's row lock
from another connection and times the shipped statement again. Prints median and p95 in ms; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import heartbeats

from .common import drop_database, fresh_database, percentile, server_url
from .worker import claim_jobs

# The heartbeat before SKIP LOCKED, for comparison only.
WAITING_HEARTBEAT = """
WITH held AS (
    SELECT j.id, h.ttl
    FROM jobs j
    JOIN unnest(%(job_ids)b::bigint[], %(lease_tokens)b::bigint[], %(ttls)b::float8[]) AS h(job_id, lease_token, ttl)
        ON j.id = h.job_id AND j.lease_token = h.lease_token
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE jobs j SET lease_expires_at = now() + make_interval(secs => held.ttl), updated_at = now()
FROM held WHERE j.id = held.id
RETURNING j.id, j.cancel_requested
"""


async def timed(rounds: int, beat: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await beat()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def line(name: str, n: int, samples: list[float]) -> str:
    return f"{name:<34} {n:>4} leases  p50 {statistics.median(samples):7.2f} ms  p95 {percentile(samples, 95):7.2f} ms"


async def run(url: str, sizes: list[int], rounds: int) -> None:
    async with await db.connect(url) as conn, await db.connect(url) as holder:
        await claim_jobs(conn, max(sizes))
        leases = await jobs.fetch_and_lease(conn, owner="bench", kinds={"bench.noop": 60}, limit=max(sizes))
        for n in sizes:
            beats = [(x.job_id, x.lease_token, 60.0) for x in leases[:n]]
            params = {
                "job_ids": [b[0] for b in beats],
                "lease_tokens": [b[1] for b in beats],
                "ttls": [b[2] for b in beats],
            }

            async def skip_locked(beats: list[tuple[int, int, float]] = beats) -> object:
                return await heartbeats.extend_leases(conn, beats)

            async def waiting(params: dict[str, list[float] | list[int]] = params) -> object:
                return await (await conn.execute(WAITING_HEARTBEAT, params)).fetchall()

            async def per_lease(beats: list[tuple[int, int, float]] = beats) -> object:
                return [await heartbeats.extend_leases(conn, [b]) for b in beats]

            print(line("one statement, SKIP LOCKED", n, await timed(rounds, skip_locked)))
            print(line("one statement, waits for locks", n, await timed(rounds, waiting)))
            print(line("one statement per lease", n, await timed(max(1, rounds // 10), per_lease)))
            async with holder.transaction():
                await holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (beats[0][0],))
                answer = await heartbeats.extend_leases(conn, beats)
                assert answer.busy == {beats[0][0]}
                print(line("SKIP LOCKED, one row locked", n, await timed(rounds, skip_locked)))
            # The waiting statement, with the same lock, would wait until the holder commits: not timed.


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--leases", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        asyncio.run(run(url, args.leases, args.rounds))
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
