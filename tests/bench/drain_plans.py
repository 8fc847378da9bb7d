"""Benchmark: what the worker's statements cost the server at two backlogs (docs/performance.md, the worker
drain), and what one commit costs on this machine.

    python -m tests.bench.drain_plans [--backlog 3000,100000]

For each backlog: pending no-op jobs written straight into a fresh ledger (as ``worker_sweep`` does), 640 of
them drained by fetch + finish batches of 16, then EXPLAIN (ANALYZE, BUFFERS) of the fetch, the heartbeat and
the finish batch (three each, rolled back) and of the pending waker (on the fresh backlog, then with every job
older than ``pending_ttl``). Prints execution time and buffers per statement; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from effectgate.ledger import db, jobs
from effectgate.ledger.queries import Q
from effectgate.ledger.vocabulary import JobState

from .common import drop_database, fresh_database, server_url
from .worker_sweep import BACKLOG, KIND


async def explain(conn: db.Conn, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The EXPLAIN (ANALYZE, BUFFERS) of one named statement, its writes rolled back."""
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + Q[name], params)
        row = await cur.fetchone()
    assert row is not None
    return dict(row["QUERY PLAN"][0])


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


def summary(plan: dict[str, Any]) -> str:
    top = plan["Plan"]
    jobs_rows = sum(
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
        for n in nodes(top)
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    )
    seq = any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs" for n in nodes(top))
    return (
        f"{plan['Execution Time']:7.2f} ms, {top.get('Shared Hit Blocks', 0) + top.get('Shared Read Blocks', 0):6d}"
        f" buffers, {jobs_rows:7.0f} rows of jobs read{', Seq Scan of jobs' if seq else ''}"
    )


async def one(url: str, backlog: int, round_: int) -> None:
    conn = await db.connect(url)
    async with conn:
        for table in ("job_attempts", "jobs", "effects"):
            await conn.execute(f"DELETE FROM {table}")  # type: ignore[arg-type]
        await conn.execute(BACKLOG, {"n": backlog, "kind": KIND, "round": round_})  # type: ignore[arg-type]
        await conn.execute("VACUUM ANALYZE jobs")
        waker = {"kinds": [KIND], "pending_ttls": [900.0], "pending_ttl": 900.0, "limit": 1000, "now": None}
        print(
            f"{backlog:>7} pending  waker, fresh backlog:     {summary(await explain(conn, 'job_wake_stale_pending', waker))}"
        )
        for _ in range(40):
            leases = await jobs.fetch_and_lease(conn, owner="bench", kinds={KIND: 30.0}, limit=16)
            done = [
                jobs.Finish(lease.job_id, lease.lease_token, JobState.SUCCEEDED, "bench") for lease in leases
            ]
            await jobs.finish_many(conn, done)
        fetch = {
            "owner": "bench",
            "kinds": [KIND],
            "ttls": [30.0],
            "limit": 16,
            "scan_limit": 1000,
            "now": None,
            "hooked": [],
            "tenant": None,
        }
        for _ in range(3):
            print(
                f"{backlog:>7} pending  fetch of 16:              {summary(await explain(conn, 'job_fetch_and_lease', fetch))}"
            )
        leases = await jobs.fetch_and_lease(conn, owner="bench", kinds={KIND: 30.0}, limit=16)
        ids, tokens, n = (
            [lease.job_id for lease in leases],
            [lease.lease_token for lease in leases],
            len(leases),
        )
        beat = {"job_ids": ids, "lease_tokens": tokens, "ttls": [30.0] * n, "now": None, "tenant": None}
        print(
            f"{backlog:>7} pending  heartbeat of 16:          {summary(await explain(conn, 'lease_extend_if_held', beat))}"
        )
        finish = {
            "job_ids": ids,
            "lease_tokens": tokens,
            "states": ["succeeded"] * n,
            "bys": ["bench"] * n,
            "reasons": [None] * n,
            "errors": [None] * n,
            "unrecoverables": [False] * n,
            "now": None,
            "tenant": None,
        }
        for _ in range(3):
            print(
                f"{backlog:>7} pending  finish batch of 16:       {summary(await explain(conn, 'job_finish_if_leased', finish))}"
            )
        await conn.execute(
            "UPDATE jobs SET run_at = now() - interval '1 hour', updated_at = now() - interval '1 hour'"
            " WHERE state = 'pending'"
        )
        await conn.execute("VACUUM ANALYZE jobs")
        print(
            f"{backlog:>7} pending  waker, backlog 1 h old:   {summary(await explain(conn, 'job_wake_stale_pending', waker))}"
        )


async def commit_cost(url: str, n: int = 200) -> None:
    """Round trip of SELECT 1 against an autocommit INSERT (a commit waits for the WAL flush)."""
    conn = await db.connect(url)
    async with conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (x int)")
        for label, query in (
            ("SELECT 1", "SELECT 1"),
            ("INSERT + commit", "INSERT INTO bench_commit_probe VALUES (1)"),
        ):
            started = time.perf_counter()
            for _ in range(n):
                await conn.execute(query)  # type: ignore[arg-type]
            print(f"{label:16s}: {(time.perf_counter() - started) / n * 1e3:.2f} ms per statement")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", default="3000,100000")
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        asyncio.run(commit_cost(url))
        for round_, backlog in enumerate(int(b) for b in args.backlog.split(",")):
            asyncio.run(one(url, backlog, round_))
        asyncio.run(commit_cost(url))
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
