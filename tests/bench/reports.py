"""Benchmark: fill a ledger with ~1M effects (and their jobs, deliveries, attempts, rejects, signature
failures), then time every operator report with every filter and show the plan each one ran.

    python -m tests.bench.reports [--effects 1000000] [--keep]

Uses ``BENCH_DATABASE_URL`` or ``TEST_DATABASE_URL`` when set, else a throwaway embedded Postgres;
creates its own database and drops it afterwards (``--keep`` leaves it, and prints its URL). Each report runs through
``ledger.reports`` itself — the code path of the CLI, the API and the dashboard — with a connection that
also EXPLAINs every statement it is sent, so the output proves which index served each filter.

Prints one line per report: median latency of 5 warm runs, rows, the indexes its plans used, and any
sequential scan of a ledger table. Exits 1 if a report took a second or more or read a ledger table
sequentially. This is a benchmark, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

from psycopg import sql

from effectgate.gateway.operator import reporting
from effectgate.gateway.operator.params import parse_window
from effectgate.ledger import db, reports
from effectgate.ledger.reports.spec import ReportSpec

from .common import drop_database, fresh_database, server_url

LEDGER_TABLES = {
    "effects",
    "jobs",
    "deliveries",
    "effect_rejects",
    "job_attempts",
    "signature_failures",
    "steps",
}
BUDGET_MS = 1000.0
# A sequential scan of a table this small can be the best plan (a month of key conflicts is the whole
# table); above it, a sequential scan means a filter without an index.
SEQ_SCAN_ROWS = 100_000

FILL = [
    (
        "effects",
        """
        INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                             delivery_count, reject_count, first_seen_at, last_seen_at)
        SELECT 'tenant-' || (g % 3), 'key:' || g, src, 'kind-' || (g % 5), 'evt_' || g, 'type.' || (g % 10),
               md5(g::text), jsonb_build_object('id', g, 'amount', g % 1000, 'currency', 'eur'),
               dc, (g % 100 = 7)::int, seen,
               CASE WHEN dc > 1 THEN least(now(), seen + (g % 97) * interval '30 minutes') ELSE seen END
        FROM (
            SELECT g,
                   CASE WHEN g % 50 = 3 THEN 'rare' WHEN g % 10 < 6 THEN 'stripe'
                        WHEN g % 10 < 9 THEN 'shopify' ELSE 'github' END AS src,
                   CASE WHEN g % 10 = 3 THEN 2 + g % 4 ELSE 1 END AS dc,
                   -- ids grow with time, as they do in a real ledger: 30 days, oldest first.
                   now() - (1 - g::float8 / %(n)s) * interval '30 days' AS seen
            FROM generate_series(1, %(n)s) g
        ) s
        """,
    ),
    (
        "jobs",
        """
        INSERT INTO jobs (effect_id, tenant, kind, state, attempt, max_attempts, orphan_policy, run_at, lease_token,
                          lease_owner, lease_expires_at, unrecoverable, terminal_reason, terminal_by, last_error,
                          created_at, updated_at, finished_at)
        SELECT id, tenant, handler, st, CASE WHEN st = 'pending' THEN 0 ELSE 1 END, 5, 'redrive', first_seen_at,
               CASE WHEN st = 'pending' THEN 0 ELSE 1 END,
               CASE WHEN st = 'running' THEN 'bench-worker' END,
               CASE WHEN st = 'running' THEN now() + interval '1 minute' END,
               st = 'failed' AND id % 2 = 0,
               CASE WHEN st IN ('failed', 'parked', 'cancelled', 'succeeded') THEN st::text || ' in bench' END,
               CASE WHEN st IN ('failed', 'parked', 'cancelled', 'succeeded') THEN 'bench' END,
               CASE WHEN st = 'failed' THEN '{"type": "TerminalError", "message": "declined"}'::jsonb END,
               first_seen_at, first_seen_at,
               CASE WHEN st IN ('failed', 'parked', 'cancelled', 'succeeded') THEN first_seen_at + interval '1 second' END
        FROM (
            SELECT e.*, (CASE WHEN id % 100 < 3 THEN 'failed' WHEN id % 100 = 3 THEN 'parked'
                              WHEN id % 100 < 9 THEN 'pending' WHEN id % 100 = 9 THEN 'running'
                              WHEN id % 100 = 10 THEN 'cancelled' ELSE 'succeeded' END)::job_state AS st
            FROM effects e
        ) s
        """,
    ),
    (
        "job_attempts",
        """
        INSERT INTO job_attempts (job_id, tenant, attempt, lease_token, worker, started_at, finished_at, outcome)
        SELECT id, tenant, 1, 1, 'bench-worker', created_at, finished_at, CASE WHEN finished_at IS NOT NULL THEN state::text END
        FROM jobs WHERE attempt > 0
        """,
    ),
    (
        "deliveries",
        """
        INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, effect_id, effect_key,
                                outcome, fingerprint, secret_index)
        SELECT md5(e.id::text || '/' || i), CASE WHEN i = 1 THEN e.first_seen_at ELSE e.last_seen_at END,
               e.tenant, e.source, e.event_id, e.event_type, e.id, e.effect_key,
               CASE WHEN i = 1 THEN 'accepted' ELSE 'duplicate' END, e.fingerprint, 0
        FROM effects e, generate_series(1, e.delivery_count) i
        """,
    ),
    (
        "effect_rejects",
        """
        INSERT INTO effect_rejects (effect_id, tenant, effect_key, source, event_id, event_type, held_fingerprint,
                                    rejected_fingerprint, rejected_payload, received_at)
        SELECT id, tenant, effect_key, source, event_id || '_other', event_type, fingerprint, md5(fingerprint),
               payload || '{"amount": -1, "coupon": "X"}'::jsonb, first_seen_at + interval '5 minutes'
        FROM effects WHERE reject_count > 0
        """,
    ),
    (
        "steps",
        """
        INSERT INTO steps (effect_id, tenant, name, idempotency_key, status, result, job_id, lease_token, recorded_at)
        SELECT effect_id, tenant, 'capture', 'eg_' || md5(effect_id::text), 'succeeded',
               jsonb_build_object('id', 'pi_' || effect_id, 'status', 'succeeded'), id, 1, finished_at
        FROM jobs WHERE state = 'succeeded'
        """,
    ),
    (
        "signature_failures",
        """
        INSERT INTO signature_failures (source, reason, minute, count, bytes_total, last_body_sha256, last_detail,
                                        last_seen_at)
        SELECT src, (ARRAY['signature_invalid', 'signature_missing', 'timestamp_out_of_tolerance'])[1 + m % 3],
               date_trunc('minute', now()) - m * interval '1 minute', 1 + m % 9, 800, md5(m::text), 'bench',
               date_trunc('minute', now()) - m * interval '1 minute'
        FROM generate_series(0, 90 * 1440, 3) m, unnest(ARRAY['stripe', 'shopify']) src
        """,
    ),
]


class ExplainingConn:
    """A connection that EXPLAINs each statement before running it, collecting the plans."""

    def __init__(self, conn: db.Conn) -> None:
        self.conn = conn
        self.plans: list[dict[str, Any]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + (sql.SQL(query) if isinstance(query, str) else query)
        row = await (await self.conn.execute(explain, params, prepare=False)).fetchone()
        assert row is not None
        plan = row["QUERY PLAN"]
        self.plans.append(plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"])
        return await self.conn.execute(query, params, **kwargs)


def _walk(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _walk(child)
    return nodes


def _count(result: Any) -> int:
    for name in ("items", "by_state_kind", "rows"):
        if hasattr(result, name):
            return len(getattr(result, name))
    if isinstance(result, reports.EffectView):
        return len(result.deliveries) + len(result.attempts)
    if isinstance(result, reports.JobView):
        return 1 + len(result.attempts)
    return 0


async def bench(
    conn: db.Conn, name: str, call: Callable[[Any], Awaitable[Any]], sizes: dict[str, int]
) -> bool:
    result = await call(conn)  # warm the cache and the plan
    times = []
    for _ in range(5):
        started = time.perf_counter()
        result = await call(conn)
        times.append((time.perf_counter() - started) * 1000)
    explaining = ExplainingConn(conn)
    await call(explaining)
    nodes = [node for plan in explaining.plans for node in _walk(plan)]
    indexes = sorted({n["Index Name"] for n in nodes if "Index Name" in n})
    seq = sorted({n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"} & LEDGER_TABLES)
    big = [t for t in seq if sizes[t] > SEQ_SCAN_ROWS]
    median = statistics.median(times)
    ok = median < BUDGET_MS and not big
    print(
        f"{'ok ' if ok else 'BAD'} {median:8.1f} ms  {_count(result):5d} rows  {name:<52} "
        f"{', '.join(indexes) or '-'}"
        + "".join(f"  seq scan: {t} ({sizes[t]:,} rows{', NO INDEX USED' if t in big else ''})" for t in seq),
        flush=True,
    )
    return ok


# Each report with each filter and order, as the query string an operator would send.
REPORT_CASES = [
    *(
        (reports.DUPLICATES, q)
        for q in ("", "source=rare", "tenant=tenant-2", "event_type=type.3", "since=30d")
    ),
    *((reports.DUPLICATES, f"since=30d&sort={s.name}") for s in reports.DUPLICATES.sorts[1:]),
    (reports.DUPLICATES, "since=30d&source=rare&limit=1000"),
    *((reports.KEY_CONFLICTS, q) for q in ("", "since=30d&source=rare", "since=30d&tenant=tenant-1")),
    (reports.KEY_CONFLICTS, "since=30d&event_type=type.7"),
    *((reports.AUTH_FAILURES, q) for q in ("", "since=7d&source=shopify")),
    *((reports.JOBS, q) for q in ("", "state=parked", "state=failed,parked", "kind=kind-3", "source=rare")),
    *((reports.JOBS, q) for q in ("source=github&state=parked", "since=1h", "until=7d&sort=created")),
    # Every report, those added since included, over its default window and over a week.
    *((spec, query) for spec in reports.REPORTS for query in ("", "since=7d")),
]


def report(spec: ReportSpec, **text: str) -> Callable[[Any], Awaitable[Any]]:
    """Run a report the way every face does: from text parameters, through the gateway's reading."""
    return lambda c: reporting.fetch(c, spec, text)


