"""``effectgate serve``: the gateway, in this process or in ``--workers N`` processes sharing its port(s).

The gateway's port, and the operator plane's when it listens apart, are checked before the database is
touched (a port taken is exit 1 with a message, not uvicorn's exit 3 after a migration).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from effectgate.handlers import tracing
from effectgate.handlers.registry import REGISTRY

from .. import logs
from ..config import Config, load
from ..config.handler_imports import import_handlers
from ..config.operator import DEFAULT_OPERATOR_HOST
from ..edge import client_slots, guard
from ..exit_codes import EXIT_FAILURE, EXIT_OK
from . import database, flags, migrate
from .common import UsageError, check_port_free, log
from .loop import event_loop

# What uvicorn exits with when the server could not start (port taken, lifespan failed).
UVICORN_STARTUP_FAILURE = 3


def serve_app() -> Any:
    """The gateway app built from the environment: the factory each ``serve --workers N`` process calls.

    ``cmd_serve`` puts the configuration path, the database URL and the dashboard's session key in the
    environment before uvicorn starts its processes, so every process builds the same app, imports the
    same handler modules and accepts the same sessions.
    """
    from ..app import create_app
    from ..edge import supervisor

    supervisor.die_with_parent()
    logs.configure(os.environ.get("EFFECTGATE_LOG_LEVEL", "INFO"))
    config = load(os.environ["EFFECTGATE_CONFIG"], role="gateway")
    # The supervisor checked EFFECTGATE_SCHEMA; each child reads it the same way.
    config = replace(config, database=replace(config.database, schema=database.schema(config)))
    # The supervisor already warned about the handlers once; N children need not repeat it.
    import_handlers(config, warn=False)
    tracing.configure(config.tracing, role="gateway")
    session_key = bytes.fromhex(os.environ.pop(_SESSION_KEY_ENV))
    trusted = os.environ.get(_TRUSTED_ENV)
    if trusted is not None:
        config = replace(
            config,
            gateway=replace(config.gateway, forwarded_allow_ips=tuple(p for p in trusted.split(",") if p)),
        )
    operator_port = os.environ.get(_OPERATOR_PORT_ENV)
    app = create_app(
        config,
        REGISTRY,
        os.environ["DATABASE_URL"],
        session_key=session_key,
        operator_port=int(operator_port) if operator_port else None,
    )
    guard.configure(config.gateway.limits, app.state.penalty_box, client_slots.per_process(config.gateway))
    return app


# The dashboard's signing key when no secret is configured: made by the supervisor, shared by its children.
_SESSION_KEY_ENV = "EFFECTGATE_SESSION_KEY"
# The supervisor's choices its children cannot read from the configuration file: the operator plane's
# bound port (which may have been 0) and the trusted proxies (which --forwarded-allow-ips may override).
_OPERATOR_PORT_ENV = "EFFECTGATE_OPERATOR_PORT"
_TRUSTED_ENV = "EFFECTGATE_FORWARDED_ALLOW_IPS"
_APP_FACTORY = "effectgate.gateway.cli.serve:serve_app"


def cmd_serve(args: argparse.Namespace) -> int:
    config = database.load_config(args, database=True, role="gateway")
    wait = flags.database_wait(args, "startup_wait", config)
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    check_port_free("--port" if args.port is not None else "gateway.port", host, port)
    operator = _operator_listen(args, config, port)
    if operator is not None:
        flag = "--operator-port" if args.operator_port is not None else "operator.listen"
        check_port_free(flag, *operator)
    with database.ledger_url(args) as url:
        migrate.prepare_schema(args, config, url, wait)
        try:
            _serve(args, config, url, host, port, operator)
        except SystemExit as exc:
            if exc.code != UVICORN_STARTUP_FAILURE:
                raise
            print("effectgate: the gateway did not start (the log above says why)", file=sys.stderr)
            return EXIT_FAILURE
    return EXIT_OK


def _operator_listen(args: argparse.Namespace, config: Config, port: int) -> tuple[str, int] | None:
    """Where the operator plane listens on its own (--operator-host/--operator-port, else [operator]
    listen), or None when it shares the gateway's listener."""
    op_port = args.operator_port if args.operator_port is not None else config.operator.listen_port
    if op_port is None:
        if args.operator_host is not None:
            raise UsageError("--operator-host: needs --operator-port (or [operator] listen)")
        return None
    op_host = args.operator_host or config.operator.listen_host or DEFAULT_OPERATOR_HOST
    if op_port != 0 and op_port == port:
        raise UsageError(f"--operator-port: {op_port} is the gateway's own port; choose another")
    return op_host, op_port


