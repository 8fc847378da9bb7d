"""What every ``effectgate`` command shares: the two kinds of mistake, the configuration's
path, the port check, and how a stop signal unwinds the process."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

from ..config import DEFAULT_CONFIG_FILE
from ..exit_codes import EXIT_OK

log = logging.getLogger("effectgate.cli")


class UsageError(Exception):
    """A mistake in how the command was called."""


class StartFailure(Exception):
    """The process could not start for a reason outside the command line (a port taken)."""


def config_path(args: argparse.Namespace) -> str:
    return str(args.config or os.environ.get("EFFECTGATE_CONFIG") or DEFAULT_CONFIG_FILE)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def terminate(signum: int, _frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C does, through every finally (the embedded Postgres is released),
    # rather than killing the process where it stands. uvicorn re-raises the signal it handled once it
    # has shut down, which lands here too.
    raise SystemExit(EXIT_OK)


def check_port_free(flag: str, host: str, port: int) -> None:
    """Fail before the database is touched when the gateway's port is taken: exit 1 with a message,
    not uvicorn's exit 3 after a migration."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # The same option uvicorn binds with, so a port in TIME_WAIT is free here as it is there.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            what = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                what += " (another process listens there: stop it, or choose another port)"
            raise StartFailure(f"{flag}: cannot listen on {host}:{port}: {what}") from exc


# Set by `effectgate up` for its children: the supervisor passes every stop signal on as SIGTERM.
SUPERVISED_ENV = "EFFECTGATE_SUPERVISED"
