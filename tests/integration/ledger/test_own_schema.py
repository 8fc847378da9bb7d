"""Its own schema (docs/adr/0019-own-schema.md): a ledger of the previous release, all in `public`, moves into
effectgate's schema with every row, and a database holding an application's own `jobs`, `schema_migrations`,
`effects` and `steps` in `public` keeps every one of them, row for row and column for column, while effectgate
migrates and runs its whole pipeline beside them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db
from effectgate.ledger.maintenance.scheduler import Reconciler
from effectgate.ledger.migrate import MIGRATIONS_DIR, discover, migrate, script, status
from tests.integration.ledger.before_0022 import statements_before_0022
from tests.integration.ledger.kit_pipeline import run_pipeline
from tests.integration.ledger.table_checksums import table_checksums
from tests.integration.reports_seed import seed

pytestmark = pytest.mark.anyio

# The move (0021) and whatever later migrations this version ships: what a ledger of the previous release lacks.
FROM_0021 = [m.name for m in discover() if m.name >= "0021"]
EFFECTGATE_TABLES = (
    "effects",
    "jobs",
    "job_attempts",
    "steps",
    "deliveries",
    "effect_rejects",
    "signature_failures",
    "paused_kinds",
    "retention_purges",
    "history_partitions",
    "unmatched_deliveries",
    "transmissions",
    "schema_migrations",
)


def _print(title: str, sums: dict[str, str]) -> None:
    print(title)
    for table, text in sums.items():
        print(f"  {table:22} {text}")


@pytest.mark.parametrize("how", ["migrate", "printed-sql"])
async def test_a_previous_release_ledger_in_public_moves_into_its_schema_with_every_row(
    empty_db_url: str, tmp_path: Path, how: str
) -> None:
    previous, through = tmp_path / "previous", tmp_path / "through"
    previous.mkdir()
    through.mkdir()
    for m in discover():
        if m.name < "0021":
            shutil.copyfile(str(MIGRATIONS_DIR.joinpath(m.name)), previous / m.name)
        if m.name < "0022":
            shutil.copyfile(str(MIGRATIONS_DIR.joinpath(m.name)), through / m.name)
    # The previous release: every file before the move (0021) applied in public, rows written by the ledger's own code there.
    old = await db.connect(empty_db_url, schema="public")
    async with old:
        assert len(await migrate(old, previous, schema="public")) == len(list(previous.iterdir()))
        with statements_before_0022():
            await seed(old)
        await old.execute(
            "INSERT INTO paused_kinds VALUES ('fulfil-later', now(), 'ops', 'test');"
            "INSERT INTO retention_purges VALUES ('payloads', 3, now(), now());"
            "INSERT INTO unmatched_deliveries VALUES ('default', 'shop', 'f1', 2, now(), now());"
            "INSERT INTO transmissions VALUES ('shop', 't1', 'sha', now() + interval '1 day', now(), now(), 1);"
            "SELECT history_partition_create_v1('deliveries', '2031-01-01', '2031-01-02')"
        )
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        before = table_checksums(c, "public", EFFECTGATE_TABLES)
        partitions = {r[0] for r in c.execute("SELECT inhrelid::regclass::text FROM pg_inherits").fetchall()}
    _print("before the upgrade (public):", before)
    assert all(not text.startswith("rows=0 ") for text in before.values()), before
    assert "deliveries_20310101" in partitions or any("2031" in p for p in partitions), partitions

    # The upgrade itself, 0021 alone (later migrations, which change tables, come after the comparison).
    conn = await db.connect(empty_db_url)
    async with conn:
        states = await status(conn)
        assert [s.name for s in states if s.pending] == FROM_0021
        names, text = await script(conn, through)
        assert names == ["0021_own_schema.sql"]
        assert text.startswith("DO $head$") and "BEGIN;" not in text and "COMMIT;" not in text
        if how == "migrate":
            assert await migrate(conn, through) == ["0021_own_schema.sql"]
        else:
            # Applied as a team's own tool would: one script, by a client that is not effectgate.
            with psycopg.connect(empty_db_url, autocommit=True) as by_hand:
                by_hand.execute(text)  # type: ignore[arg-type]
        assert await migrate(conn, through) == []
        assert not [s for s in await status(conn, through) if s.pending]

    with psycopg.connect(empty_db_url, autocommit=True) as c:
        after = table_checksums(c, "effectgate", EFFECTGATE_TABLES)
        left = c.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace),"
            " (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace),"
            " (SELECT count(*) FROM pg_type WHERE typnamespace = 'public'::regnamespace)"
        ).fetchone()
        moved = {
            r[0]
            for r in c.execute(
                "SELECT c.relnamespace::regnamespace::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            ).fetchall()
        }
        job_state = c.execute("SELECT to_regtype('effectgate.job_state') IS NOT NULL").fetchone()
    _print("after the upgrade (effectgate):", after)
    # The migration record gained 0021's row; every other table is the same, row for row.
    assert {t: s for t, s in after.items() if t != "schema_migrations"} == {
        t: s for t, s in before.items() if t != "schema_migrations"
    }
    assert left == (0, 0, 0)
    assert moved == {"effectgate"}
    assert job_state == (True,)

    conn = await db.connect(empty_db_url)
    async with conn:
        assert await migrate(conn) == FROM_0021[1:]
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        keyed = table_checksums(c, "effectgate", EFFECTGATE_TABLES)
        # 0022 (keys with tenant): every row stays; job_attempts and steps gain their job's tenant.
        tenants = c.execute(
            "SELECT (SELECT count(*) FROM job_attempts a JOIN jobs j ON j.id = a.job_id AND j.tenant = a.tenant),"
            " (SELECT count(*) FROM steps s JOIN jobs j ON j.id = s.job_id AND j.tenant = s.tenant"
            "   JOIN effects e ON e.id = s.effect_id AND e.tenant = s.tenant),"
            " (SELECT count(DISTINCT tenant) FROM job_attempts)"
        ).fetchone()
    for table in EFFECTGATE_TABLES:
        assert keyed[table].split()[0] == after[table].split()[0] or table == "schema_migrations", table
    rows = {t: int(after[t].split()[0].removeprefix("rows=")) for t in ("job_attempts", "steps")}
    assert tenants is not None and tenants[:2] == (rows["job_attempts"], rows["steps"]) and tenants[2] >= 1
    await run_pipeline(empty_db_url, "after-upgrade")
    conn = await db.connect(empty_db_url)
    async with conn:
        await Reconciler().run_once(conn)


def _rails(c: psycopg.Connection[Any]) -> None:
    c.execute("CREATE TABLE schema_migrations (version varchar PRIMARY KEY)")
    c.execute("INSERT INTO schema_migrations VALUES ('20240101000000'), ('20240202000000')")
    c.execute("CREATE TABLE ar_internal_metadata (key varchar PRIMARY KEY, value varchar)")
    c.execute("INSERT INTO ar_internal_metadata VALUES ('environment', 'production')")


def _golang_migrate(c: psycopg.Connection[Any]) -> None:
    c.execute("CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)")
    c.execute("INSERT INTO schema_migrations VALUES (20240101000000, false)")


def _application(c: psycopg.Connection[Any], migrations: str) -> tuple[str, ...]:
    (_rails if migrations == "rails" else _golang_migrate)(c)
    # Laravel's queue table.
    c.execute(
        "CREATE TABLE jobs (id bigserial PRIMARY KEY, queue varchar(255) NOT NULL, payload text NOT NULL, "
        "attempts smallint NOT NULL, reserved_at integer, available_at integer NOT NULL, "
        "created_at integer NOT NULL)"
    )
    c.execute("CREATE INDEX jobs_queue_index ON jobs (queue)")
    c.execute(
        "INSERT INTO jobs (queue, payload, attempts, available_at, created_at) "
        "SELECT 'default', '{\"job\":' || n || '}', 0, 1700000000 + n, 1700000000 FROM generate_series(1, 50) n"
    )
    c.execute("CREATE TABLE effects (id serial PRIMARY KEY, name text UNIQUE, strength int)")
    c.execute("INSERT INTO effects (name, strength) VALUES ('blur', 3), ('glow', 7)")
    c.execute(
        "CREATE TABLE steps (id serial PRIMARY KEY, recipe_id int NOT NULL, position int NOT NULL, body text)"
    )
    c.execute("INSERT INTO steps (recipe_id, position, body) VALUES (1, 1, 'whisk'), (1, 2, 'fold')")
    tables = ("schema_migrations", "jobs", "effects", "steps")
    return (*tables, "ar_internal_metadata") if migrations == "rails" else tables


@pytest.mark.parametrize("migrations", ["rails", "golang-migrate"])
async def test_an_applications_own_tables_in_public_are_left_untouched(
    empty_db_url: str, migrations: str
) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        tables = _application(c, migrations)
        before = table_checksums(c, "public", tables)
        definitions_before = c.execute(
            "SELECT string_agg(relname || ':' || relkind::text, ',' ORDER BY relname) FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace"
        ).fetchone()
    _print(f"application tables before effectgate ({migrations}):", before)

    conn = await db.connect(empty_db_url)
    async with conn:
        applied = await migrate(conn)
        assert applied == [m.name for m in discover()]
    await run_pipeline(empty_db_url, "beside-the-app")
    conn = await db.connect(empty_db_url)
    async with conn:
        await Reconciler().run_once(conn)
        counts = await (
            await conn.execute(
                "SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM steps) AS steps"
            )
        ).fetchone()
        # effectgate's own jobs and steps, not the application's 50 and 2.
        assert counts == {"jobs": 1, "steps": 1}

    with psycopg.connect(empty_db_url, autocommit=True) as c:
        after = table_checksums(c, "public", tables)
        definitions_after = c.execute(
            "SELECT string_agg(relname || ':' || relkind::text, ',' ORDER BY relname) FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace"
        ).fetchone()
        mine = c.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'effectgate'::regnamespace AND relkind IN ('r', 'p')"
        ).fetchone()
    _print(f"application tables after effectgate ran ({migrations}):", after)
    assert after == before
    assert definitions_after == definitions_before
    assert mine is not None and mine[0] >= len(EFFECTGATE_TABLES)


async def test_a_public_ledger_two_releases_behind_gets_its_older_files_in_public_before_the_move(
    empty_db_url: str, tmp_path: Path
) -> None:
    older = tmp_path / "older"
    older.mkdir()
    for m in discover():
        if m.name < "0017":
            shutil.copyfile(str(MIGRATIONS_DIR.joinpath(m.name)), older / m.name)
    old = await db.connect(empty_db_url, schema="public")
    async with old:
        await migrate(old, older, schema="public")
    conn = await db.connect(empty_db_url)
    async with conn:
        assert await migrate(conn) == [
            "0017_versioned_sql_functions.sql",
            "0018_job_trace_parent.sql",
            "0020_effect_versions.sql",
            *FROM_0021,
        ]
        where = await (
            await conn.execute(
                "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace) AS public,"
                " to_regprocedure('effectgate.job_release_verdict_v1(boolean, boolean, integer, integer, text)')"
                " IS NOT NULL AS moved,"
                " (SELECT count(*) FROM pg_attribute WHERE attrelid = 'effectgate.jobs'::regclass"
                "  AND attname = 'trace_parent') AS column"
            )
        ).fetchone()
    assert where == {"public": 0, "moved": True, "column": 1}
    await run_pipeline(empty_db_url, "two-behind")
