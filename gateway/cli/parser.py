"""The ``effectgate`` argument parser: each command group's module adds its own commands, in the order
``effectgate --help`` lists them; the operator's ``ledger`` and ``jobs`` commands come from
``gateway/operator/cli/`` and are given ``--database-url``/``--embedded`` here."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from ..operator import cli as operator_cli
from . import config, database, flags, migrate, reconcile, send, serve, up, worker


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("effectgate")
    except PackageNotFoundError:  # pragma: no cover - only from an uninstalled tree
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``effectgate`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="effectgate", description="Webhook gateway with an idempotent effect ledger."
    )
    parser.add_argument("--version", action="version", version=f"effectgate {_version()}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("EFFECTGATE_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up.register(sub)
    serve.register(sub)
    worker.register(sub)
    migrate.register(sub)
    reconcile.register(sub)
    up.register_fake_providers(sub)
    send.register(sub)
    config.register(sub)
    before = set(sub.choices)
    operator_cli.register(sub, database.run_on_ledger)
    for name in sorted(set(sub.choices) - before):
        for leaf in _leaf_parsers(sub.choices[name]):
            flags.with_database(leaf)
    return parser


def _leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parsers that run a command under ``parser`` (itself when it has no subcommands), each once."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield parser
        return
    for group in groups:
        # An alias maps to the same parser as its name.
        for child in {id(p): p for p in group.choices.values()}.values():
            yield from _leaf_parsers(child)
