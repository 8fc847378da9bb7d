"""The migration runner: numbered, forward-only SQL files applied once each, in order.

Runs under an advisory lock, so gateways and workers starting together apply each migration once.
Each file is applied in its own transaction together with its record (name and SHA-256 checksum);
a file that changed after it was applied is refused, since the database no longer matches it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

import psycopg
from psycopg import sql

from .db import Conn
from .errors import MigrationError
from .queries import Q

# Shipped inside the package (effectgate.migrations), so an installed wheel finds them from any directory.
MIGRATIONS_DIR: Traversable = files("effectgate.migrations")
_FILE_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
# Fixed, arbitrary: the same number in every process of every version.
MIGRATION_LOCK_ID = 0x6566_6765_6D69_6772  # "efgemigr"


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


async def pending(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[Migration]:
    """Migrations not yet applied to this database (raises if an applied one changed)."""
    await conn.execute(Q["migrations_table_ensure"])
    applied = {
        row["name"]: row["checksum"] for row in await (await conn.execute(Q["migrations_applied"])).fetchall()
    }
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


async def unapplied(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[str]:
    """Migrations this database lacks, or whose applied checksum differs, read-only (readiness checks)."""
    row = await (await conn.execute(Q["migrations_table_exists"])).fetchone()
    if row is None or not row["present"]:
        return [m.name for m in discover(directory)]
    applied = {
        r["name"]: r["checksum"] for r in await (await conn.execute(Q["migrations_applied"])).fetchall()
    }
    problems = []
    for m in discover(directory):
        if m.name not in applied:
            problems.append(m.name)
        elif applied[m.name] != m.checksum:
            problems.append(f"{m.name} (changed after it was applied)")
    return problems


async def migrate(conn: Conn, directory: Traversable = MIGRATIONS_DIR) -> list[str]:
    """Apply every pending migration; returns the names applied (empty when up to date)."""
    await conn.execute(Q["migrations_lock"], {"lock_id": MIGRATION_LOCK_ID})
    try:
        applied: list[str] = []
        for migration in await pending(conn, directory):
            try:
                async with conn.transaction():
                    # The file is trusted project source, run as a script of several statements.
                    await conn.execute(sql.SQL(migration.sql))
                    await conn.execute(
                        Q["migration_record"], {"name": migration.name, "checksum": migration.checksum}
                    )
            except psycopg.Error as exc:
                raise MigrationError(f"migration {migration.name} failed: {exc}") from exc
            applied.append(migration.name)
        return applied
    finally:
        await conn.execute(Q["migrations_unlock"], {"lock_id": MIGRATION_LOCK_ID})
