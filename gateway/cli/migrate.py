"""``effectgate migrate`` and the schema check of ``serve``/``worker --no-migrate``.

    effectgate migrate               apply pending migrations; on Citus, then distribute the ledger by tenant
    effectgate migrate --status      applied and pending migrations (table, or --format json); read-only
    effectgate migrate --check       exit 0 when up to date, EXIT_PENDING (5) while any is pending (a migration,
                                     or on Citus a distribution step); read-only
    effectgate migrate --print-sql   the pending migrations as one SQL script on stdout; read-only

``--print-sql`` is for a team whose own migration tool (Flyway, Liquibase, Alembic, Rails …) owns the
schema: the script runs inside that tool's one transaction (no BEGIN or COMMIT of its own, the caller's
search_path given back at its end) and records each file in effectgate's migration table, so once it has
run, ``migrate --check`` and the ``--no-migrate`` processes find the database up to date.

A process started with ``--no-migrate`` waits for another one (a migrate job, a deploy pipeline) to bring
the schema to this version (``wait_for_schema``), logging what it waits for every few seconds, and refuses
to start when the wait is over rather than answer every delivery with an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import TextIO

from effectgate.ledger import db
from effectgate.ledger.cluster import distribution
from effectgate.ledger.errors import MigrationError
from effectgate.ledger.migrate import MigrationState, migrate, migrate_and_distribute, script, status

from ..config import Config
from ..exit_codes import EXIT_PENDING
from . import database, flags
from .common import UsageError

log = logging.getLogger("effectgate.cli")

# How often a --no-migrate process looks again, and how often it says it is still waiting.
SCHEMA_POLL_INTERVAL = 1.0
SCHEMA_LOG_INTERVAL = 5.0


class SchemaBehind(Exception):
    """The ledger's schema stayed behind this version for the whole wait (``serve``/``worker --no-migrate``)."""


def _state(state: MigrationState) -> str:
    if state.pending:
        return "pending"
    if state.changed:
        return "changed"  # applied from a file that differs from the one shipped now
    return "applied" if state.known else "applied (unknown to this version)"


def _state_json(state: MigrationState) -> dict[str, str | None]:
    return {
        "name": state.name,
        "status": _state(state),
        "applied_at": state.applied_at.isoformat() if state.applied_at else None,
    }


