"""Benchmark: genuine claims beside a flood of one replayed delivery, through one ``ClaimBatcher`` in-process.

    python -m tests.bench.claim_flood [--seconds 10] [--genuine 64] [--flood 500] [--rounds 8]

Quiet: ``--genuine`` clients each claim new keys back to back. Flood: the same, while ``--flood`` more clients
claim one and the same delivery back to back. Prints the genuine clients' p50/p99 in both runs, their ratio,
every error by type, and how long a claim past a full queue takes to be refused. In-process (no HTTP): it
measures the batcher and Postgres, not uvicorn. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
import uuid
from typing import Any

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import Delivery, EffectRequest
from effectgate.ledger.errors import ClaimOverloaded
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger

from .common import drop_database, fresh_database, percentile, server_url

PAYLOAD = {"id": "evt", "type": "payment_intent.succeeded", "data": {"object": {"pad": "x" * 1800}}}


def request(key: str, payload: dict[str, object]) -> list[tuple[Delivery, list[EffectRequest]]]:
    delivery = Delivery(
        key, "default", "bench", key, "payment_intent.succeeded", payload, fingerprint(payload), 0
    )
    return [(delivery, [EffectRequest(f"k:{key}", "bench", 5, "park")])]


async def run(url: str, seconds: float, genuine: int, flood: int, rounds: int) -> dict[str, object]:
    pool = db.make_pool(url, max_size=2, lock_timeout=0.5, statement_timeout=5.0)
    await pool.open(wait=True)
    batcher = ClaimBatcher(Ledger(pool), max_rounds=rounds)
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    flood_done = 0
    stop = time.monotonic() + seconds
    replay = request("replayed", PAYLOAD)

    async def genuine_client() -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                await batcher.claim(request(uuid.uuid4().hex, PAYLOAD))
            except Exception as exc:
                errors[f"genuine {type(exc).__name__}"] += 1
                continue
            latencies.append(time.perf_counter() - started)

    async def flood_client() -> None:
        nonlocal flood_done
        while time.monotonic() < stop:
            try:
                await batcher.claim(replay)
                flood_done += 1
            except Exception as exc:
                errors[f"flood {type(exc).__name__}"] += 1
                await asyncio.sleep(0.001)

    try:
        await asyncio.gather(
            *(genuine_client() for _ in range(genuine)), *(flood_client() for _ in range(flood))
        )
        await batcher.close()
    finally:
        await pool.close()
    return {
        "genuine": len(latencies),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "flood_claims": flood_done,
        "errors": dict(errors),
    }


class _Stalled(ClaimBatcher):
    """A batcher whose batch in flight never ends: its queue fills and stays full."""

    async def _write(self, batch: list[Any]) -> None:
        await asyncio.Event().wait()


async def refusal_time(url: str, queue: int = 1024) -> float:
    """p99 microseconds for claim() to refuse once the queue is full."""
    pool = db.make_pool(url, max_size=1)
    batcher = _Stalled(pool, max_queue=queue, deadline=600)
    waiting = [asyncio.ensure_future(batcher.claim(request(f"q{n}", PAYLOAD))) for n in range(queue + 1)]
    await asyncio.sleep(0)
    times = []
    for _ in range(1000):
        started = time.perf_counter()
        try:
            await batcher.claim(request("over", PAYLOAD))
        except ClaimOverloaded:
            times.append(time.perf_counter() - started)
    for task in [*waiting, *batcher._flushers]:
        task.cancel()
    await asyncio.gather(*waiting, *batcher._flushers, return_exceptions=True)
    return percentile(times, 99) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--genuine", type=int, default=64)
    parser.add_argument("--flood", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    server = server_url()
    for label, flood in (("quiet", 0), ("flood", args.flood)):
        url = fresh_database(server)
        try:
            result = asyncio.run(run(url, args.seconds, args.genuine, flood, args.rounds))
        finally:
            drop_database(server, url)
        print(label, result, flush=True)
    url = fresh_database(server)
    try:
        print(f"refused past a full queue of 1024: p99 {asyncio.run(refusal_time(url)):.1f} µs")
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
