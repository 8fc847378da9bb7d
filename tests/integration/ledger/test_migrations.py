from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from effectgate.ledger import db
from effectgate.ledger.errors import MigrationError
from effectgate.ledger.migrate import discover, migrate, script, status, unapplied

pytestmark = pytest.mark.anyio


async def test_every_migration_applies_to_an_empty_database_once(empty_db_url: str) -> None:
    conn = await db.connect(empty_db_url)
    async with conn:
        applied = await migrate(conn)
        assert applied == [m.name for m in discover()]
        assert applied, "there is at least one migration"
        assert await migrate(conn) == []
        rows = await (await conn.execute("SELECT name FROM schema_migrations ORDER BY name")).fetchall()
        assert [r["name"] for r in rows] == applied


async def test_a_changed_applied_migration_is_refused(empty_db_url: str, tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("CREATE TABLE t (id int);\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        assert await migrate(conn, tmp_path) == ["0001_first.sql"]
        (tmp_path / "0001_first.sql").write_text("CREATE TABLE t (id bigint);\n")
        with pytest.raises(MigrationError, match=r"0001_first\.sql was changed after it was applied"):
            await migrate(conn, tmp_path)


async def test_a_failing_migration_leaves_nothing_half_applied(empty_db_url: str, tmp_path: Path) -> None:
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE a (id int);\n")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE b (id int);\nSELECT no_such_function();\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        with pytest.raises(MigrationError, match=r"0002_bad\.sql failed"):
            await migrate(conn, tmp_path)
        names = await (await conn.execute("SELECT name FROM schema_migrations")).fetchall()
        assert [r["name"] for r in names] == ["0001_ok.sql"]
        tables = await (
            await conn.execute("SELECT count(*) AS n FROM pg_tables WHERE tablename = 'b'")
        ).fetchone()
        assert tables is not None and tables["n"] == 0


def test_badly_named_migration_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "1_first.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="0001_snake_case"):
        discover(tmp_path)


async def test_unapplied_reads_without_writing(empty_db_url: str) -> None:
    conn = await db.connect(empty_db_url)
    async with conn:
        assert await unapplied(conn) == [m.name for m in discover()]
        present = await (await conn.execute("SELECT to_regclass('schema_migrations') AS t")).fetchone()
        assert present is not None and present["t"] is None
        await migrate(conn)
        assert await unapplied(conn) == []


async def test_a_new_migration_numbered_below_an_applied_one_is_refused(
    empty_db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "0002_second.sql").write_text("CREATE TABLE b (id int);\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        await migrate(conn, tmp_path)
        (tmp_path / "0001_first.sql").write_text("CREATE TABLE a (id int);\n")
        with pytest.raises(MigrationError, match=r"0001_first\.sql is numbered before 0002_second\.sql"):
            await migrate(conn, tmp_path)


async def test_readiness_reports_a_changed_applied_migration(empty_db_url: str, tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("CREATE TABLE a (id int);\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        await migrate(conn, tmp_path)
        assert await unapplied(conn, tmp_path) == []
        (tmp_path / "0001_first.sql").write_text("CREATE TABLE a (id bigint);\n")
        assert await unapplied(conn, tmp_path) == ["0001_first.sql (changed after it was applied)"]


async def test_status_tells_applied_pending_changed_and_unknown_apart(
    empty_db_url: str, tmp_path: Path
) -> None:
    (tmp_path / "0001_a.sql").write_text("CREATE TABLE a (id int);\n")
    (tmp_path / "0002_b.sql").write_text("CREATE TABLE b (id int);\n")
    (tmp_path / "0003_c.sql").write_text("CREATE TABLE c (id int);\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        assert [(s.name, s.pending) for s in await status(conn, tmp_path)] == [
            ("0001_a.sql", True),
            ("0002_b.sql", True),
            ("0003_c.sql", True),
        ]
        await migrate(conn, tmp_path)
        # A release later: 0001 edited in place, 0003 gone from this version's files, 0004 new.
        (tmp_path / "0001_a.sql").write_text("CREATE TABLE a (id bigint);\n")
        (tmp_path / "0003_c.sql").unlink()
        (tmp_path / "0004_d.sql").write_text("CREATE TABLE d (id int);\n")
        states = {s.name: s for s in await status(conn, tmp_path)}
        assert list(states) == ["0001_a.sql", "0002_b.sql", "0003_c.sql", "0004_d.sql"]
        assert states["0001_a.sql"].changed and not states["0001_a.sql"].pending
        assert not states["0002_b.sql"].changed and states["0002_b.sql"].applied_at is not None
        assert not states["0003_c.sql"].known and not states["0003_c.sql"].pending
        assert states["0004_d.sql"].pending
        # No script is printed for a database whose applied files changed.
        with pytest.raises(MigrationError, match=r"0001_a\.sql was changed after it was applied"):
            await script(conn, tmp_path)


async def test_a_printed_script_applied_by_hand_equals_migrate(empty_db_url: str, tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("CREATE TABLE a (id int);\n")
    # No semicolon after the last statement, then a comment: the record must still be its own statement.
    (tmp_path / "0002_b.sql").write_text("CREATE TABLE b (id int)\n-- the end\n")
    conn = await db.connect(empty_db_url)
    async with conn:
        names, text = await script(conn, tmp_path)
        assert names == ["0001_a.sql", "0002_b.sql"]
        present = await (await conn.execute("SELECT to_regclass('schema_migrations') AS t")).fetchone()
        assert present == {"t": None}, "printing writes nothing"
        await conn.execute(text)  # type: ignore[arg-type]
        assert await unapplied(conn, tmp_path) == []
        assert await migrate(conn, tmp_path) == []
        assert await script(conn, tmp_path) == ([], "")
        tables = await (
            await conn.execute("SELECT count(*) AS n FROM pg_tables WHERE tablename IN ('a', 'b')")
        ).fetchone()
        assert tables == {"n": 2}


@pytest.fixture
def sql_ascii_db_url(pg_server_url: str) -> Iterator[str]:
    """A database created with the SQL_ASCII encoding (what `initdb` gives under a C locale by default)."""
    name = f"effectgate_a_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    yield make_conninfo(pg_server_url, dbname=name)
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_a_database_that_is_not_utf8_is_refused_before_anything_is_written(
    sql_ascii_db_url: str,
) -> None:
    conn = await db.connect(sql_ascii_db_url)
    async with conn:
        with pytest.raises(MigrationError, match=r"has encoding SQL_ASCII; effectgate needs UTF8"):
            await migrate(conn)
        row = await (
            await conn.execute(
                "SELECT count(*) AS n FROM pg_namespace WHERE nspname = %s", (db.DEFAULT_SCHEMA,)
            )
        ).fetchone()
        assert row is not None and row["n"] == 0


def test_the_cli_names_the_database_and_its_encoding(sql_ascii_db_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", "migrate"],
        env={**os.environ, "EFFECTGATE_DATABASE_URL": sql_ascii_db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "encoding SQL_ASCII; effectgate needs UTF8" in done.stderr
    assert "Traceback" not in done.stderr
