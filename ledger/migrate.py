"""The migration runner: numbered, forward-only SQL files applied once each, in order.

Runs under an advisory lock, so gateways and workers starting together apply each migration once.
Each file is applied in its own transaction together with its record (name and SHA-256 checksum);
a file that changed after it was applied is refused, since the database no longer matches it.

For a team whose own migration tool owns the schema: ``status`` says what is applied and what is
pending (read-only), and ``script`` prints the pending files as one SQL script that records itself the
way ``migrate`` does and runs inside that tool's transaction, so applying it leaves the database exactly
as ``migrate`` would.

Where the Citus extension is installed, ``migrate`` then distributes the ledger by tenant, each step only if
not done (ledger/cluster/distribution.py). ``script`` leaves that out: its steps are Citus calls, each in a transaction
of its own, not DDL for another tool's one transaction. Such a team runs ``effectgate migrate`` once after its
tool, as the tables' owner: it finds nothing to apply and distributes; ``migrate --check`` says it is pending.

Everything lives in one schema (``schema``, default ``effectgate``; docs/adr/0019-own-schema.md): the
runner creates it and puts it alone on the search_path, so the files stay unqualified. A ledger of a
release before 0021 lives in ``public``: the runner recognises it by what only effectgate wrote there
(``_legacy``), reads its record there, applies any older file it lacks in ``public``, and 0021 moves
everything into the schema. Any other ``public.schema_migrations`` (Rails, golang-migrate, dbmate, Flyway)
is never read or written.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from importlib.resources.abc import Traversable

import psycopg
from psycopg import sql
from psycopg.rows import DictRow

from .cluster import distribution
from .db import DEFAULT_SCHEMA, Conn, use_schema
from .errors import MigrationError
from .queries import Q

log = logging.getLogger("effectgate.ledger")

# Shipped inside the package (effectgate.migrations), so an installed wheel finds them from any directory.
MIGRATIONS_DIR: Traversable = files("effectgate.migrations")
_FILE_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
# Fixed, arbitrary: the same number in every process of every version.
MIGRATION_LOCK_ID = 0x6566_6765_6D69_6772  # "efgemigr"
# The migration that moves a pre-0021 ledger out of `public`; files before it belong beside the old tables.
OWN_SCHEMA_MIGRATION = "0021_own_schema.sql"


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its name, SQL and checksum."""

    name: str
    sql: str
    checksum: str


