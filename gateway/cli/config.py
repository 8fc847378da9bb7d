"""``effectgate config``: check a configuration, show the effective one, print its schema and reference.

Everything comes from the settings declaration (``gateway.config.settings``): ``check`` runs the same
loading and handler start-up checks as ``serve``/``worker`` for a role, without a database; ``show`` prints
the file with the environment overrides and every default (secrets masked), and in TOML the retry schedules
they give, the handler modules' kinds included; ``schema`` the JSON Schema
for editors; ``reference`` the settings tables of docs/configuration.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import cast

from effectgate.handlers.registry import REGISTRY

from ..config import DEFAULT_CONFIG_FILE, ConfigError, load, reference, schema, show
from ..config.env import override
from ..config.handler_imports import import_handlers
from ..config.secrets import Role

ROLES = ("all", "gateway", "worker")


def _path(args: argparse.Namespace) -> str:
    return str(args.config or os.environ.get("EFFECTGATE_CONFIG") or DEFAULT_CONFIG_FILE)


def cmd_check(args: argparse.Namespace) -> int:
    config = load(_path(args), role=cast(Role, args.role))
    import_handlers(config)
    print(
        f"{config.path}: ok for role {args.role} ({len(config.sources)} sources, "
        f"{len(config.handler_modules)} handler modules, {len(config.downstream_names)} downstreams)"
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    path = _path(args)
    # Validated first, as the role would load it: a file that would not start is not shown as if it would.
    config = load(path, role=cast(Role, args.role))
    data, _ = override(tomllib.loads(Path(path).read_text(encoding="utf-8")), os.environ)
    effective = show.build(data)
    if args.format == "json":
        sys.stdout.write(show.as_json(effective) + "\n")
        return 0
    # The kinds' own retry budgets live in the handler modules too: imported as serve and worker do.
    import_handlers(config, warn=False)
    schedules = show.retry_schedules(config.worker, REGISTRY.kinds())
    sys.stdout.write(show.as_toml(effective) + schedules)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(schema.schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    if not args.write:
        sys.stdout.write(reference.reference() + "\n")
        return 0
    page = Path(args.write)
    try:
        changed = reference.write(page)
    except OSError as exc:
        raise ConfigError(f"{page}: cannot rewrite: {exc}") from exc
    except reference.MarkersMissing as exc:
        raise ConfigError(f"{page}: {exc}") from exc
    print(f"{page}: {'rewritten' if changed else 'already up to date'}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``config check|show|schema|reference`` to the command line."""
    parser = sub.add_parser("config", help="check, show, or describe the configuration")
    commands = parser.add_subparsers(dest="config_command", required=True, metavar="COMMAND")

    def with_file(p: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
        p.add_argument(
            "--config", help=f"configuration file (default: $EFFECTGATE_CONFIG or ./{DEFAULT_CONFIG_FILE})"
        )
        p.add_argument(
            "--role",
            choices=ROLES,
            default="all",
            help="load as this process would: gateway (serve), worker, or all (default): each checks only the "
            "secrets it reads",
        )
        p.set_defaults(func=func)

    with_file(
        commands.add_parser(
            "check",
            help="load and validate the file for a role, import its handlers and run their start-up checks; "
            "exit 0, or 2 naming each mistake",
        ),
        cmd_check,
    )
    show = commands.add_parser(
        "show", help="the effective configuration: file, EFFECTGATE_<SECTION>__<KEY> overrides, defaults"
    )
    show.add_argument("--format", choices=("toml", "json"), default="toml")
    with_file(show, cmd_show)
    schema = commands.add_parser(
        "schema", help="the JSON Schema (draft 2020-12) of effectgate.toml, for editors"
    )
    schema.add_argument("--output", "-o", metavar="FILE", help="write it here instead of standard output")
    schema.set_defaults(func=cmd_schema)
    reference = commands.add_parser(
        "reference", help="the settings reference (Markdown) of docs/configuration.md"
    )
    reference.add_argument(
        "--write",
        metavar="PAGE",
        help="replace the generated part of PAGE (docs/configuration.md) instead of printing",
    )
    reference.set_defaults(func=cmd_reference)
