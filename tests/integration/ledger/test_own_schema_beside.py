"""effectgate never touches a table it did not create (ledger/migrate.py ``_legacy``): whatever
`public.schema_migrations` an application's own tool keeps — Rails, golang-migrate, dbmate, a Flyway-like one,
or one shaped exactly like effectgate's, empty or with rows of other names or checksums — every `migrate` form
works, leaves it and the application's `jobs` and `effects` as they were, row for row, column for column and
schema for schema, and installs effectgate's ledger beside them in its own schema. What may be a damaged
ledger of effectgate's own is refused rather than doubled.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db
from effectgate.ledger.errors import MigrationError
from effectgate.ledger.migrate import MIGRATIONS_DIR, discover, migrate, status
from tests.integration.ledger.kit_pipeline import run_pipeline
from tests.integration.ledger.table_checksums import table_checksums

pytestmark = pytest.mark.anyio

EVERY_MIGRATION = [m.name for m in discover()]
ROOT = Path(__file__).resolve().parents[3]
_SHA = hashlib.sha256(b"create table users").hexdigest()

# Each application tool's schema_migrations, made as that tool makes it, with rows where the tool writes some.
SHAPES: dict[str, tuple[str, ...]] = {
    "rails": (
        "CREATE TABLE schema_migrations (version character varying NOT NULL PRIMARY KEY)",
        "INSERT INTO schema_migrations VALUES ('20240101000000'), ('20240202000000')",
    ),
    "golang-migrate": (
        "CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL)",
        "INSERT INTO schema_migrations VALUES (20240101000000, false)",
    ),
    "dbmate": (
        "CREATE TABLE schema_migrations (version varchar(128) PRIMARY KEY)",
        "INSERT INTO schema_migrations VALUES ('20240101000000'), ('20240301000000')",
    ),
    "flyway-like": (
        "CREATE TABLE schema_migrations (installed_rank integer PRIMARY KEY, version varchar(50), "
        "description varchar(200) NOT NULL, type varchar(20) NOT NULL, script varchar(1000) NOT NULL, "
        "checksum integer, installed_by varchar(100) NOT NULL, installed_on timestamp NOT NULL DEFAULT now(), "
        "execution_time integer NOT NULL, success boolean NOT NULL)",
        "INSERT INTO schema_migrations VALUES (1, '1', 'init', 'SQL', 'V1__init.sql', -1234567, 'app', "
        "now(), 12, true)",
    ),
    "filename-checksum": (
        "CREATE TABLE schema_migrations (filename text PRIMARY KEY, checksum text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f"INSERT INTO schema_migrations (filename, checksum) VALUES ('001_users.sql', '{_SHA}')",
    ),
    "version-checksum": (
        "CREATE TABLE schema_migrations (version text PRIMARY KEY, checksum text)",
        f"INSERT INTO schema_migrations VALUES ('1', '{_SHA}'), ('2', NULL)",
    ),
    # Exactly effectgate's columns, as a tool of the application's made them.
    "effectgate-shaped-empty": (
        "CREATE TABLE schema_migrations (name text PRIMARY KEY, checksum text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())",
    ),
    "effectgate-shaped-zero-padded": (
        "CREATE TABLE schema_migrations (name text PRIMARY KEY, checksum text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f"INSERT INTO schema_migrations (name, checksum) VALUES ('000001_create_users.sql', '{_SHA}'), "
        f"('000002_add_email.sql', '{_SHA}')",
    ),
    # Even effectgate's own file name, when the checksum is not effectgate's.
    "effectgate-shaped-same-name": (
        "CREATE TABLE schema_migrations (name text PRIMARY KEY, checksum text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())",
        f"INSERT INTO schema_migrations (name, checksum) VALUES ('0001_initial.sql', '{_SHA}')",
    ),
}
APP_TABLES = ("schema_migrations", "jobs", "effects")


def _application(c: psycopg.Connection[Any], shape: str) -> None:
    for statement in SHAPES[shape]:
        c.execute(statement)  # type: ignore[arg-type]
    # Laravel's queue table, and an effects table of the application's own.
    c.execute(
        "CREATE TABLE jobs (id bigserial PRIMARY KEY, queue varchar(255) NOT NULL, payload text NOT NULL, "
        "attempts smallint NOT NULL, reserved_at integer, available_at integer NOT NULL, "
        "created_at integer NOT NULL)"
    )
    c.execute(
        "INSERT INTO jobs (queue, payload, attempts, available_at, created_at) "
        "SELECT 'default', '{\"job\":' || n || '}', 0, 1700000000 + n, 1700000000 FROM generate_series(1, 20) n"
    )
    c.execute("CREATE TABLE effects (id serial PRIMARY KEY, name text UNIQUE, strength int)")
    c.execute("INSERT INTO effects (name, strength) VALUES ('blur', 3), ('glow', 7)")


def _public(c: psycopg.Connection[Any]) -> dict[str, Any]:
    """The application's side: every table's rows and definition, and in which schema (all but effectgate's)
    each of its names lives, with which columns."""
    sums = table_checksums(c, "public", APP_TABLES)
    c.execute("SELECT set_config('search_path', 'public', false)")
    places = c.execute(
        "SELECT c.relname, c.relnamespace::regnamespace::text, "
        " string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)"
        " FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " WHERE c.relname = ANY(%s) AND c.relkind = 'r' AND c.relnamespace::regnamespace::text <> 'effectgate'"
        " GROUP BY 1, 2 ORDER BY 1, 2",
        (list(APP_TABLES),),
    ).fetchall()
    counts = c.execute(
        "SELECT (SELECT count(*) FROM public.schema_migrations), (SELECT count(*) FROM public.jobs),"
        " (SELECT count(*) FROM public.effects)"
    ).fetchone()
    return {"sums": sums, "places": places, "counts": counts}


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "EFFECTGATE_SCHEMA")}
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", "migrate", *args],
        env={**env, "EFFECTGATE_DATABASE_URL": url, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_an_applications_schema_migrations_of_any_shape_is_left_alone_and_effectgate_installs_beside(
    empty_db_url: str, shape: str
) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        _application(c, shape)
        before = _public(c)
    print(f"{shape}: public before: {before['counts']} {before['places']}")
    assert before["places"] == [
        (t, "public", before["places"][i][2]) for i, t in enumerate(sorted(APP_TABLES))
    ]

    # Every form of migrate, read-only first: none reads the application's table as effectgate's.
    check = _cli(empty_db_url, "--check")
    assert (check.returncode, check.stdout.strip()) == (5, "pending: " + ", ".join(EVERY_MIGRATION)), (
        check.stderr
    )
    assert _cli(empty_db_url, "--status").returncode == 0
    printed = _cli(empty_db_url, "--print-sql")
    assert printed.returncode == 0, printed.stderr
    # Guarded (twice) and recorded in effectgate's schema only (the move, 0021, finds nothing of its own to move).
    assert '"public"."schema_migrations"' not in printed.stdout
    assert printed.stdout.count('"effectgate"."schema_migrations"') == 3 * len(EVERY_MIGRATION)
    applied = _cli(empty_db_url)
    assert (applied.returncode, applied.stdout.strip()) == (0, "applied: " + ", ".join(EVERY_MIGRATION)), (
        applied.stderr
    )
    check = _cli(empty_db_url, "--check")
    assert (check.returncode, check.stdout.strip()) == (0, f"up to date ({len(EVERY_MIGRATION)} applied)")
    assert (_cli(empty_db_url, "--print-sql").stdout, _cli(empty_db_url).stdout.strip()) == ("", "up to date")

    await run_pipeline(empty_db_url, f"beside-{shape}")
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        after = _public(c)
        ledger = c.execute("SELECT name, checksum FROM effectgate.schema_migrations ORDER BY name").fetchall()
        ours = c.execute("SELECT count(*) FROM effectgate.jobs").fetchone()
    print(f"{shape}: public after:  {after['counts']} {after['places']}")
    assert after == before
    assert ledger == [(m.name, m.checksum) for m in discover()]
    assert ours == (1,)


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (
            "UPDATE schema_migrations SET checksum = 'edited' WHERE name = '0001_initial.sql'",
            r"public holds effects and jobs of effectgate's shape \(.*\) but a public\.schema_migrations",
        ),
        (
            "DROP TABLE jobs CASCADE",
            r"public\.schema_migrations records effectgate's migrations \(.*\) but effects and jobs",
        ),
    ],
    ids=["tables-without-record", "record-without-tables"],
)
async def test_what_may_be_a_damaged_ledger_of_effectgates_own_is_refused_not_doubled(
    empty_db_url: str, tmp_path: Path, damage: str, found: str
) -> None:
    previous = tmp_path / "previous"
    previous.mkdir()
    for m in discover():
        if m.name < "0021":
            shutil.copyfile(str(MIGRATIONS_DIR.joinpath(m.name)), previous / m.name)
    old = await db.connect(empty_db_url, schema="public")
    async with old:
        await migrate(old, previous, schema="public")
        await old.execute(damage)  # type: ignore[arg-type]
    conn = await db.connect(empty_db_url)
    async with conn:
        with pytest.raises(MigrationError, match=found):
            await status(conn)
        with pytest.raises(MigrationError, match=r"a second ledger would run its effects again"):
            await migrate(conn)
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        left = c.execute(
            "SELECT to_regclass('public.schema_migrations') IS NOT NULL, to_regclass('effectgate.schema_migrations')"
        ).fetchone()
    assert left == (True, None)