def discover(directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    """Every ``NNNN_snake_case.sql`` in ``directory``, in order; any other ``.sql`` name is an error."""
    if not directory.is_dir():
        raise MigrationError(f"migrations directory not found: {directory}")
    migrations: list[Migration] = []
    numbers: set[str] = set()
    for path in sorted((p for p in directory.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        if not _FILE_NAME.match(path.name):
            raise MigrationError(f"{path}: migration names must look like 0001_snake_case.sql")
        number = path.name[:4]
        if number in numbers:
            raise MigrationError(f"{path}: migration number {number} is used twice")
        numbers.add(number)
        text = path.read_text(encoding="utf-8")
        migrations.append(Migration(path.name, text, hashlib.sha256(text.encode("utf-8")).hexdigest()))
    return migrations


async def _legacy(conn: Conn, directory: Traversable) -> bool:
    """Whether ``public`` holds effectgate's own ledger of a release before 0021, to be moved into the schema.

    effectgate never touches a table it did not create, and Rails, golang-migrate, dbmate and Flyway all keep a
    ``public.schema_migrations``, some with a ``checksum`` column. So a name or a column proves nothing; two
    things only effectgate's own releases wrote do: a migration record of exactly effectgate's three columns
    holding the first shipped file with its shipped checksum (a SHA-256 of effectgate's own text), and effects
    and jobs with effectgate's columns and ``job_state`` type. Both: ours, moved by 0021. Neither: the
    application's, left alone, and effectgate installs beside it. One without the other cannot be told apart
    from a damaged ledger of ours, and installing a second, empty ledger beside it would run its effects
    again; so that is refused. A marker could not serve: the releases whose ledgers need recognising wrote none.
    """
    row = await (await conn.execute(Q["migrations_public_ledger_shape"])).fetchone()
    if row is None or not row["unmoved"] or not (row["record"] or row["tables"]):
        return False
    first = discover(directory)[:1]
    record = False
    if row["record"] and first:
        params = {"name": first[0].name, "checksum": first[0].checksum}
        found = await (await conn.execute(Q["migrations_public_ledger_first"], params)).fetchone()
        record = found is not None and bool(found["ours"])
    if record == bool(row["tables"]):
        return record
    found_part, missing = (
        ("public.schema_migrations records effectgate's migrations", "effects and jobs of effectgate's shape")
        if record
        else (
            "public holds effects and jobs of effectgate's shape",
            f"a public.schema_migrations (name, checksum, applied_at) recording {first[0].name if first else 'them'}"
            " with the checksum this version ships",
        )
    )
    raise MigrationError(
        f"{found_part} (an effectgate ledger of a release before 0021) but {missing} is missing; effectgate "
        "neither moves nor installs beside what may be its own ledger (a second ledger would run its effects "
        "again): restore it, or drop what is left of it in public"
    )


def _search_path_for(migration: Migration, schema: str, legacy: bool) -> list[str] | None:
    # None: the session's own (the schema alone).
    if not legacy or migration.name > OWN_SCHEMA_MIGRATION:
        return None
    if migration.name < OWN_SCHEMA_MIGRATION:
        return ["public"]
    return [schema, "public"]


async def pending(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    """Migrations not yet applied to this database (raises if an applied one changed)."""
    if await _legacy(conn, directory):
        rows = await (await conn.execute(Q["migrations_applied_legacy"])).fetchall()
    else:
        present = await (await conn.execute(Q["migrations_table_exists"])).fetchone()
        if present is None or not present["present"]:
            # Asked first: CREATE TABLE IF NOT EXISTS needs the CREATE right even when the table exists.
            await conn.execute(Q["migrations_table_ensure"])
        rows = await (await conn.execute(Q["migrations_applied"])).fetchall()
    applied = {row["name"]: row["checksum"] for row in rows}
    todo = []
    last_applied = max(applied, default="")
    for migration in discover(directory):
        checksum = applied.get(migration.name)
        if checksum is None:
            if migration.name < last_applied:
                # A file slipped in below what is applied (a merge of two branches, say): applying it
                # now would run it in an order no other database ran it in.
                raise MigrationError(
                    f"migration {migration.name} is numbered before {last_applied}, which is already "
                    "applied; renumber it after the last applied migration"
                )
            todo.append(migration)
        elif checksum != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was changed after it was applied "
                f"(applied checksum {checksum[:12]}…, file {migration.checksum[:12]}…); "
                "migrations are forward-only: add a new file instead"
            )
    return todo


async def _applied_read_only(conn: Conn, directory: Traversable) -> dict[str, DictRow]:
    # The record where it is (the schema, or `public` before 0021), without creating it.
    if await _legacy(conn, directory):
        rows = await (await conn.execute(Q["migrations_applied_legacy"])).fetchall()
        return {r["name"]: r for r in rows}
    row = await (await conn.execute(Q["migrations_table_exists"])).fetchone()
    if row is None or not row["present"]:
        return {}
    return {r["name"]: r for r in await (await conn.execute(Q["migrations_applied_at"])).fetchall()}


async def unapplied(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[str]:
    """Migrations this database lacks, or whose applied checksum differs, read-only (readiness checks)."""
    applied = {name: r["checksum"] for name, r in (await _applied_read_only(conn, directory)).items()}
    problems = []
    for m in discover(directory):
        if m.name not in applied:
            problems.append(m.name)
        elif applied[m.name] != m.checksum:
            problems.append(f"{m.name} (changed after it was applied)")
    return problems


async def _require_utf8(conn: Conn) -> None:
    """Refuse a database whose encoding is not UTF8, before anything is written. Payloads, keys and the
    migrations themselves are Unicode; a SQL_ASCII or LATIN1 database would fail half-way (or store
    bytes no report can read back), so this says which database and how to make a right one."""
    row = await (await conn.execute(Q["database_encoding"])).fetchone()
    if row is None:
        return
    # A SQL_ASCII database answers text as bytes (psycopg cannot know their encoding).
    name, encoding = (
        v.decode("ascii", "replace") if isinstance(v, bytes) else str(v) for v in (row["db"], row["enc"])
    )
    if encoding != "UTF8":
        raise MigrationError(
            f"database {name!r} has encoding {encoding}; effectgate needs UTF8 "
            "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0, or initdb -E UTF8); nothing was changed"
        )


@dataclass(frozen=True, slots=True)
class Migrated:
    """What one run of the runner did: the migrations it applied, and the steps it took to distribute the
    ledger on Citus (``distribution.distribute``; empty on a single node or when done already)."""

    applied: list[str]
    distributed: list[str]


async def migrate(
    conn: Conn, directory: Traversable = MIGRATIONS_DIR, *, schema: str = DEFAULT_SCHEMA
) -> list[str]:
    """Apply every pending migration in ``schema`` (created when missing, and left as ``conn``'s
    search_path), and where Citus is installed distribute the ledger by tenant; returns the names applied
    (empty when up to date). The distribution steps taken are logged (``ledger.distributed``)."""
    return (await migrate_and_distribute(conn, directory, schema=schema)).applied


async def migrate_and_distribute(
    conn: Conn, directory: Traversable = MIGRATIONS_DIR, *, schema: str = DEFAULT_SCHEMA
) -> Migrated:
    """``migrate``, saying what it did: the migrations applied, then, where the Citus extension is installed,
    the steps that distributed the ledger by tenant (each only if not done; ledger/cluster/distribution.py), under the
    same lock, so two processes starting together distribute it once."""
    await conn.execute(Q["migrations_lock"], {"lock_id": MIGRATION_LOCK_ID})
    try:
        row = await (await conn.execute(Q["schema_present"], {"schema": schema})).fetchone()
        if row is None or not row["present"]:
            await _require_utf8(conn)
            try:
                await conn.execute(sql.SQL(Q["schema_ensure"]).format(schema=sql.Identifier(schema)))
            except psycopg.Error as exc:
                raise MigrationError(f"cannot create schema {schema!r}: {exc}") from exc
        await use_schema(conn, schema)
        legacy = await _legacy(conn, directory)
        applied: list[str] = []
        todo = await pending(conn, directory)
        if todo:
            # Only before writing: a ledger that is up to date starts as it did, whatever its encoding.
            await _require_utf8(conn)
        for migration in todo:
            path = _search_path_for(migration, schema, legacy)
            try:
                async with conn.transaction():
                    if path is not None:
                        await conn.execute(Q["migration_search_path_set_local"], {"schemas": path})
                    # The file is trusted project source, run as a script of several statements.
                    await conn.execute(sql.SQL(migration.sql))
                    await conn.execute(
                        Q["migration_record"], {"name": migration.name, "checksum": migration.checksum}
                    )
            except psycopg.Error as exc:
                raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
            applied.append(migration.name)
        distributed = await distribution.distribute(conn)
        if distributed:
            log.info("ledger.distributed", extra={"schema": schema, "steps": distributed})
        return Migrated(applied, distributed)
    finally:
        await conn.execute(Q["migrations_unlock"], {"lock_id": MIGRATION_LOCK_ID})


@dataclass(frozen=True, slots=True)
class MigrationState:
    """One migration as this database sees it: ``applied_at`` None means pending; ``changed`` means it
    was applied from a file whose checksum differs from the one shipped now; ``known`` False means the
    database applied it but this version does not ship it (a newer release migrated the database)."""

    name: str
    applied_at: datetime | None
    changed: bool = False
    known: bool = True

    @property
    def pending(self) -> bool:
        """Shipped with this version and not applied to this database."""
        return self.applied_at is None


async def status(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[MigrationState]:
    """Every migration this version ships and every one the database applied, in name order; read-only
    (it creates no migration table), so a runtime role without DDL rights can ask."""
    applied = await _applied_read_only(conn, directory)
    states = []
    shipped = discover(directory)
    for m in shipped:
        record = applied.get(m.name)
        if record is None:
            states.append(MigrationState(m.name, None))
        else:
            states.append(
                MigrationState(m.name, record["applied_at"], changed=record["checksum"] != m.checksum)
            )
    names = {m.name for m in shipped}
    states.extend(
        MigrationState(name, record["applied_at"], known=False)
        for name, record in applied.items()
        if name not in names
    )
    return sorted(states, key=lambda s: s.name)


async def script(
    conn: Conn, directory: Traversable = MIGRATIONS_DIR, *, schema: str = DEFAULT_SCHEMA
) -> tuple[list[str], str]:
    """The names of the migrations this database lacks, and them as one SQL script; ([], "") when up to
    date.

    The script is for a team whose own tool applies it (Alembic's ``op.execute``, Flyway, golang-migrate,
    ``psql -1``), inside that tool's one transaction: it holds no BEGIN or COMMIT; it takes the lock
    ``migrate`` takes until that transaction ends; it creates ``schema`` only when it is missing (so an owner
    of a pre-created schema needs no CREATE right on the database); each file runs with the search_path
    ``migrate`` gives it, set for the transaction only, and the caller's search_path is given back at the end,
    before the tool writes its own record. Each file is recorded, schema-qualified, in effectgate's migration
    table as ``migrate`` records it, so ``migrate --check`` finds the database up to date afterwards. Guards
    before each file refuse it outside one transaction, if it is applied already, or if the file before it
    is not. For a pre-0021 ledger in ``public`` it runs the older files there, as ``migrate`` would.
    Raises ``MigrationError`` as ``pending`` does (an applied file changed, or a file numbered too low).
    """
    todo = await _pending_read_only(conn, directory)
    if not todo:
        return [], ""
    if "$head$" in schema:
        raise MigrationError(f"schema name {schema!r} cannot be printed inside the script's $head$ block")
    legacy = await _legacy(conn, directory)
    applied = [s.name for s in await status(conn, directory) if not s.pending]
    previous: str | None = max(applied, default=None)
    cursor = psycopg.AsyncClientCursor(conn)
    head = {"lock_id": MIGRATION_LOCK_ID, "schema": schema}
    parts = [cursor.mogrify(Q["migration_script_head"], head) + ";\n"]
    for index, migration in enumerate(todo):
        # Before the move (0021) a pre-0021 ledger's record is public's; 0021 moves it, and records itself there.
        in_public = legacy and migration.name <= OWN_SCHEMA_MIGRATION
        guarded = sql.Identifier("public" if in_public else schema, "schema_migrations")
        recorded = sql.Identifier(
            "public" if in_public and migration.name < OWN_SCHEMA_MIGRATION else schema, "schema_migrations"
        )
        parts.append(f"-- {migration.name} (sha256 {migration.checksum})")
        path = _search_path_for(migration, schema, legacy) or [schema]
        search_path = {"name": migration.name, "schemas": path}
        parts.append(cursor.mogrify(Q["migration_script_search_path"], search_path) + ";")
        if index == 0 and not legacy:
            parts.append(Q["migrations_table_ensure"] + ";")
        guard = sql.SQL(Q["migration_script_guard"]).format(record=guarded)
        parts.append(cursor.mogrify(guard, {"name": migration.name, "previous": previous}) + ";")
        text = migration.sql.rstrip()
        # A file whose last statement has no semicolon, or ends in a comment, must not swallow the record.
        parts.append(text if text.endswith(";") else text + "\n;")
        record = sql.SQL(Q["migration_script_record"]).format(record=recorded)
        parts.append(cursor.mogrify(record, {"name": migration.name, "checksum": migration.checksum}) + ";\n")
        previous = migration.name
    parts.append(Q["migration_script_tail"] + ";\n")
    return [m.name for m in todo], "\n".join(parts)


async def _pending_read_only(conn: Conn, directory: Traversable) -> list[Migration]:
    # pending()'s checks without its CREATE TABLE: printing a script must not write to the database.
    states = await status(conn, directory)
    changed = [s.name for s in states if s.changed]
    if changed:
        raise MigrationError(
            f"migration {changed[0]} was changed after it was applied; migrations are forward-only: "
            "add a new file instead"
        )
    last_applied = max((s.name for s in states if not s.pending), default="")
    early = [s.name for s in states if s.pending and s.name < last_applied]
    if early:
        raise MigrationError(
            f"migration {early[0]} is numbered before {last_applied}, which is already applied; "
            "renumber it after the last applied migration"
        )
    by_name = {m.name: m for m in discover(directory)}
    return [by_name[s.name] for s in states if s.pending]
