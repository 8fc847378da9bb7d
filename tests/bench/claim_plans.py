"""Benchmark: the batched claim statement's plan on an empty ledger and on one already holding N effects.

    python -m tests.bench.claim_plans [--effects 20000] [--batch 8] [--runs 30] [--rounds 2]

What `python -m tests.bench.compare --only growth` compares as a rate, read as a plan: two fresh databases,
one filled as the compare benchmark fills it (tests/bench/reports.py ``fill``, then CHECKPOINT), then, in
turn on each, ``--runs`` batches of ``--batch`` new deliveries claimed through ``claim_deliveries`` with the
claim statement under EXPLAIN (ANALYZE, BUFFERS) (it runs, and commits, as it would). Prints per ledger the
median and range of execution and planning time and the buffers the statement touched, then the buffers of
each node that differ between the two last plans. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import uuid
from typing import Any

import psycopg

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_deliveries
from effectgate.ledger.fingerprints import fingerprint

from .claims import PAYLOAD
from .common import drop_database, fresh_database, server_url
from .reports import fill


class _Explained(Exception):
    """Raised by the wrapped connection once it has the plan: the claim's answer is not needed."""


async def explain_claims(url: str, runs: int, batch: int) -> list[str]:
    """The claim statement's EXPLAIN (ANALYZE, BUFFERS) text for ``runs`` batches of ``batch`` new keys."""
    conn = await db.connect(url)
    plans: list[str] = []
    execute = conn.execute

    async def explaining(query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(params, dict) and "payloads" in params:  # the claim statement's own parameters
            cur = await execute("EXPLAIN (ANALYZE, BUFFERS) " + query, params, **kw)
            plans.append("\n".join(row["QUERY PLAN"] for row in await cur.fetchall()))
            raise _Explained
        return await execute(query, params, **kw)

    conn.execute = explaining  # type: ignore[method-assign]
    fp = fingerprint(PAYLOAD)
    async with conn:
        for _ in range(runs):
            items = []
            for _ in range(batch):
                key = uuid.uuid4().hex
                delivery = Delivery(key, "default", "bench", key, "payment_intent.succeeded", PAYLOAD, fp, 0)
                items.append((delivery, [EffectRequest(f"k:{key}", "bench", 5, "park")]))
            try:
                await claim_deliveries(conn, items)
            except _Explained:
                pass
            if conn.info.transaction_status:
                await execute("ROLLBACK")
    return plans


def figure(plans: list[str], pattern: str) -> list[float]:
    return [float(m.group(1)) for p in plans if (m := re.search(pattern, p))]


def summary(plans: list[str]) -> str:
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ms ({min(values):.2f}-{max(values):.2f})"

    buffers = figure(plans, r"Buffers: shared hit=(\d+)")
    execution = figure(plans, r"Execution Time: ([\d.]+)")
    planning = figure(plans, r"Planning Time: ([\d.]+)")
    return (
        f"execution {spread(execution)}, planning {spread(planning)}, "
        f"buffers hit {statistics.median(buffers):.0f} ({min(buffers):.0f}-{max(buffers):.0f})"
    )


def node_buffers(plan: str) -> list[tuple[str, str]]:
    """(node, its Buffers line) for each node of a plan, in order."""
    out: list[tuple[str, str]] = []
    node = "the statement"
    for line in plan.splitlines():
        if "->" in line or line.lstrip().startswith(("Insert", "Update", "CTE", "Result", "Nested")):
            node = re.sub(r"\s*\(.*", "", line.strip().removeprefix("-> ").strip())
        elif line.strip().startswith("Buffers:"):
            out.append((node, line.strip()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=8, help="deliveries per claim statement")
    parser.add_argument("--runs", type=int, default=30, help="statements per ledger per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    server = server_url()
    empty, full = fresh_database(server), fresh_database(server)
    last: dict[str, str] = {}
    try:
        asyncio.run(fill(full, args.effects))
        with psycopg.connect(full, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        for n in range(args.rounds):
            for name, url in (("empty ledger", empty), (f"{args.effects:,} effects", full)):
                # The first few of a connection plan and cache their statement: left out.
                plans = asyncio.run(explain_claims(url, args.runs, args.batch))[5:]
                print(
                    f"round {n + 1}, {name:>15}, {args.batch} deliveries a statement: {summary(plans)}",
                    flush=True,
                )
                last[name] = plans[-1]
    finally:
        drop_database(server, empty)
        drop_database(server, full)
    (a_name, a), (b_name, b) = last.items()
    print(f"nodes whose buffers differ, last plan of each ({a_name} -> {b_name}):")
    for (node, a_buf), (_, b_buf) in zip(node_buffers(a), node_buffers(b), strict=False):
        if a_buf != b_buf:
            print(f"  {node}: {a_buf.removeprefix('Buffers: ')} -> {b_buf.removeprefix('Buffers: ')}")


if __name__ == "__main__":
    main()
