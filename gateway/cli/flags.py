"""The flags several commands share (``--config``, ``--startup-wait``, ``--database-url``/``--embedded``,
``--migration-wait``) and the argument types that check a value where it is parsed, so a bad one is
argparse's usage message (exit 2) naming the flag."""

from __future__ import annotations

import argparse

from ..config import DEFAULT_CONFIG_FILE, DEFAULT_MIGRATION_WAIT, DEFAULT_STARTUP_WAIT
from ..config.gateway import parse_forwarded_allow_ips


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value}")
    return value


def trusted_proxies(text: str) -> tuple[str, ...]:
    try:
        return parse_forwarded_allow_ips([p for p in text.split(",") if p.strip()])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--config", help=f"configuration file (default: $EFFECTGATE_CONFIG or ./{DEFAULT_CONFIG_FILE})"
    )
    return p


def with_startup_wait(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--startup-wait",
        type=seconds,
        metavar="SECONDS",
        help="keep retrying an unreachable database this long at start (default: "
        f"$EFFECTGATE_STARTUP_WAIT, [database] startup_wait, or {DEFAULT_STARTUP_WAIT:g})",
    )
    return p


def with_database(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="the ledger's Postgres (default: $EFFECTGATE_DATABASE_URL, else $DATABASE_URL; prefer "
        "those: a command line is visible to every user of the machine)",
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="without a database URL, use the embedded Postgres in $EFFECTGATE_HOME (a "
        "single-machine trial; needs effectgate[embedded]; stopped when the last process using it exits)",
    )
    return p


def with_migration_wait(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--migration-wait",
        type=seconds,
        metavar="SECONDS",
        help="with --no-migrate: wait this long for the ledger's schema to reach this version, then "
        "refuse to start (exit 2) (default: $EFFECTGATE_MIGRATION_WAIT, [database] migration_wait, "
        f"or {DEFAULT_MIGRATION_WAIT:g})",
    )
    return p
