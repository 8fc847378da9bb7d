"""Benchmark: how long migration 0022 (keys with tenant) holds a populated ledger.

    python -m tests.bench.keys_with_tenant [--rows 200000]

A ledger migrated through 0021 gets ``--rows`` effects, each with a finished job, one attempt and one step
(the four tables 0022 rewrites or re-keys), then 0022 alone is applied and timed: the window in which its
exclusive locks stop claims and workers (docs/migrations.md). Prints the figure; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from effectgate.ledger import db
from effectgate.ledger.migrate import MIGRATIONS_DIR, discover, migrate

from .common import drop_database, server_url

SEED = """
INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                     first_seen_at, last_seen_at)
SELECT 'tenant-' || (g %% 50), 'k' || g, 'stripe', 'charge', 'evt' || g, 'charge.succeeded', md5(g::text),
       '{"a": 1}', now(), now()
FROM generate_series(1, %(rows)s) g;
INSERT INTO jobs (effect_id, tenant, kind, state, max_attempts, orphan_policy, run_at, created_at, updated_at,
                  finished_at, attempt, lease_token)
SELECT id, tenant, 'charge', 'succeeded', 5, 'redrive', now(), now(), now(), now(), 1, 1 FROM effects;
INSERT INTO job_attempts (job_id, attempt, lease_token, worker, started_at)
SELECT id, 1, 1, 'bench', now() FROM jobs;
INSERT INTO steps (effect_id, name, idempotency_key, status, job_id, lease_token, recorded_at)
SELECT effect_id, 'capture', 'idem-' || id, 'succeeded', id, 1, now() FROM jobs;
"""


async def run(url: str, rows: int) -> float:
    before = Path(tempfile.mkdtemp(prefix="effectgate-before-0022-"))
    for m in discover():
        if m.name < "0022":
            shutil.copyfile(str(MIGRATIONS_DIR.joinpath(m.name)), before / m.name)
    conn = await db.connect(url)
    async with conn:
        await migrate(conn, before)
        for statement in SEED.split(";\n"):
            if statement.strip():
                await conn.execute(statement, {"rows": rows})  # type: ignore[arg-type]
        await conn.execute("VACUUM ANALYZE")
        # 0022 alone: the later migrations are not what is timed.
        shutil.copyfile(
            str(MIGRATIONS_DIR.joinpath("0022_keys_with_tenant.sql")), before / "0022_keys_with_tenant.sql"
        )
        started = time.monotonic()
        assert await migrate(conn, before) == ["0022_keys_with_tenant.sql"]
        took = time.monotonic() - started
    shutil.rmtree(before)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    server = server_url()

    name = f"effectgate_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    url = make_conninfo(server, dbname=name)
    try:
        took = asyncio.run(run(url, args.rows))
    finally:
        drop_database(server, url)
    print(f"migration 0022 on {args.rows:,} effects, jobs, attempts and steps: {took:.1f} s")


if __name__ == "__main__":
    main()
