"""Leasing on the cluster at few and at many tenants: what one poll costs, and the drain a user sees.

    python -m tests.citus.lease_bench --url postgresql://postgres@127.0.0.1:9720/postgres [--jobs 20000]
        [--tenants 10,1000,10000] [--limit 16] [--seconds 8] [--rounds 2] [--drainers 1] [--sketch] [--explain]
        [--node-statements]

One fresh schema per tenant count, migrated and distributed (tests/citus/ledger.py). Each is filled with ``--jobs``
pending jobs by real claims: one delivery, one effect per call of ``claim_deliveries(topology=CITUS)``, which
is one routed ``effect_claim_tenant_v1`` call, ``--clients`` connections side by side, delivery i for tenant
i mod N, so the tenants interleave in claim (run_at) order as live traffic would; then VACUUM ANALYZE.

Then, alternating tenant counts (and modes) for ``--rounds`` rounds of ``--seconds`` each, ``--drainers``
connections each do what a worker does with its slots free: ``jobs.fetch_and_lease(topology=CITUS,
limit=--limit)`` (16 is the worker's default concurrency), then ``finish_many(topology=CITUS)`` of every lease
as succeeded. Every statement a drainer sends is timed on the client: per poll, how many the fetch and the finish
sent, the ``job_tenants_due`` read alone, the whole fetch, the finish. The rate is the succeeded jobs each phase
left in the database, per second; the ratios are against the statement at the fewest tenants, in the same run.
Per job, with ``--node-statements``: the statements the coordinator ran in the phase (what the drainers sent it)
and those the worker nodes ran (what the coordinator sent them), from ``pg_stat_statements`` reset on every node
before the phase and summed after. Unlike the per-poll counts above (statements sent through ``execute``) these
count all: BEGIN, SAVEPOINT and COMMIT, each row of an ``executemany``, and the little the Citus daemons send in
those seconds. That needs ``pg_stat_statements`` in every node's ``shared_preload_libraries`` and the extension
created (on the coordinator: Citus creates it on the workers too).

``--sketch`` adds a mode with the per-tenant statement replaced by ``lease_sketch`` (tests/citus/lease_sketch.sql,
never shipped): the candidate of a routed per-tenant function, measured before anyone writes it. A last line
gives the p50 of the cheapest statement shapes from the coordinator (``floor``); ``--explain`` prints EXPLAIN
ANALYZE of ``job_tenants_due`` at the most tenants. The schemas are dropped at the end. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psycopg

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Delivery, EffectRequest, claim_deliveries
from effectgate.ledger.cluster import topology
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.queries import Q
from effectgate.ledger.vocabulary import JobState
from tests.topologies import CITUS

from .ledger import distributed_ledger

SKETCH = Path(__file__).with_name("lease_sketch.sql")
KIND = "lease-bench"
TTL = 60.0


class Timed:
    """A connection that times every statement sent through ``execute`` (what ``ledger`` sends), and is otherwise
    the connection itself: the drainer's statements are counted, not guessed from the code."""

    def __init__(self, conn: db.Conn) -> None:
        self.conn = conn
        self.statements: list[tuple[str, float]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.conn.execute(query, params, **kwargs)
        finally:
            self.statements.append((str(query), time.perf_counter() - started))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


@dataclass(frozen=True)
class Poll:
    """One fetch and the finish of what it leased, as the drainer's connection saw them (seconds)."""

    leased: int
    fetch_statements: int
    due: float
    fetch: float
    finish_statements: int = 0
    finish: float = 0.0


@dataclass
class Phase:
    tenants: int
    finished: int
    seconds: float
    polls: list[Poll] = field(default_factory=list)
    # What the coordinator and the worker nodes ran in the phase (--node-statements), else None.
    coordinator_statements: int | None = None
    node_statements: int | None = None

    @property
    def rate(self) -> float:
        return self.finished / self.seconds


async def fill(url: str, schema: str, n_jobs: int, tenants: int, clients: int) -> float:
    async def client(c: int) -> None:
        conn = await db.connect(url, schema=schema)
        async with conn:
            for i in range(c, n_jobs, clients):
                key = f"job-{i}"
                payload = {"key": key}
                d = Delivery(
                    f"r-{key}", f"tenant-{i % tenants}", "stripe", f"evt-{key}", "charge.succeeded",
                    payload, fingerprint(payload), 0,
                )  # fmt: skip
                await claim_deliveries(conn, [(d, [EffectRequest(key, KIND, 5, "redrive")])], topology=CITUS)

    started = time.monotonic()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return time.monotonic() - started


async def succeeded(conn: db.Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM jobs WHERE state = 'succeeded'")).fetchone()
    assert row is not None
    return int(row["n"])


async def sketch_fetch(conn: db.Conn, limit: int) -> list[tuple[int, int, str]]:
    """``fetch_and_lease(topology=CITUS)`` with ``lease_sketch`` in place of the routed statement: the same
    tenants_due read, then one call per tenant until ``limit`` are leased."""
    leased: list[tuple[int, int, str]] = []
    for tenant in await jobs.tenants_due(conn, kinds={KIND: TTL}, limit=limit, topology=CITUS):
        cur = await conn.execute(
            "SELECT id, lease_token, tenant FROM lease_sketch(%s, %s, %s, %s, %s, %s, NULL)",
            (tenant, [KIND], [TTL], limit - len(leased), jobs.FETCH_SCAN_LIMIT, "lease-bench"),
        )
        leased += [(r["id"], r["lease_token"], r["tenant"]) for r in await cur.fetchall()]
        if len(leased) >= limit:
            break
    return leased


def worker_nodes(url: str) -> list[str]:
    """The active worker nodes' conninfo, with the coordinator's user and database."""
    with psycopg.connect(url, autocommit=True) as c:
        nodes = c.execute(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive AND noderole = 'primary'"
            " ORDER BY nodeport"
        ).fetchall()
    return [psycopg.conninfo.make_conninfo(url, host=host, port=port) for host, port in nodes]


def node_statements(nodes: list[str], *, reset: bool) -> int:
    """The statements ``nodes`` ran since the last reset (the reset and this read left out); with ``reset``,
    starts the count again."""
    total = 0
    for node in nodes:
        with psycopg.connect(node, autocommit=True) as c:
            [(calls,)] = c.execute(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements"
                " WHERE query NOT LIKE '%pg_stat_statements%'"
            ).fetchall()
            total += int(calls)
            if reset:
                c.execute("SELECT pg_stat_statements_reset()")
    return total


def statements_per_job(phases: list[Phase]) -> str:
    """Per job finished, the medians over ``phases`` of the statements the coordinator ran (the drainers sent
    them) and the worker nodes ran (the coordinator sent them); empty without --node-statements."""
    counted = [p for p in phases if p.coordinator_statements is not None and p.node_statements is not None]
    if not counted:
        return ""
    sent = statistics.median((p.coordinator_statements or 0) / max(p.finished, 1) for p in counted)
    ran = statistics.median((p.node_statements or 0) / max(p.finished, 1) for p in counted)
    return f"; per job {sent:.2f} statements to the coordinator, {ran:.2f} from it to the worker nodes"


async def drain(
    url: str,
    schema: str,
    tenants: int,
    mode: str,
    limit: int,
    seconds: float,
    drainers: int,
    nodes: list[str],
) -> Phase:
    """One phase; ``nodes`` (the worker nodes' conninfo, --node-statements) has its statements counted."""

    async def loop(until: float) -> list[Poll]:
        conn = await db.connect(url, schema=schema)
        async with conn:
            timed = Timed(conn)
            worker = cast(db.Conn, timed)
            polls: list[Poll] = []
            while time.monotonic() < until:
                timed.statements.clear()
                t0 = time.perf_counter()
                if mode == "sketch":
                    leases = await sketch_fetch(worker, limit)
                else:
                    leases = [
                        (x.job_id, x.lease_token, x.tenant)
                        for x in await jobs.fetch_and_lease(
                            worker, owner="lease-bench", kinds={KIND: TTL}, limit=limit, topology=CITUS
                        )
                    ]
                fetch = time.perf_counter() - t0
                due = sum(s for q, s in timed.statements if q == Q["job_tenants_due"])
                fetched = len(timed.statements)
                if not leases:
                    polls.append(Poll(0, fetched, due, fetch))
                    break
                t1 = time.perf_counter()
                await jobs.finish_many(
                    worker,
                    [
                        jobs.Finish(i, token, JobState.SUCCEEDED, "lease-bench", tenant=t)
                        for i, token, t in leases
                    ],
                    topology=CITUS,
                )
                finish = time.perf_counter() - t1
                polls.append(Poll(len(leases), fetched, due, fetch, len(timed.statements) - fetched, finish))
            return polls

    conn = await db.connect(url, schema=schema)
    async with conn:
        before = await succeeded(conn)
        if nodes:
            node_statements([url, *nodes], reset=True)
        started = time.monotonic()
        polls = await asyncio.gather(*(loop(started + seconds) for _ in range(drainers)))
        took = time.monotonic() - started
        phase = Phase(tenants, 0, took, [x for p in polls for x in p])
        if nodes:
            phase.coordinator_statements = node_statements([url], reset=False)
            phase.node_statements = node_statements(nodes, reset=False)
        phase.finished = await succeeded(conn) - before
        return phase


# The discovery read with no subplans: the same rows' tenants as job_tenants_due (deduplicated by the caller), the
# clock not in a sub-select and no GROUP BY, so Citus sends one query to every shard and merges the LIMITs.
PLAIN_DUE = """SELECT w.tenant FROM jobs w
    WHERE w.state = 'pending' AND w.run_at <= coalesce(%(now)s, now()) AND w.kind = ANY(%(kinds)s::text[])
      AND NOT EXISTS (SELECT 1 FROM paused_kinds p WHERE p.kind = w.kind)
    ORDER BY w.run_at, w.id LIMIT %(limit)s"""


async def floor(url: str, schema: str, tenants: int, limit: int) -> dict[str, float]:
    """The p50 of the cheapest statements of each shape from the coordinator, interleaved: a read routed to one
    tenant's shard (no per-tenant fetch costs less), a read sent to every shard (no discovery costs less), the
    discovery read without subplans (PLAIN_DUE), and job_tenants_due itself."""
    conn = await db.connect(url, schema=schema)
    async with conn:
        due = {"kinds": [KIND], "limit": limit, "now": None}
        shapes: dict[str, tuple[str, Any]] = {
            "routed read": ("SELECT id FROM jobs WHERE tenant = %(tenant)s LIMIT 1", {}),
            "every-shard read": ("SELECT id FROM jobs WHERE id = -1", {}),
            "plain ordered LIMIT read": (PLAIN_DUE, due),
            "job_tenants_due": (Q["job_tenants_due"], due),
        }
        times: dict[str, list[float]] = {name: [] for name in shapes}
        for i in range(100):
            for name, (query, params) in shapes.items():
                t0 = time.perf_counter()
                await conn.execute(query, {**params, "tenant": f"tenant-{i % tenants}"})
                times[name].append(time.perf_counter() - t0)
        return {name: statistics.median(xs) for name, xs in times.items()}


async def explain(url: str, schema: str, limit: int) -> str:
    conn = await db.connect(url, schema=schema)
    async with conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(
            "EXPLAIN (ANALYZE) " + Q["job_tenants_due"],
            {"kinds": [KIND], "limit": limit, "now": None},
        )
        return "\n".join(next(iter(r.values())) for r in await cur.fetchall())


def ms(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1000:.1f} ms, p90 {sorted(xs)[int(len(xs) * 0.9)] * 1000:.1f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--tenants", default="10,1000,10000")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--drainers", type=int, default=1)
    parser.add_argument("--sketch", action="store_true")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--node-statements", action="store_true")
    args = parser.parse_args()
    nodes = worker_nodes(args.url) if args.node_statements else []
    counts = [int(n) for n in args.tenants.split(",")]
    modes = ["statement", "sketch"] if args.sketch else ["statement"]
    run = uuid.uuid4().hex[:6]
    schemas = {n: f"effectgate_lease_{run}_{n}" for n in counts}
    phases: dict[tuple[int, str], list[Phase]] = {(n, m): [] for n in counts for m in modes}
    try:
        for n, schema in schemas.items():
            await distributed_ledger(args.url, schema)
            conn = await db.connect(args.url, schema=schema)
            async with conn:
                assert (await topology.read(conn)).claims_routed, (
                    "migrate did not distribute the claim function"
                )
            took = await fill(args.url, schema, args.jobs, n, args.clients)
            with psycopg.connect(args.url, autocommit=True) as c:
                c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
                if args.sketch:
                    c.execute(SKETCH.read_text(encoding="utf-8"))
                # As autovacuum would in time: every phase then drains tables in the same state, not the first
                # phase beside the fill's vacuum.
                c.execute("VACUUM ANALYZE jobs, effects")
            print(f"fill {n} tenants: {args.jobs} jobs by routed claims in {took:.1f}s", flush=True)
        for r in range(args.rounds):
            for n, schema in schemas.items():
                for mode in modes:
                    p = await drain(args.url, schema, n, mode, args.limit, args.seconds, args.drainers, nodes)
                    phases[n, mode].append(p)
                    polls = [x for x in p.polls if x.leased]
                    print(
                        f"round {r} {n} tenants, {mode}: {p.finished} jobs leased and finished in"
                        f" {p.seconds:.1f}s = {p.rate:.0f}/s; {len(polls)} polls, per poll"
                        f" {statistics.mean(x.leased for x in polls):.1f} leased,"
                        f" {statistics.mean(x.fetch_statements for x in polls):.1f} fetch and"
                        f" {statistics.mean(x.finish_statements for x in polls):.1f} finish statements;"
                        f" tenants_due {ms([x.due for x in polls])}; whole fetch {ms([x.fetch for x in polls])};"
                        f" finish {ms([x.finish for x in polls])}" + statements_per_job([p]),
                        flush=True,
                    )
        shapes = await floor(args.url, schemas[counts[-1]], counts[-1], args.limit)
        print(
            f"p50 at {counts[-1]} tenants: " + "; ".join(f"{k} {v * 1000:.1f} ms" for k, v in shapes.items())
        )
        if args.explain:
            print(await explain(args.url, schemas[counts[-1]], args.limit))
    finally:
        with psycopg.connect(args.url, autocommit=True) as c:
            for schema in schemas.values():
                c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    summary(phases, counts, modes)


def summary(phases: dict[tuple[int, str], list[Phase]], counts: list[int], modes: list[str]) -> None:
    first = counts[0]

    def median(n: int, mode: str, f: Callable[[Poll], float]) -> float:
        return statistics.median(f(x) for p in phases[n, mode] for x in p.polls if x.leased)

    def per_fetch(x: Poll) -> float:
        return (x.fetch - x.due) / (x.fetch_statements - 1)

    def rate(n: int, mode: str) -> float:
        return statistics.median(p.rate for p in phases[n, mode])

    for mode in modes:
        for n in counts:
            due, fetch, finish = (
                median(n, mode, f) for f in (lambda x: x.due, lambda x: x.fetch, lambda x: x.finish)
            )
            print(
                f"{mode}, {n} tenants: median {rate(n, mode):.0f} jobs/s"
                f" ({rate(n, mode) / rate(first, 'statement'):.2f}x of statement at {first} tenants);"
                f" statements per poll {median(n, mode, lambda x: x.fetch_statements):.0f} fetch"
                f" + {median(n, mode, lambda x: x.finish_statements):.0f} finish;"
                f" p50 tenants_due {due * 1000:.1f} ms ({due / median(first, mode, lambda x: x.due):.2f}x),"
                f" whole fetch {fetch * 1000:.1f} ms ({fetch / median(first, mode, lambda x: x.fetch):.2f}x),"
                f" finish {finish * 1000:.1f} ms ({finish / median(first, mode, lambda x: x.finish):.2f}x);"
                f" per tenant: fetch statement {median(n, mode, per_fetch) * 1000:.1f} ms,"
                f" finish statement {median(n, mode, lambda x: x.finish / x.finish_statements) * 1000:.1f} ms"
                + statements_per_job(phases[n, mode])
            )
    if "sketch" in modes:
        for n in counts:
            print(
                f"sketch / statement at {n} tenants: {rate(n, 'sketch') / rate(n, 'statement'):.2f}x jobs/s"
            )


if __name__ == "__main__":
    asyncio.run(main())