def activity(since: str | None = None) -> Callable[[Any], Awaitable[Any]]:
    start, end = parse_window(since, None, now=datetime.now(UTC), default=reports.DEFAULT_WINDOW)
    assert start is not None and end is not None
    return lambda c: reports.activity(c, since=start, until=end)


async def run_reports(url: str) -> bool:
    conn = await db.connect(url)
    async with conn:
        first = await reporting.fetch(conn, reports.DUPLICATES, {"since": "30d", "limit": "5"})
        deep = first
        for _ in range(20):
            cursor = reporting.next_cursor(deep)
            assert cursor is not None
            deep = await reporting.fetch(
                conn, reports.DUPLICATES, {"since": "30d", "limit": "5", "cursor": cursor}
            )
        deep_cursor = reporting.next_cursor(deep) or ""
        some_key = first.items[0]["effect_key"]
        failed = await reporting.fetch(conn, reports.JOBS, {"state": "failed", "limit": "1"})
        job_id = failed.items[0]["id"]
        cases: list[tuple[str, Callable[[Any], Awaitable[Any]]]] = [
            (f"{spec.name} {query or '(default window)'}", report(spec, **dict(parse_qsl(query))))
            for spec, query in REPORT_CASES
        ]
        cases += [
            (
                "duplicates since=30d page 22 (cursor)",
                report(reports.DUPLICATES, since="30d", limit="5", cursor=deep_cursor),
            ),
            (
                "effect lineage by key + tenant",
                lambda c: reports.effect_view(c, some_key, tenant=first.items[0]["tenant"]),
            ),
            ("effect lineage by key, any tenant", lambda c: reports.effect_view(c, some_key)),
            ("job view", lambda c: reports.job_view(c, job_id)),
            ("metrics job gauges", lambda c: reports.job_gauges(c)),
            ("dashboard activity (24h, hourly)", activity()),
            ("dashboard activity (30d, daily)", activity("30d")),
        ]
        sizes = {}
        for table in LEDGER_TABLES:
            row = await (await conn.execute(f"SELECT count(*) AS n FROM {table}")).fetchone()  # type: ignore[arg-type]
            assert row is not None
            sizes[table] = int(row["n"])
        results = [await bench(conn, name, call, sizes) for name, call in cases]
    return all(results)


async def fill(url: str, effects: int) -> None:
    conn = await db.connect(url)
    async with conn:
        for table, sql in FILL:
            started = time.perf_counter()
            # No parameters: the fill SQL uses % as modulo, and the count is a trusted int.
            await conn.execute(sql.replace("%(n)s", str(int(effects))))  # type: ignore[arg-type]
            row = await (await conn.execute(f"SELECT count(*) AS n FROM {table}")).fetchone()  # type: ignore[arg-type]
            assert row is not None
            print(
                f"filled {table:<20} {row['n']:>9} rows in {time.perf_counter() - started:5.1f} s", flush=True
            )
        await conn.execute("VACUUM ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        asyncio.run(fill(url, args.effects))
        print(f"\nreports over {args.effects:,} effects (median of 5 warm runs; budget {BUDGET_MS:.0f} ms):")
        ok = asyncio.run(run_reports(url))
    finally:
        if args.keep:
            print(f"kept: {url}")
        else:
            drop_database(server, url)
    print(
        f"every report under {BUDGET_MS:.0f} ms, and no sequential scan of a ledger table over {SEQ_SCAN_ROWS:,} rows"
        if ok
        else "FAILED"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