def print_status(
    states: list[MigrationState],
    fmt: str,
    out: TextIO = sys.stdout,
    *,
    undistributed: list[str] | None = None,
) -> None:
    """Every migration with its state and when it was applied: a table, or ``fmt == "json"``; then, on Citus,
    the distribution steps ``migrate`` would still take (``undistributed``)."""
    pending = [s.name for s in states if s.pending]
    undistributed = undistributed or []
    if fmt == "json":
        document = {
            "up_to_date": not pending and not undistributed and not any(s.changed for s in states),
            "pending": pending,
            "distribution_pending": undistributed,
            "migrations": [_state_json(s) for s in states],
        }
        out.write(json.dumps(document, indent=2) + "\n")
        return
    rows = [("MIGRATION", "STATUS", "APPLIED AT")]
    rows += [(s.name, _state(s), s.applied_at.isoformat() if s.applied_at else "-") for s in states]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for name, state, applied_at in rows:
        out.write(f"{name:<{widths[0]}}  {state:<{widths[1]}}  {applied_at}\n")
    out.write(f"\n{len(states) - len(pending)} applied, {len(pending)} pending\n")
    if undistributed:
        out.write("pending distribution on Citus: " + "; ".join(undistributed) + "\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("effectgate")
    except PackageNotFoundError:  # pragma: no cover - only from an uninstalled tree
        return "(uninstalled)"


async def run(
    url: str, startup_wait: float, action: str, fmt: str = "table", schema: str = db.DEFAULT_SCHEMA
) -> int:
    """One ``migrate`` invocation against ``url``: ``apply``, ``status``, ``check`` or ``print-sql``."""
    await db.wait_until_reachable(url, startup_wait)
    conn = await db.connect(url, schema=schema)
    async with conn:
        async with db.translate_errors():
            if action == "apply":
                done = await migrate_and_distribute(conn, schema=schema)
                print("applied: " + ", ".join(done.applied) if done.applied else "up to date")
                if done.distributed:
                    print("distributed on Citus: " + "; ".join(done.distributed))
                return 0
            if action == "print-sql":
                names, text = await script(conn, schema=schema)
                if not names:
                    print("effectgate: no migration is pending; nothing to print", file=sys.stderr)
                    return 0
                sys.stdout.write(
                    f"-- effectgate {_version()}: {len(names)} pending migration(s), from "
                    "`effectgate migrate --print-sql`.\n"
                    "-- Each migration records itself in the migration table, as `effectgate migrate` does.\n"
                    "-- Run it whole inside one transaction (it holds no BEGIN or COMMIT, and gives the "
                    "search_path back as it found it):\n"
                    "-- your tool's (Alembic op.execute, Flyway, golang-migrate), or psql -1 -v ON_ERROR_STOP=1 "
                    "-f THIS_FILE\n\n" + text
                )
                print(f"effectgate: printed {len(names)} pending: {', '.join(names)}", file=sys.stderr)
                return 0
            states = await status(conn)
            # Where Citus is installed: what `migrate` would still do to distribute the ledger (objects of a
            # pending migration are listed once it is applied).
            undistributed = [s.what for s in await distribution.missing(conn)]
    if action == "status":
        print_status(states, fmt, undistributed=undistributed)
        return 0
    changed = [s.name for s in states if s.changed]
    if changed:
        raise MigrationError(
            f"migrations {', '.join(changed)} were changed after they were applied; the database does not "
            "match this version's files"
        )
    pending = [s.name for s in states if s.pending]
    if pending or undistributed:
        if pending:
            print(f"pending: {', '.join(pending)}")
        if undistributed:
            # Citus is installed and the ledger is not (wholly) distributed: `migrate` does it.
            print("pending distribution on Citus: " + "; ".join(undistributed))
        return EXIT_PENDING
    print(f"up to date ({len(states)} applied)")
    return 0


def _lacking(pending: list[str], undistributed: list[str]) -> str:
    parts = [f"migrations {', '.join(pending)}"] if pending else []
    if undistributed:
        parts.append("its distribution on Citus (" + "; ".join(undistributed) + ")")
    return " and ".join(parts)


async def wait_for_schema(
    url: str, startup_wait: float, migration_wait: float, schema: str = db.DEFAULT_SCHEMA
) -> None:
    """Return once every migration this version ships is applied to ``url``'s ledger, looking again every
    second for up to ``migration_wait`` seconds and logging what is still pending every few seconds.

    Raises ``SchemaBehind`` when the wait is over, ``MigrationError`` at once when an applied migration
    changed (no wait can fix that), ``LedgerUnavailable`` when the database cannot be reached in
    ``startup_wait`` seconds. Read-only: a runtime role without DDL rights can run it.
    """
    await db.wait_until_reachable(url, startup_wait)
    deadline = time.monotonic() + migration_wait
    next_log = 0.0
    conn = await db.connect(url, schema=schema)
    async with conn:
        while True:
            async with db.translate_errors():
                states = await status(conn)
                # A process that starts before the ledger is distributed would read its topology as a single
                # node's and keep it for its life (ledger/cluster/topology.py): it waits for the distribution too.
                undistributed = [s.what for s in await distribution.missing(conn)]
            changed = [s.name for s in states if s.changed]
            if changed:
                raise MigrationError(
                    f"migrations {', '.join(changed)} were changed after they were applied; the ledger's "
                    "schema does not match this version"
                )
            pending = [s.name for s in states if s.pending]
            if not pending and not undistributed:
                if next_log:
                    log.info("schema.up_to_date", extra={"applied": len(states)})
                return
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                raise SchemaBehind(
                    f"the ledger lacks {_lacking(pending, undistributed)} after waiting {migration_wait:g}s "
                    "with --no-migrate: apply them first (`effectgate migrate`, or the script of "
                    "`effectgate migrate --print-sql` in your own migration tool), or start without "
                    "--no-migrate (to wait longer: --migration-wait, EFFECTGATE_DATABASE__MIGRATION_WAIT or "
                    "[database] migration_wait)"
                )
            if now >= next_log:
                log.warning(
                    "schema.migrations_pending",
                    extra={"pending": pending + undistributed, "waiting_up_to": round(remaining, 1)},
                )
                next_log = now + SCHEMA_LOG_INTERVAL
            await asyncio.sleep(min(SCHEMA_POLL_INTERVAL, remaining))


async def apply(url: str, startup_wait: float = 0.0, schema: str = db.DEFAULT_SCHEMA) -> list[str]:
    """Apply every pending migration to ``url``'s ledger (``up``, and ``serve``/``worker`` without
    ``--no-migrate``); the names applied."""
    await db.wait_until_reachable(url, startup_wait)
    conn = await db.connect(url, schema=schema)
    async with conn:
        return await migrate(conn, schema=schema)


def prepare_schema(args: argparse.Namespace, config: Config, url: str, startup_wait: float) -> None:
    """Apply pending migrations, or under ``--no-migrate`` wait (bounded) for someone else to."""
    if not args.no_migrate:
        asyncio.run(apply(url, startup_wait, database.schema(config)))
        return
    try:
        wait = flags.database_wait(args, "migration_wait", config)
        asyncio.run(wait_for_schema(url, startup_wait, wait, database.schema(config)))
    except SchemaBehind as exc:
        raise UsageError(str(exc)) from exc


def cmd_migrate(args: argparse.Namespace) -> int:
    wait = flags.database_wait(args, "startup_wait")
    action = (
        "status" if args.status else "check" if args.check else "print-sql" if args.print_sql else "apply"
    )
    if args.format != "table" and action != "status":
        raise UsageError("--format: only with --status")
    with database.ledger_url(args) as url:
        return asyncio.run(run(url, wait, action, args.format, database.schema()))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``migrate`` to the command line."""
    mig = flags.with_database(
        flags.with_startup_wait(
            sub.add_parser(
                "migrate",
                help="apply pending migrations, or show, check or print them",
                description="Apply pending migrations (under an advisory lock), or, without changing "
                "anything: list them (--status), exit 5 while any is pending (--check), or print them as "
                "one SQL script that records itself, for your own migration tool (--print-sql).",
            )
        )
    )
    what = mig.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="list applied and pending migrations")
    what.add_argument(
        "--check", action="store_true", help=f"exit {EXIT_PENDING} while any is pending, else 0"
    )
    what.add_argument(
        "--print-sql", action="store_true", help="write the pending migrations to stdout as one SQL script"
    )
    mig.add_argument("--format", choices=["table", "json"], default="table", help="with --status")
    mig.set_defaults(func=cmd_migrate)
