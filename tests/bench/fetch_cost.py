"""Benchmark: what one fetch (``job_fetch_and_lease``) costs at a backlog, and how many rows of ``jobs`` it reads.

    python -m tests.bench.fetch_cost [--pending 1000,100000,1000000] [--limit 16] [--sql OLD_JOBS_SQL]

For each size: a fresh ledger whose effects and jobs are written with INSERT … SELECT (84 % pending and due,
five kinds, one of them paused, one job in four on a lock key, some held by running jobs; as
tests/integration/ledger/test_query_plans.py builds it), analyzed. Then seven fetches of ``--limit`` jobs for the
four unpaused kinds, each under EXPLAIN ANALYZE and rolled back, in two shapes: as built, and with the paused
kind's jobs made the oldest due ones (the day after an outage: a paused kind's backlog ahead of the rest).
Prints the median execution time and the rows the plan read from ``jobs``. ``--sql`` runs the fetch of
another ``jobs.sql`` too (an older revision: ``git show REV:ledger/sql/jobs.sql > old.sql``), for a
side-by-side. Timings depend on the machine; the rows read do not.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from effectgate.ledger.queries import Q, parse
from tests.bench.reports import FILL
from tests.integration.ledger.backlog_plans import JOBS

from .common import drop_database, fresh_database, server_url

KINDS = ["kind-0", "kind-1", "kind-2", "kind-3"]  # kind-4 is paused


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def fill(url: str, pending: int) -> None:
    effects = round(pending / 0.84)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(dict(FILL)["effects"].replace("%(n)s", str(effects)))  # type: ignore[arg-type]
        c.execute(JOBS)  # type: ignore[arg-type]
        c.execute("INSERT INTO paused_kinds (kind, paused_at, paused_by) VALUES ('kind-4', now(), 'bench')")
        c.execute("VACUUM ANALYZE")


def measure(url: str, query: str, limit: int, ahead: bool) -> tuple[float, float]:
    params = {"owner": "bench", "kinds": KINDS, "ttls": [30.0] * len(KINDS), "limit": limit}
    params |= {"scan_limit": 1000, "now": None, "hooked": [], "tenant": None}
    times, rows = [], []
    with psycopg.connect(url, row_factory=dict_row) as c:
        for _ in range(7):
            with c.transaction(force_rollback=True):
                if ahead:
                    c.execute(
                        "UPDATE jobs SET run_at = run_at - interval '1 year' "
                        "WHERE state = 'pending' AND kind = 'kind-4'"
                    )
                    c.execute("ANALYZE jobs")
                row = c.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()  # type: ignore[operator]
                assert row is not None
                [explained] = row["QUERY PLAN"]
                times.append(explained["Execution Time"])
                rows.append(
                    sum(
                        n.get("Actual Rows", 0) * n.get("Actual Loops", 1)
                        for n in _nodes(explained["Plan"])
                        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
                    )
                )
    return statistics.median(times), statistics.median(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", default="1000,100000,1000000")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--sql", type=Path, help="another jobs.sql whose fetch to run side by side")
    args = parser.parse_args()
    queries = {"this": Q["job_fetch_and_lease"]}
    if args.sql:
        queries["--sql"] = parse(args.sql.read_text(encoding="utf-8"))["job_fetch_and_lease"]
    server = server_url()
    for pending in (int(p) for p in args.pending.split(",")):
        url = fresh_database(server)
        try:
            fill(url, pending)
            for ahead in (False, True):
                for name, query in queries.items():
                    ms, rows = measure(url, query, args.limit, ahead)
                    shape = "paused kind's backlog ahead" if ahead else "as built"
                    print(
                        f"{pending:>9,} pending  {shape:<28}  fetch ({name:<5}) of {args.limit}: "
                        f"{ms:7.2f} ms median, {rows:>9,.0f} rows of jobs read",
                        flush=True,
                    )
        finally:
            drop_database(server, url)


if __name__ == "__main__":
    main()
