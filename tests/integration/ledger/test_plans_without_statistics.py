"""The worker's hot statements keep their plan on a ledger Postgres has no statistics for yet.

A new ledger's first backlog (the day after an outage, on a deployment a week old) is drained before
autovacuum's first ANALYZE of ``jobs``. Without statistics, a fetch that locked each row by ``id`` alone, and
a finish that matched its rows by ``id`` alone, were planned as skip scans of a partial index (the due index,
the lease-expiry index): one index search per distinct prefix of that index rather than one per row, and the
lease-expiry index's dead entries walked too until autovacuum (docs/performance.md, "The worker's plans"). Each statement now names the whole primary key
(id, tenant), so the row is one probe of ``jobs_pkey`` with or without statistics.

The ledger here is filled with autovacuum off on its tables and never analyzed; every scan of ``jobs`` that
locks, leases or finishes a row (aliases ``j``, ``j_1``, …) must be a probe of ``jobs_pkey``, and the head of
each kind's due jobs a walk of that kind's index.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db, jobs
from tests.bench.reports import FILL
from tests.conftest import database_url
from tests.integration.ledger.backlog_plans import JOBS, KINDS, nodes, plans_of

pytestmark = pytest.mark.anyio

EFFECTS = 30_000


@pytest.fixture(scope="module")
def unanalyzed_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    name = f"effectgate_nostats_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = database_url(pg_server_url, name)
    with psycopg.connect(url, autocommit=True, options=f"-c search_path={db.DEFAULT_SCHEMA}") as c:
        for table in ("effects", "jobs", "job_attempts"):
            c.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")  # type: ignore[arg-type]
        c.execute(dict(FILL)["effects"].replace("%(n)s", str(EFFECTS)))  # type: ignore[arg-type]
        c.execute(JOBS)  # type: ignore[arg-type]
    yield url
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def conn(unanalyzed_url: str) -> AsyncIterator[db.Conn]:
    c = await db.connect(unanalyzed_url)
    async with c:
        yield c


def row_probes(plan: dict[str, Any]) -> dict[str, str]:
    """Each scan of ``jobs`` that reaches a row to lock, lease or finish it: its alias and the index it uses."""
    return {
        n["Alias"]: n.get("Index Name", n["Node Type"])
        for n in nodes(plan)
        if n.get("Relation Name") == "jobs" and (n["Alias"] == "j" or n["Alias"].startswith("j_"))
    }


async def test_the_ledger_has_no_statistics_for_jobs(conn: db.Conn) -> None:
    row = await (
        await conn.execute(
            "SELECT c.reltuples, s.last_analyze, s.last_autoanalyze FROM pg_class c"
            " JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'jobs'::regclass"
        )
    ).fetchone()
    assert row == {"reltuples": -1, "last_analyze": None, "last_autoanalyze": None}


async def test_fetch_and_finish_reach_each_row_by_its_primary_key_without_statistics(conn: db.Conn) -> None:
    async def fetch_then_finish(c: Any) -> None:
        leased = await jobs.fetch_and_lease(c, owner="nostats", kinds=KINDS, limit=16)
        assert len(leased) == 16
        finishes = [
            jobs.Finish(x.job_id, x.lease_token, "succeeded", "nostats", tenant=x.tenant) for x in leased
        ]
        # Run twice (EXPLAIN ANALYZE, then for real): the second finds them finished, which is not the point.
        await jobs.finish_many(c, finishes)

    plans = dict(await plans_of(conn, fetch_then_finish, analyze=True))
    probes = {name: row_probes(plans[name]) for name in ("job_fetch_and_lease", "job_finish_if_leased")}
    assert all(probes.values()), probes
    assert {index for found in probes.values() for index in found.values()} == {"jobs_pkey"}, probes
    # The head of each kind's due jobs is walked on that kind's index (with the tenant carried, migration 0026),
    # not on jobs_due_idx, which holds every kind's due jobs.
    heads = {
        n.get("Index Name", n["Node Type"])
        for n in nodes(plans["job_fetch_and_lease"])
        if n.get("Relation Name") == "jobs" and n["Alias"] == "w"
    }
    assert heads == {"jobs_kind_due_tenant_idx"}, heads