def _serve(
    args: argparse.Namespace,
    config: Config,
    url: str,
    host: str,
    port: int,
    operator: tuple[str, int] | None = None,
) -> None:
    import uvicorn

    from ..app import create_app
    from ..edge import supervisor

    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": event_loop(),
        "lifespan": "on",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": 10,
    }
    trusted = (
        config.gateway.forwarded_allow_ips if args.forwarded_allow_ips is None else args.forwarded_allow_ips
    )
    # uvicorn believes X-Forwarded-* from 127.0.0.1 unless told otherwise; effectgate believes no one
    # unless configured, so the middleware is off altogether when the list is empty.
    options["proxy_headers"] = bool(trusted)
    if trusted:
        options["forwarded_allow_ips"] = list(trusted)
    config = replace(config, gateway=replace(config.gateway, forwarded_allow_ips=tuple(trusted)))
    session_key = os.urandom(32)
    # Both planes' sockets are bound here, before any process serves: every process (one, or each of
    # the N children) serves both, and the app tells them apart by the local port (gateway.planes).
    sockets: list[socket.socket] | None = None
    operator_port: int | None = None
    if operator is not None:
        # uvicorn's own binding (its socket options, its message), for an app it never loads here.
        public = uvicorn.Config(_APP_FACTORY, host=host, port=port).bind_socket()
        private = uvicorn.Config(_APP_FACTORY, host=operator[0], port=operator[1]).bind_socket()
        sockets = [public, private]
        operator_port = private.getsockname()[1]
        log.info(
            "operator.listening",
            extra={
                "operator": f"{operator[0]}:{operator_port}",
                "public": f"{host}:{public.getsockname()[1]}",
            },
        )
    if args.workers > 1:
        # Several processes share the listening socket; each builds its app from the environment and
        # imports the guarded protocol by name.
        os.environ["EFFECTGATE_CONFIG"] = str(Path(config.path).resolve())
        os.environ["DATABASE_URL"] = url
        os.environ["EFFECTGATE_LOG_LEVEL"] = args.log_level
        os.environ[_SESSION_KEY_ENV] = session_key.hex()
        os.environ[_TRUSTED_ENV] = ",".join(trusted)
        if operator_port is not None:
            os.environ[_OPERATOR_PORT_ENV] = str(operator_port)
        supervisor.run(
            uvicorn.Config(
                _APP_FACTORY,
                factory=True,
                workers=args.workers,
                http=guard.PROTOCOL_PATH,
                **options,
            ),
            sockets,
        )
        return
    tracing.configure(config.tracing, role="gateway")
    app = create_app(config, REGISTRY, url, session_key=session_key, operator_port=operator_port)
    protocol = guard.configure(
        config.gateway.limits, app.state.penalty_box, client_slots.per_process(config.gateway)
    )
    # Server.run, not asyncio.run(server.serve()): only the former installs the uvloop event loop the
    # options ask for; the latter would silently run on the stdlib loop.
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, **options))
    server.run(sockets)
    if not server.started:
        sys.exit(UVICORN_STARTUP_FAILURE)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the command line."""
    serve = flags.with_migration_wait(
        flags.with_database(
            flags.with_startup_wait(flags.with_config(sub.add_parser("serve", help="run the gateway")))
        )
    )
    serve.add_argument("--host")
    serve.add_argument("--port", type=flags.port)
    serve.add_argument("--no-migrate", action="store_true", help="do not apply pending migrations first")
    serve.add_argument(
        "--workers",
        type=flags.positive_int,
        default=1,
        help="gateway processes sharing the port (default: 1)",
    )
    serve.add_argument(
        "--operator-port",
        type=flags.port,
        help="serve /ui, /api and /metrics on this port only; the gateway's port then serves /webhooks/*, "
        "/healthz and /readyz alone (default: [operator] listen, else both on the gateway's port)",
    )
    serve.add_argument(
        "--operator-host",
        help=f"address for --operator-port (default: [operator] listen's, else {DEFAULT_OPERATOR_HOST})",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        type=flags.trusted_proxies,
        metavar="IPS",
        help="comma-separated proxy addresses/networks whose X-Forwarded-Proto/-For are trusted, '*' for "
        "any, '' for none (default: [gateway] forwarded_allow_ips, else none)",
    )
    serve.set_defaults(func=cmd_serve)
