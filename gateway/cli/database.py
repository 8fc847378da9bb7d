"""Where the ledger is: ``--database-url``, else ``EFFECTGATE_DATABASE_URL``, else ``DATABASE_URL``; the
embedded Postgres only for ``up`` (without any of them) or an explicit ``--embedded``. Also how long a
command keeps retrying an unreachable database at start, and the configuration loaded together with the
database's own mistakes (so ``serve`` and ``worker`` list every mistake at once)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace

from effectgate.ledger import db

from .. import embedded
from ..config import Config, ConfigError, load
from ..config.handler_imports import import_handlers
from ..config.secrets import Role
from .common import UsageError, config_path, log, signals_ignored


def load_config(args: argparse.Namespace, *, database: bool = False, role: Role = "all") -> Config:
    """The configuration with the secrets ``role`` uses, its handler modules imported. With
    ``database``, a missing ``DATABASE_URL`` (serve and worker) is reported together with the
    configuration's own mistakes."""
    problems: list[str] = []
    config = None
    try:
        config = load(config_path(args), role=role)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if database:
        problem = database_problem(args)
        if problem:
            problems.append(problem)
    if problems or config is None:
        raise ConfigError(*problems)
    import_handlers(config)
    # EFFECTGATE_SCHEMA wins over [database] schema, here once, so every pool the config reaches agrees.
    return replace(config, database=replace(config.database, schema=schema(config)))


def schema(config: Config | None = None) -> str:
    """effectgate's Postgres schema: ``EFFECTGATE_SCHEMA``, then ``[database] schema``, then the default.
    Commands that read no configuration file (``migrate``, ``ledger``, ``jobs``) see only the variable."""
    text = os.environ.get("EFFECTGATE_SCHEMA")
    if text:
        try:
            return db.check_schema_name(text)
        except ValueError as exc:
            raise UsageError(f"EFFECTGATE_SCHEMA: {exc}") from None
    return config.database.schema if config is not None else db.DEFAULT_SCHEMA


# Where the ledger's URL comes from, first match wins: a variable of effectgate's own beats the generic one,
# which an application sharing the environment (Rails, Django, Heroku) may have set for its own database.
DATABASE_URL_VARIABLES = ("EFFECTGATE_DATABASE_URL", "DATABASE_URL")


def chosen_url(args: argparse.Namespace) -> tuple[str, str] | None:
    """(where it came from, the URL): ``--database-url``, then ``DATABASE_URL_VARIABLES``; or None."""
    flag = getattr(args, "database_url", None)
    if flag:
        return "--database-url", str(flag)
    for name in DATABASE_URL_VARIABLES:
        url = os.environ.get(name)
        if url:
            return name, url
    return None


def database_problem(args: argparse.Namespace) -> str | None:
    """Why the command cannot choose a database (no URL and no ``--embedded``, or both), or None."""
    chosen = chosen_url(args)
    wants_embedded = getattr(args, "embedded", False)
    if chosen and wants_embedded:
        return (
            f"--embedded: {chosen[0]} is set too; unset it to use the embedded Postgres, or drop --embedded"
        )
    if chosen:
        try:
            db.describe(chosen[1])
        except ValueError as exc:
            return f"{chosen[0]}: {exc}"
        return None
    if wants_embedded:
        return None
    if args.command in ("serve", "worker"):
        why = "replicas with a ledger each would let duplicates through"
    else:
        why = "it would act on an empty ledger of its own, not yours"
    return (
        "DATABASE_URL is not set: set it to the ledger's Postgres (postgresql://USER:PASSWORD@HOST:5432/DBNAME), "
        "or EFFECTGATE_DATABASE_URL (which wins over DATABASE_URL), or pass --database-url URL; "
        f"or pass --embedded for a single-machine trial on an embedded Postgres in {embedded.home_dir()}. "
        f"({args.command} never starts a private database on its own: {why}.)"
    )


@contextlib.contextmanager
def ledger_url(args: argparse.Namespace, *, embedded_by_default: bool = False) -> Iterator[str]:
    """The ledger's URL while the block runs (``chosen_url``), or the embedded Postgres when the command
    was given ``--embedded`` (or is ``up``: ``embedded_by_default``), held for the block and released after
    it, however the block ends. Any other command without a URL is refused, naming every way to give one."""
    if not embedded_by_default:
        problem = database_problem(args)
        if problem:
            raise UsageError(problem)
    chosen = chosen_url(args)
    if chosen:
        yield chosen[1]
        return
    data_dir = embedded.home_dir() / "pgdata"
    held = embedded.acquire(data_dir)
    log.info("embedded.started", extra={"data_dir": str(data_dir)})
    try:
        yield held.url
    finally:
        # A second SIGTERM or Ctrl-C must not cut the stop short and leave the server running.
        with signals_ignored():
            held.release()


# This process's parsed command line, for run_on_ledger: the ledger and jobs commands hand it only the
# coroutine to run, and where the ledger is (--database-url, --embedded) was said on the command line.
_command_line = argparse.Namespace(command="ledger", database_url=None, embedded=False)


def run_on_ledger(command: Callable[[db.Conn], Awaitable[None]]) -> None:
    """Run ``command`` with one connection to the ledger (``ledger_url``) in a new event loop."""
    in_schema = schema()

    async def main(url: str) -> None:
        conn = await db.connect(url, schema=in_schema)
        async with conn:
            await command(conn)

    with ledger_url(_command_line) as url:
        asyncio.run(main(url))


def remember(args: argparse.Namespace) -> None:
    """Keep this process's parsed command line for ``run_on_ledger`` and ``command_line``."""
    global _command_line
    _command_line = args


def command_line() -> argparse.Namespace:
    """This process's parsed command line (as ``remember`` was given it)."""
    return _command_line
