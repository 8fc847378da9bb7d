"""The flags several commands share (``--config``, ``--startup-wait``, ``--database-url``/``--embedded``,
``--migration-wait``) and the argument types that check a value where it is parsed, so a bad one is
argparse's usage message (exit 2) naming the flag; and ``database_wait``, the one reader of the two waits'
flag, environment and file."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from typing import Literal

from ..config import DEFAULT_CONFIG_FILE, DEFAULT_MIGRATION_WAIT, DEFAULT_STARTUP_WAIT, Config
from ..config.env import PREFIX, parse_value
from ..config.gateway import parse_forwarded_allow_ips
from ..config.settings import SETTINGS
from .common import UsageError

log = logging.getLogger("effectgate.cli")

WaitKey = Literal["startup_wait", "migration_wait"]
_WAIT_DEFAULTS: dict[WaitKey, float] = {
    "startup_wait": DEFAULT_STARTUP_WAIT,
    "migration_wait": DEFAULT_MIGRATION_WAIT,
}
#: The older single variables of the two waits, deprecated for EFFECTGATE_DATABASE__<KEY>, every key's spelling
#: (docs/configuration.md). Still read, and still winning over the new name as they always did, so a deployment
#: that sets one keeps its wait; reading one logs the name to move to.
DEPRECATED_WAIT_VARIABLES: dict[WaitKey, str] = {
    "startup_wait": "EFFECTGATE_STARTUP_WAIT",
    "migration_wait": "EFFECTGATE_MIGRATION_WAIT",
}


def wait_variable(key: WaitKey) -> str:
    """The environment variable of ``[database] key``: ``EFFECTGATE_DATABASE__STARTUP_WAIT``."""
    return f"{PREFIX}DATABASE__{key.upper()}"


def database_wait(
    args: argparse.Namespace, key: WaitKey, config: Config | None = None, env: Mapping[str, str] | None = None
) -> float:
    """Seconds of ``[database] key`` (``startup_wait``, ``migration_wait``): its flag (``--startup-wait``),
    else the environment (``EFFECTGATE_DATABASE__STARTUP_WAIT``; the deprecated ``EFFECTGATE_STARTUP_WAIT``
    before it), else the file, else the default.

    ``config``, when given, already holds the variable over the file (``config.env``); a command that reads no
    file (``migrate``) reads the variable here, with the same parsing and the same message for a bad one."""
    flag = getattr(args, key, None)
    if flag is not None:
        return float(flag)
    env = os.environ if env is None else env
    old = DEPRECATED_WAIT_VARIABLES[key]
    text = env.get(old)
    if text:
        log.warning("config.deprecated_variable", extra={"variable": old, "use": wait_variable(key)})
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise UsageError(f"{old}: expected a number of seconds >= 0, got {text!r}")
        return value
    if config is not None:
        return float(getattr(config.database, key))
    name = wait_variable(key)
    if name in env:
        (setting,) = (s for s in SETTINGS if s.path == f"database.{key}")
        try:
            return float(parse_value(setting, env[name]))
        except ValueError as exc:
            raise UsageError(f"environment {name}: {exc}") from None
    return _WAIT_DEFAULTS[key]


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
        f"${wait_variable('startup_wait')}, [database] startup_wait, or {DEFAULT_STARTUP_WAIT:g})",
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
        f"refuse to start (exit 2) (default: ${wait_variable('migration_wait')}, [database] migration_wait, "
        f"or {DEFAULT_MIGRATION_WAIT:g})",
    )
    return p
