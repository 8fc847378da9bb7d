"""A fresh ledger on the cluster, the way the guide sets one up: migrated on the coordinator, then distributed by
deploy/citus/distribute.sql (deploy/README.md, "Past one Postgres"). Shared by the tests and the run scripts."""

from __future__ import annotations

from pathlib import Path

import psycopg

from effectgate.ledger import db
from effectgate.ledger.migrate import migrate

DISTRIBUTE = Path(__file__).parents[2] / "deploy" / "citus" / "distribute.sql"


async def distributed_ledger(url: str, schema: str) -> None:
    """Migrate ``schema`` on the coordinator at ``url`` and distribute it by tenant."""
    conn = await db.connect(url, schema=schema)
    async with conn:
        await migrate(conn, schema=schema)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        c.execute(DISTRIBUTE.read_text(encoding="utf-8"))  # type: ignore[arg-type]
