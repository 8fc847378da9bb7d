"""``effectgate reconcile``: one reconciler pass (what the worker runs on a timer), printing what it repaired
as one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from effectgate.handlers.registry import REGISTRY
from effectgate.handlers.worker.maintenance import make_reconciler
from effectgate.ledger import db
from effectgate.ledger.cluster import topology
from effectgate.ledger.errors import MigrationError
from effectgate.ledger.migrate import unapplied

from ..exit_codes import EXIT_OK
from . import database, flags


def cmd_reconcile(args: argparse.Namespace) -> int:
    config = database.load_config(args)
    wait = flags.database_wait(args, "startup_wait", config)

    async def once(url: str) -> Any:
        await db.wait_until_reachable(url, wait)
        conn = await db.connect(
            url, schema=database.schema(config), idle_in_transaction_timeout=config.database.idle_bound
        )
        async with conn:
            async with db.translate_errors():
                pending = await unapplied(conn)
            if pending:
                # Otherwise the pass dies on a missing table, as a driver traceback.
                raise MigrationError(
                    f"the ledger lacks migrations {', '.join(pending)}: run effectgate migrate"
                )
            async with db.translate_errors():
                # A command run once reads what the database is once.
                known = await topology.read(conn)
            return await make_reconciler(REGISTRY, config.worker.reconciler, topology=known).run_once(conn)

    with database.ledger_url(args) as url:
        result = asyncio.run(once(url))
    if not result.owned:
        print("another process owns this reconciler pass; nothing done")
        return EXIT_OK
    print(json.dumps(result.summary()))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``reconcile`` to the command line."""
    flags.with_database(
        flags.with_startup_wait(
            flags.with_config(sub.add_parser("reconcile", help="run one reconciler pass"))
        )
    ).set_defaults(func=cmd_reconcile)
