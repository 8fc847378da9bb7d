"""The pool after its server moved under it: a dead connection or a read-only server never reaches a caller."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from effectgate.ledger import db
from effectgate.ledger.errors import LedgerUnavailable

pytestmark = pytest.mark.anyio


def _dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


async def test_a_pooled_connection_whose_backend_was_killed_is_replaced_before_use(db_url: str) -> None:
    # One connection, so the next use is the same slot whose backend died while it sat idle in the pool.
    pool = db.make_pool(db_url, min_size=1, max_size=1)
    async with pool:
        async with db.connection(pool) as conn:
            old = (await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone() or {})["pid"]
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (old,))
        for _ in range(3):
            async with db.connection(pool) as conn:
                row = await (await conn.execute("SELECT pg_backend_pid() AS pid, 1 AS one")).fetchone()
            assert row is not None and row["one"] == 1 and row["pid"] != old


async def test_a_server_that_cannot_write_is_refused_until_it_can(db_url: str, pg_server_url: str) -> None:
    name = _dbname(db_url)
    # From another database: once read-only by default, this one cannot undo its own setting.
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    pool = db.make_pool(db_url, min_size=1, max_size=2, timeout=1.0)
    try:
        async with pool:
            # Every connection lands read-only: none is handed out, and the caller hears "unavailable",
            # never a read-only error from its own statement.
            with pytest.raises(LedgerUnavailable):
                async with db.connection(pool) as conn:
                    await conn.execute("SELECT 1")
            with psycopg.connect(pg_server_url, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            # The pool goes on replacing refused connections (backing off between tries) until one can write.
            async with pool.connection(timeout=60) as conn:
                row = await (
                    await conn.execute("SELECT current_setting('transaction_read_only') AS ro")
                ).fetchone()
            assert row == {"ro": "off"}
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


async def test_every_connection_gets_keepalives_and_a_tcp_user_timeout_unless_the_url_sets_them(
    db_url: str,
) -> None:
    url = make_conninfo(db_url, keepalives_idle="42")
    conn = await db.connect(url)
    async with conn:
        options = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
    assert options["keepalives_idle"] == "42"  # the URL's own setting wins
    for name, value in db.CONNECTION_DEFAULTS.items():
        if name != "keepalives_idle":
            assert options[name] == value, name
    assert db.connection_defaults(url) == {
        k: v for k, v in db.CONNECTION_DEFAULTS.items() if k != "keepalives_idle"
    }
