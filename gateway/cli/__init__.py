"""The ``effectgate`` command: the composition root. This package is the only place ``asyncio.run`` appears.

    effectgate up              gateway + worker (+ fake providers for the demo) on the embedded Postgres
    effectgate serve           the gateway alone (a production process: needs DATABASE_URL or --embedded)
    effectgate worker          a worker alone (a production process: needs DATABASE_URL or --embedded)
    effectgate migrate         apply pending migrations (--status, --check, --print-sql: see migrate.py)
    effectgate reconcile       one reconciler pass, printing what it repaired
    effectgate fake-providers  the fake payment and shipping APIs, for tests and demos
    effectgate send            sign an example event or a file as a source's provider would, and post it
    effectgate demo-delivery   post a freshly signed demo delivery to a running gateway

Exit codes (``gateway/exit_codes.py``, shared with the operator's commands): 0 success (also a clean stop on SIGTERM or SIGINT), 1 a runtime failure (database
unreachable, port in use, a child process died), 2 a usage or configuration mistake (the message names
the flag, file, key or variable; every mistake found is listed at once; also a ``--no-migrate`` process
whose ledger stayed behind its version), 5 ``migrate --check`` found migrations pending.

The ledger's URL: ``--database-url``, else ``EFFECTGATE_DATABASE_URL``, else ``DATABASE_URL``. Only ``up``
(without any of them) and an explicit ``--embedded`` ever start an embedded Postgres.

An embedded Postgres a process started or joined is released when the process exits, however it is
told to stop; the last process to release it stops it.

One module per command group: ``serve``, ``worker`` and ``up`` (which runs the other two as children, and
``fake-providers``), ``migrate``, ``reconcile``, ``send`` (and ``demo-delivery``), ``config``; the
operator's ``ledger`` and ``jobs`` live in ``gateway/operator/cli/``. What they share: ``common`` (errors),
``database`` (where the ledger is, the startup wait), ``flags`` (shared flags and argument types), ``parser``
(the whole parser). ``python -m effectgate.gateway.cli`` runs ``main`` (``__main__.py``).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from effectgate.ledger.errors import LedgerError, MigrationError

from .. import embedded, logs
from ..config import ConfigError
from ..exit_codes import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from . import database
from .common import StartFailure, UsageError, terminate
from .parser import build_parser
from .send import SendError

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``effectgate`` console script."""
    args = build_parser().parse_args(argv)
    database.remember(args)
    logs.configure(args.log_level)
    signal.signal(signal.SIGTERM, terminate)
    try:
        code: int = args.func(args)
        return code
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"effectgate: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, SendError) as exc:
        print(f"effectgate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (MigrationError, StartFailure) as exc:
        print(f"effectgate: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except (LedgerError, embedded.EmbeddedPostgresError) as exc:
        print(f"effectgate: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # The reader went away (`effectgate jobs list | head`): done, quietly, as git is. Standard output is
        # pointed at /dev/null so the interpreter's flush at exit does not raise the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
