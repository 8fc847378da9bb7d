"""How an operator command runs: its exit codes, the errors that choose them, the runner that connects to
the ledger and turns a bad parameter, a missing row or a refusal into a message and a code, who the
operator is (``cli:<user>``), and the flags every command shares."""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from effectgate.ledger import db, jobs
from effectgate.ledger.reports import ReportSpec
from effectgate.ledger.vocabulary import RefusalCode

from ...exit_codes import EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from .. import documents, reporting
from ..params import PARAMETER_ERRORS, BadParameter, parse_name

# How a parameter is called on the command line, where it is not --the-same-name.
_FLAGS = {"job_id": "JOB_ID", "key": "KEY"}


class NotFound(Exception):
    """The effect or job asked for does not exist."""


class Refused(Exception):
    """A job action was refused by the ledger, with its code."""

    def __init__(self, code: str, detail: str, document: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        # What --format json prints instead of the bare error (a bulk action's summary).
        self.document = document


Command = Callable[[db.Conn, argparse.Namespace, TextIO], Awaitable[None]]
# Runs an async function of a ledger connection to completion. The composition root (gateway/cli/)
# passes it in, so the event loop and the database URL are chosen in one place and this module does
# not import the CLI that imports it.
LedgerRunner = Callable[[Callable[[db.Conn], Awaitable[None]]], None]


def runner(command: Command, run_on_ledger: LedgerRunner) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        out = sys.stdout
        try:
            run_on_ledger(lambda conn: command(conn, args, out))
        except PARAMETER_ERRORS as exc:
            flag = _FLAGS.get(exc.parameter, "--" + exc.parameter.replace("_", "-"))
            print(f"effectgate: {flag}: {exc.detail} [{exc.code}]", file=sys.stderr)
            return EXIT_USAGE
        except NotFound as exc:
            print(f"effectgate: not found: {exc}", file=sys.stderr)
            if args.format == "json":
                print(json.dumps({"error": "not_found", "detail": str(exc)}), file=out)
            return EXIT_NOT_FOUND
        except Refused as exc:
            print(f"effectgate: refused: {exc.code}: {exc.detail}", file=sys.stderr)
            if args.format == "json":
                document = {"error": exc.code, "detail": exc.detail, **(exc.document or {})}
                print(json.dumps(documents.jsonable(document)), file=out)
            return EXIT_REFUSED
        return EXIT_OK

    return run


def operator_name() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):
        return "cli"


def resolver(args: argparse.Namespace) -> str:
    """Who resolves: ``--by NAME`` as ``cli:NAME``, else the OS user (``cli:alice``)."""
    if args.by is None:
        return operator_name()
    return f"cli:{parse_name(args.by, 'by')}"


def import_handler_modules(args: argparse.Namespace) -> None:
    for module in getattr(args, "handlers", None) or ():
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise BadParameter("handlers", f"cannot import {module!r}: {type(exc).__name__}: {exc}") from exc


def refusal_error(refusal: jobs.Refused) -> Exception:
    return (
        NotFound(refusal.detail)
        if refusal.code == RefusalCode.NOT_FOUND
        else Refused(refusal.code, refusal.detail)
    )


def raw_parameters(spec: ReportSpec, args: argparse.Namespace) -> dict[str, str]:
    return {
        name: value for name in reporting.parameters(spec) if (value := getattr(args, name, None)) is not None
    }


EPILOG = "exit codes: 0 done, 1 runtime failure, 2 usage mistake, 3 not found, 4 refused (code printed)"


def format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=["table", "json", "csv"], default="table", help="output (default: table)"
    )


def report_flags(p: argparse.ArgumentParser, spec: ReportSpec) -> None:
    for name in reporting.parameters(spec):
        p.add_argument("--" + name.replace("_", "-"), dest=name, help=reporting.describe(spec, name))
    format_flag(p)
