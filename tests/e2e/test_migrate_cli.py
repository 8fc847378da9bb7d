"""Migrations a team can own, as real ``effectgate`` processes: ``migrate --status``, ``--check`` (exit 5
while pending), ``--print-sql`` applied by hand and then the whole pipeline on that database; ``serve`` and
``worker --no-migrate`` waiting for the schema and refusing with exit 2; no command but ``up`` and
``--embedded`` starting an embedded Postgres; ``EFFECTGATE_DATABASE_URL`` winning over ``DATABASE_URL``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from effectgate.ledger.migrate import discover

from ..conftest import _admin, database_url
from .conftest import Stack, event
from .processes import Process, run_without_database, wait_until

EVERY_MIGRATION = [m.name for m in discover()]
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/unreachable"


def printed_sql(url: str) -> str:
    result = run_without_database("migrate", "--print-sql", "--database-url", url)
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- status and check -----------------------------------------------------------------------------


def test_status_and_check_on_an_empty_then_a_migrated_ledger(empty_db_url: str) -> None:
    check = run_without_database("migrate", "--check", DATABASE_URL=empty_db_url)
    assert check.returncode == 5, check.stderr
    assert check.stdout.strip() == "pending: " + ", ".join(EVERY_MIGRATION)

    table = run_without_database("migrate", "--status", DATABASE_URL=empty_db_url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["MIGRATION", "STATUS", "APPLIED", "AT"]
    assert [line.split()[:3] for line in lines[1 : 1 + len(EVERY_MIGRATION)]] == [
        [name, "pending", "-"] for name in EVERY_MIGRATION
    ]
    assert lines[-1] == f"0 applied, {len(EVERY_MIGRATION)} pending"
    # Read-only: neither created the migration table.
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('effectgate.schema_migrations')").fetchone() == (None,)

    assert run_without_database("migrate", DATABASE_URL=empty_db_url).returncode == 0
    check = run_without_database("migrate", "--check", DATABASE_URL=empty_db_url)
    assert (check.returncode, check.stdout.strip()) == (0, f"up to date ({len(EVERY_MIGRATION)} applied)")
    document = json.loads(
        run_without_database("migrate", "--status", "--format", "json", DATABASE_URL=empty_db_url).stdout
    )
    assert document["up_to_date"] is True and document["pending"] == []
    assert [m["name"] for m in document["migrations"]] == EVERY_MIGRATION
    assert all(m["status"] == "applied" and m["applied_at"] for m in document["migrations"])


def test_check_names_a_migration_the_database_lacks_after_an_upgrade(db_url: str) -> None:
    # A database one release behind: the newest migration is not recorded (and not applied).
    newest = EVERY_MIGRATION[-1]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE name = %s", (newest,))
    check = run_without_database("migrate", "--check", DATABASE_URL=db_url)
    assert (check.returncode, check.stdout.strip()) == (5, f"pending: {newest}")
    status = json.loads(
        run_without_database("migrate", "--status", "--format", "json", DATABASE_URL=db_url).stdout
    )
    assert status["up_to_date"] is False and status["pending"] == [newest]


def test_format_json_goes_with_status_only() -> None:
    result = run_without_database("migrate", "--check", "--format", "json", DATABASE_URL=UNREACHABLE)
    assert result.returncode == 2
    assert "effectgate: --format: only with --status" in result.stderr


# -- print-sql ------------------------------------------------------------------------------------


@pytest.fixture
def db_url(pg_server_url: str) -> Iterator[str]:
    """A database migrated by hand from ``migrate --print-sql`` (overrides the template-cloned one, so the
    ``stack`` fixture runs the pipeline on it)."""
    name = f"effectgate_p_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = database_url(pg_server_url, name)
    script = printed_sql(url)
    # Applied the way a team's own tool would: as one script, by a client that is not effectgate.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script)  # type: ignore[arg-type]
    # As the suite's db_url: the test's own plain connections find effectgate's schema.
    yield make_conninfo(url, options="-c search_path=effectgate")
    with _admin(pg_server_url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_printed_sql_applied_by_hand_leaves_migrate_nothing_to_do_and_the_pipeline_runs(
    stack: Stack,
) -> None:
    check = run_without_database("migrate", "--check", DATABASE_URL=stack.db_url)
    assert (check.returncode, check.stdout.strip()) == (0, f"up to date ({len(EVERY_MIGRATION)} applied)")
    again = run_without_database("migrate", DATABASE_URL=stack.db_url)
    assert (again.returncode, again.stdout.strip()) == (0, "up to date")
    nothing = run_without_database("migrate", "--print-sql", DATABASE_URL=stack.db_url)
    assert (nothing.returncode, nothing.stdout) == (0, "")

    # The gateway of the stack runs --no-migrate on it; a worker too.
    stack.worker("worker", "--migration-wait", "0")
    assert stack.deliver(event("7001", "evt_printed_7001")).status_code == 202
    stack.wait_state("order-paid:7001", "succeeded")
    assert (stack.stats()["captures"], stack.stats()["shipments"]) == (1, 1)


def test_the_printed_sql_records_what_migrate_records_and_refuses_to_run_twice(
    empty_db_url: str, pg_server_url: str
) -> None:
    script = printed_sql(empty_db_url)
    # One guard per migration, and no transaction control: the script runs in its caller's transaction.
    assert script.count("DO $guard$") == len(EVERY_MIGRATION)
    assert "BEGIN;" not in script and "COMMIT;" not in script
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(script)  # type: ignore[arg-type]
        by_hand = conn.execute(
            "SELECT name, checksum FROM effectgate.schema_migrations ORDER BY name"
        ).fetchall()
        with pytest.raises(psycopg.errors.RaiseException, match="is applied already"):
            conn.execute(script)  # type: ignore[arg-type]
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM effectgate.schema_migrations").fetchone() == (
            len(EVERY_MIGRATION),
        )

    # The same records `effectgate migrate` writes, checksums included.
    other = f"effectgate_p_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server_url) as admin:
        admin.execute(f'CREATE DATABASE "{other}"')
    try:
        other_url = database_url(pg_server_url, other)
        assert run_without_database("migrate", DATABASE_URL=other_url).returncode == 0
        with psycopg.connect(other_url) as conn:
            by_migrate = conn.execute(
                "SELECT name, checksum FROM effectgate.schema_migrations ORDER BY name"
            ).fetchall()
    finally:
        with _admin(pg_server_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')
    assert by_hand == by_migrate


def test_a_printed_script_for_a_database_one_release_behind_holds_only_the_missing_migration(
    empty_db_url: str, tmp_path: Path
) -> None:
    assert run_without_database("migrate", DATABASE_URL=empty_db_url).returncode == 0
    newest = discover()[-1]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM effectgate.schema_migrations WHERE name = %s", (newest.name,))
    script = printed_sql(empty_db_url)
    assert script.count("DO $guard$") == 1 and f"-- {newest.name} " in script
    # The file before it is applied: the guard lets it through.
    assert f"'{EVERY_MIGRATION[-2]}'" in script


# -- --no-migrate waits for the schema, bounded, then refuses -------------------------------------


def _project(tmp_path: Path) -> Path:
    config = tmp_path / "effectgate.toml"
    config.write_text(
        '[handlers]\nmodules = ["tests.e2e.e2e_handlers"]\nskip_sources = ["connect"]\n\n'
        '[sources.shop]\nscheme = "stripe"\nsecrets = ["E2E_STRIPE_SECRET"]\n\n'
        "[worker]\npoll_interval = 0.5\n\n[reconciler]\ntick = 0.5\n"
    )
    return config


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_no_migrate_on_a_ledger_that_stays_behind_refuses_with_exit_2(
    command: str, empty_db_url: str, tmp_path: Path
) -> None:
    result = run_without_database(
        command,
        "--config",
        str(_project(tmp_path)),
        "--no-migrate",
        "--migration-wait",
        "0",
        DATABASE_URL=empty_db_url,
        E2E_STRIPE_SECRET="whsec_x",
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        f"effectgate: the ledger lacks migrations {', '.join(EVERY_MIGRATION)} after waiting 0s with "
        "--no-migrate: apply them first (`effectgate migrate`" in result.stderr
    )
    assert (
        "--migration-wait, EFFECTGATE_DATABASE__MIGRATION_WAIT or [database] migration_wait" in result.stderr
    )
    # It waited without writing: not even the migration table.
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('effectgate.schema_migrations')").fetchone() == (None,)


def test_the_migration_wait_comes_from_the_environment_and_the_file(
    empty_db_url: str, tmp_path: Path
) -> None:
    config = _project(tmp_path)
    config.write_text(config.read_text() + "\n[database]\nmigration_wait = 0\n")
    from_file = run_without_database(
        "worker", "--config", str(config), "--no-migrate", DATABASE_URL=empty_db_url, E2E_STRIPE_SECRET="x"
    )
    assert from_file.returncode == 2 and "after waiting 0s" in from_file.stderr
    bad = run_without_database(
        "worker",
        "--config",
        str(config),
        "--no-migrate",
        DATABASE_URL=empty_db_url,
        E2E_STRIPE_SECRET="x",
        EFFECTGATE_DATABASE__MIGRATION_WAIT="soon",
    )
    assert bad.returncode == 2
    assert "environment EFFECTGATE_DATABASE__MIGRATION_WAIT: expected a number, got 'soon'" in bad.stderr


def test_a_no_migrate_worker_logs_while_it_waits_and_starts_once_someone_migrates(
    empty_db_url: str, tmp_path: Path
) -> None:
    worker = Process(
        ["worker", "--config", str(_project(tmp_path)), "--no-migrate", "--migration-wait", "300"],
        {"DATABASE_URL": empty_db_url, "E2E_STRIPE_SECRET": "whsec_x", "EFFECTGATE_LOG_LEVEL": "INFO"},
        tmp_path / "worker.log",
    )
    try:
        worker.wait_log('"schema.migrations_pending"')
        # Logged again every few seconds while it waits, not once and then silence.
        wait_until(
            lambda: worker.log().count('"schema.migrations_pending"') >= 2,
            30,
            "a second schema.migrations_pending line",
        )
        assert "worker.started" not in worker.log()
        line = next(x for x in worker.log().splitlines() if '"schema.migrations_pending"' in x)
        assert json.loads(line)["pending"] == EVERY_MIGRATION

        assert run_without_database("migrate", DATABASE_URL=empty_db_url).returncode == 0
        worker.wait_log("worker.started", timeout=60)
        assert '"schema.up_to_date"' in worker.log()
    finally:
        assert worker.stop() == 0


# -- no embedded Postgres unless asked; which URL wins --------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["migrate"], ["migrate", "--status"], ["ledger", "duplicates"], ["jobs", "list"], ["reconcile"]],
    ids=lambda argv: " ".join(argv),
)
def test_commands_without_a_database_url_refuse_and_never_start_an_embedded_postgres(
    argv: list[str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    config = tmp_path / "effectgate.toml"
    config.write_text('[sources.shop]\nscheme = "stripe"\nsecrets = ["E2E_STRIPE_SECRET"]\n')
    result = run_without_database(
        *argv,
        cwd=tmp_path,
        EFFECTGATE_HOME=str(home),
        EFFECTGATE_CONFIG=str(config),
        E2E_STRIPE_SECRET="whsec_x",
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    message = result.stderr
    for way in ("DATABASE_URL is not set", "EFFECTGATE_DATABASE_URL", "--database-url URL", "--embedded"):
        assert way in message, message
    assert not home.exists(), "no embedded Postgres may be started"


def test_effectgate_database_url_wins_over_database_url_and_the_flag_over_both(empty_db_url: str) -> None:
    chosen = run_without_database(
        "migrate", "--check", EFFECTGATE_DATABASE_URL=empty_db_url, DATABASE_URL=UNREACHABLE
    )
    assert chosen.returncode == 5, chosen.stderr
    flag = run_without_database(
        "migrate",
        "--check",
        "--database-url",
        empty_db_url,
        EFFECTGATE_DATABASE_URL=UNREACHABLE,
        DATABASE_URL=UNREACHABLE,
    )
    assert flag.returncode == 5, flag.stderr
    # The generic variable alone is still honoured; a bad one is named in the message.
    assert run_without_database("migrate", "--check", DATABASE_URL=empty_db_url).returncode == 5
    bad = run_without_database(
        "migrate", "--check", EFFECTGATE_DATABASE_URL="not a url", DATABASE_URL=empty_db_url
    )
    assert bad.returncode == 2
    assert "effectgate: EFFECTGATE_DATABASE_URL: not a valid PostgreSQL connection URL" in bad.stderr


def test_embedded_and_a_url_flag_together_is_a_usage_error(tmp_path: Path) -> None:
    result = run_without_database(
        "migrate", "--embedded", "--database-url", UNREACHABLE, EFFECTGATE_HOME=str(tmp_path / "home")
    )
    assert result.returncode == 2
    assert "effectgate: --embedded: --database-url is set too" in result.stderr


def test_migrate_embedded_migrates_the_embedded_ledger_of_up_and_stops_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    applied = run_without_database("migrate", "--embedded", cwd=tmp_path, EFFECTGATE_HOME=str(home))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == "applied: " + ", ".join(EVERY_MIGRATION)
    check = run_without_database("migrate", "--check", "--embedded", cwd=tmp_path, EFFECTGATE_HOME=str(home))
    assert (check.returncode, check.stdout.strip()) == (0, f"up to date ({len(EVERY_MIGRATION)} applied)")
    # The last process to leave stopped the server it started.
    assert not (home / "pgdata" / "postmaster.pid").exists()


def test_effectgate_schema_names_the_schema_and_a_bad_name_is_refused(empty_db_url: str) -> None:
    assert (
        run_without_database("migrate", DATABASE_URL=empty_db_url, EFFECTGATE_SCHEMA="ledger_x").returncode
        == 0
    )
    check = run_without_database(
        "migrate", "--check", DATABASE_URL=empty_db_url, EFFECTGATE_SCHEMA="ledger_x"
    )
    assert (check.returncode, check.stdout.strip()) == (0, f"up to date ({len(EVERY_MIGRATION)} applied)")
    # The default schema was never made: everything is in ledger_x.
    other = run_without_database("migrate", "--check", DATABASE_URL=empty_db_url)
    assert other.returncode == 5
    with psycopg.connect(empty_db_url) as conn:
        row = conn.execute(
            "SELECT to_regclass('ledger_x.jobs') IS NOT NULL, to_regnamespace('effectgate') IS NULL"
        ).fetchone()
    assert row == (True, True)

    bad = run_without_database("migrate", "--check", DATABASE_URL=empty_db_url, EFFECTGATE_SCHEMA="pg_mine")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "EFFECTGATE_SCHEMA: names starting with pg_ are reserved by Postgres" in bad.stderr
