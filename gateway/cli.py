"""The ``effectgate`` command: the composition root, and the only place ``asyncio.run`` appears.

    effectgate up              gateway + worker (+ fake providers for the demo) on the embedded Postgres
    effectgate serve           the gateway alone (a production process: needs DATABASE_URL or --embedded)
    effectgate worker          a worker alone (a production process: needs DATABASE_URL or --embedded)
    effectgate migrate         apply pending migrations (--status, --check, --print-sql: see migrate_cli)
    effectgate reconcile       one reconciler pass, printing what it repaired
    effectgate fake-providers  the fake payment and shipping APIs, for tests and demos
    effectgate send            sign an example event or a file as a source's provider would, and post it
    effectgate demo-delivery   post a freshly signed demo delivery to a running gateway

Exit codes: 0 success (also a clean stop on SIGTERM or SIGINT), 1 a runtime failure (database
unreachable, port in use, a child process died), 2 a usage or configuration mistake (the message names
the flag, file, key or variable; every mistake found is listed at once; also a ``--no-migrate`` process
whose ledger stayed behind its version), 5 ``migrate --check`` found migrations pending.

The ledger's URL: ``--database-url``, else ``EFFECTGATE_DATABASE_URL``, else ``DATABASE_URL``. Only ``up``
(without any of them) and an explicit ``--embedded`` ever start an embedded Postgres.

An embedded Postgres a process started or joined is released when the process exits, however it is
told to stop; the last process to release it stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from effectgate.handlers import tracing
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import clients as downstream_clients
from effectgate.handlers.maintenance import make_reconciler
from effectgate.handlers.payments import PaymentsClient
from effectgate.handlers.registry import REGISTRY
from effectgate.handlers.shipping import ShippingClient
from effectgate.handlers.worker import Worker, worker_pool_max
from effectgate.ledger import db
from effectgate.ledger.errors import LedgerError, MigrationError
from effectgate.ledger.migrate import migrate, unapplied

from . import config_cli, demo, embedded, guard, logs, migrate_cli, operator_cli, send
from .config import (
    DEFAULT_CONFIG_FILE,
    DEFAULT_MIGRATION_WAIT,
    DEFAULT_OPERATOR_HOST,
    DEFAULT_STARTUP_WAIT,
    Config,
    ConfigError,
    import_handlers,
    load,
    parse_forwarded_allow_ips,
)
from .examples import EXAMPLE_TYPES
from .operator import metrics
from .secret_sources import Role

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
# What uvicorn exits with when the server could not start (port taken, lifespan failed).
UVICORN_STARTUP_FAILURE = 3

log = logging.getLogger("effectgate.cli")


class UsageError(Exception):
    """A mistake in how the command was called."""


class StartFailure(Exception):
    """The process could not start for a reason outside the command line (a port taken)."""


def _config_path(args: argparse.Namespace) -> str:
    return str(args.config or os.environ.get("EFFECTGATE_CONFIG") or DEFAULT_CONFIG_FILE)


def _load_config(args: argparse.Namespace, *, database: bool = False, role: Role = "all") -> Config:
    """The configuration with the secrets ``role`` uses, its handler modules imported. With
    ``database``, a missing ``DATABASE_URL`` (serve and worker) is reported together with the
    configuration's own mistakes."""
    problems: list[str] = []
    config = None
    try:
        config = load(_config_path(args), role=role)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if database:
        problem = _database_problem(args)
        if problem:
            problems.append(problem)
    if problems or config is None:
        raise ConfigError(*problems)
    import_handlers(config)
    # EFFECTGATE_SCHEMA wins over [database] schema, here once, so every pool the config reaches agrees.
    return replace(config, database=replace(config.database, schema=_schema(config)))


# Where the ledger's URL comes from, first match wins: a variable of effectgate's own beats the generic one,
# which an application sharing the environment (Rails, Django, Heroku) may have set for its own database.
DATABASE_URL_VARIABLES = ("EFFECTGATE_DATABASE_URL", "DATABASE_URL")


def _chosen_url(args: argparse.Namespace) -> tuple[str, str] | None:
    """(where it came from, the URL): ``--database-url``, then ``DATABASE_URL_VARIABLES``; or None."""
    flag = getattr(args, "database_url", None)
    if flag:
        return "--database-url", str(flag)
    for name in DATABASE_URL_VARIABLES:
        url = os.environ.get(name)
        if url:
            return name, url
    return None


def _database_problem(args: argparse.Namespace) -> str | None:
    """Why the command cannot choose a database (no URL and no ``--embedded``, or both), or None."""
    chosen = _chosen_url(args)
    wants_embedded = getattr(args, "embedded", False)
    if chosen and wants_embedded:
        return (
            f"--embedded: {chosen[0]} is set too; unset it to use the embedded Postgres, or drop --embedded"
        )
    if chosen:
        try:
            db.describe(chosen[1])
        except ValueError as exc:
            return f"{chosen[0]}: {exc}"
        return None
    if wants_embedded:
        return None
    if args.command in ("serve", "worker"):
        why = "replicas with a ledger each would let duplicates through"
    else:
        why = "it would act on an empty ledger of its own, not yours"
    return (
        "DATABASE_URL is not set: set it to the ledger's Postgres (postgresql://USER:PASSWORD@HOST:5432/DBNAME), "
        "or EFFECTGATE_DATABASE_URL (which wins over DATABASE_URL), or pass --database-url URL; "
        f"or pass --embedded for a single-machine trial on an embedded Postgres in {embedded.home_dir()}. "
        f"({args.command} never starts a private database on its own: {why}.)"
    )


def _startup_wait(args: argparse.Namespace, config: Config | None = None) -> float:
    """Seconds to keep retrying an unreachable database at start: --startup-wait, then
    EFFECTGATE_STARTUP_WAIT, then [database] startup_wait."""
    if getattr(args, "startup_wait", None) is not None:
        return float(args.startup_wait)
    text = os.environ.get("EFFECTGATE_STARTUP_WAIT")
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise UsageError(f"EFFECTGATE_STARTUP_WAIT: expected a number of seconds >= 0, got {text!r}")
        return value
    return config.database.startup_wait if config is not None else DEFAULT_STARTUP_WAIT


@contextlib.contextmanager
def _database(args: argparse.Namespace, *, embedded_by_default: bool = False) -> Iterator[str]:
    """The ledger's URL while the block runs (``_chosen_url``), or the embedded Postgres when the command
    was given ``--embedded`` (or is ``up``: ``embedded_by_default``), held for the block and released after
    it, however the block ends. Any other command without a URL is refused, naming every way to give one."""
    if not embedded_by_default:
        problem = _database_problem(args)
        if problem:
            raise UsageError(problem)
    chosen = _chosen_url(args)
    if chosen:
        yield chosen[1]
        return
    data_dir = embedded.home_dir() / "pgdata"
    held = embedded.acquire(data_dir)
    log.info("embedded.started", extra={"data_dir": str(data_dir)})
    try:
        yield held.url
    finally:
        # A second SIGTERM or Ctrl-C must not cut the stop short and leave the server running.
        with _signals_ignored():
            held.release()


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminate(signum: int, _frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C does, through every finally (the embedded Postgres is released),
    # rather than killing the process where it stands. uvicorn re-raises the signal it handled once it
    # has shut down, which lands here too.
    raise SystemExit(EXIT_OK)


# This process's parsed command line, for run_on_ledger: the ledger and jobs commands hand it only the
# coroutine to run, and where the ledger is (--database-url, --embedded) was said on the command line.
_command_line = argparse.Namespace(command="ledger", database_url=None, embedded=False)


def _schema(config: Config | None = None) -> str:
    """effectgate's Postgres schema: ``EFFECTGATE_SCHEMA``, then ``[database] schema``, then the default.
    Commands that read no configuration file (``migrate``, ``ledger``, ``jobs``) see only the variable."""
    text = os.environ.get("EFFECTGATE_SCHEMA")
    if text:
        try:
            return db.check_schema_name(text)
        except ValueError as exc:
            raise UsageError(f"EFFECTGATE_SCHEMA: {exc}") from None
    return config.database.schema if config is not None else db.DEFAULT_SCHEMA


def run_on_ledger(command: Callable[[db.Conn], Awaitable[None]]) -> None:
    """Run ``command`` with one connection to the ledger (``_database``) in a new event loop."""
    schema = _schema()

    async def main(url: str) -> None:
        conn = await db.connect(url, schema=schema)
        async with conn:
            await command(conn)

    with _database(_command_line) as url:
        asyncio.run(main(url))


async def _migrate(url: str, startup_wait: float = 0.0, schema: str = db.DEFAULT_SCHEMA) -> list[str]:
    await db.wait_until_reachable(url, startup_wait)
    conn = await db.connect(url, schema=schema)
    async with conn:
        return await migrate(conn, schema=schema)


def _migration_wait(args: argparse.Namespace, config: Config) -> float:
    """Seconds a ``--no-migrate`` process waits for its schema: --migration-wait, then
    EFFECTGATE_MIGRATION_WAIT, then [database] migration_wait."""
    if args.migration_wait is not None:
        return float(args.migration_wait)
    text = os.environ.get("EFFECTGATE_MIGRATION_WAIT")
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise UsageError(f"EFFECTGATE_MIGRATION_WAIT: expected a number of seconds >= 0, got {text!r}")
        return value
    return config.database.migration_wait


def _prepare_schema(args: argparse.Namespace, config: Config, url: str, startup_wait: float) -> None:
    """Apply pending migrations, or under ``--no-migrate`` wait (bounded) for someone else to."""
    if not args.no_migrate:
        asyncio.run(_migrate(url, startup_wait, _schema(config)))
        return
    try:
        asyncio.run(
            migrate_cli.wait_for_schema(url, startup_wait, _migration_wait(args, config), _schema(config))
        )
    except migrate_cli.SchemaBehind as exc:
        raise UsageError(str(exc)) from exc


def _check_port_free(flag: str, host: str, port: int) -> None:
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


# -- serve ----------------------------------------------------------------------------------------


def serve_app() -> Any:
    """The gateway app built from the environment: the factory each ``serve --workers N`` process calls.

    ``cmd_serve`` puts the configuration path, the database URL and the dashboard's session key in the
    environment before uvicorn starts its processes, so every process builds the same app, imports the
    same handler modules and accepts the same sessions.
    """
    from . import serving
    from .app import create_app

    serving.die_with_parent()
    logs.configure(os.environ.get("EFFECTGATE_LOG_LEVEL", "INFO"))
    config = load(os.environ["EFFECTGATE_CONFIG"], role="gateway")
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
    guard.configure(config.gateway.limits, app.state.penalty_box, config.gateway.client_slots())
    return app


# The dashboard's signing key when no secret is configured: made by the supervisor, shared by its children.
_SESSION_KEY_ENV = "EFFECTGATE_SESSION_KEY"
# The supervisor's choices its children cannot read from the configuration file: the operator plane's
# bound port (which may have been 0) and the trusted proxies (which --forwarded-allow-ips may override).
_OPERATOR_PORT_ENV = "EFFECTGATE_OPERATOR_PORT"
_TRUSTED_ENV = "EFFECTGATE_FORWARDED_ALLOW_IPS"
_APP_FACTORY = "effectgate.gateway.cli:serve_app"
# Set by `effectgate up` for its children: the supervisor passes every stop signal on as SIGTERM.
_SUPERVISED_ENV = "EFFECTGATE_SUPERVISED"


def event_loop() -> str:
    """uvloop where it is installed (the production default), else asyncio's own loop.

    uvloop has no wheel for Windows or PyPy; there the gateway still runs, slower, rather than failing.
    (The HTTP parser is always httptools, under the guarded protocol in ``guard.py``.)
    """
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load_config(args, database=True, role="gateway")
    wait = _startup_wait(args, config)
    host = args.host or config.gateway.host
    port = config.gateway.port if args.port is None else args.port
    _check_port_free("--port" if args.port is not None else "gateway.port", host, port)
    operator = _operator_listen(args, config, port)
    if operator is not None:
        flag = "--operator-port" if args.operator_port is not None else "operator.listen"
        _check_port_free(flag, *operator)
    with _database(args) as url:
        _prepare_schema(args, config, url, wait)
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

    from . import serving
    from .app import create_app

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
        serving.run(
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
    protocol = guard.configure(config.gateway.limits, app.state.penalty_box, config.gateway.client_slots())
    # Server.run, not asyncio.run(server.serve()): only the former installs the uvloop event loop the
    # options ask for; the latter would silently run on the stdlib loop.
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, **options))
    server.run(sockets)
    if not server.started:
        sys.exit(UVICORN_STARTUP_FAILURE)


# -- worker ---------------------------------------------------------------------------------------


def _listen_metrics(host: str, port: int) -> socket.socket:
    # Bound before the database is touched, so a port taken is a message and exit 1 (as for the gateway's
    # port: the machine's state, not a mistake in the command), not a worker that starts, leases jobs and
    # then dies.
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        # create_server rewrites strerror to name the address again; the plain reason reads better here.
        what = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EADDRINUSE:
            what += " (another process listens there: stop it, or choose another port)"
        raise StartFailure(f"--metrics-port: cannot listen on {host}:{port}: {what}") from exc


@contextlib.asynccontextmanager
async def _serving_metrics(
    pool: db.Pool,
    sock: socket.socket | None,
    token_sha256: bytes | None = None,
    limits: guard.Limits | None = None,
    health: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
) -> AsyncIterator[None]:
    """``GET /metrics`` (and ``GET /healthz`` from ``health``: the worker loop's state, no database) on
    ``sock`` in this event loop while the block runs; nothing when ``sock`` is None.

    The listener has the gateway's connection guard (``[gateway]`` header and body timeouts, head size):
    it shares the worker's event loop, so a client dripping a header into it would otherwise hold a
    parser and its buffer for ever and slow every job the worker runs.
    """
    if sock is None:
        yield
        return
    import uvicorn

    class Server(uvicorn.Server):
        # Signals belong to the worker, which drains on SIGTERM; this server stops after it has.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = Server(
        uvicorn.Config(
            metrics.app(pool, token_sha256=token_sha256, health=health),
            lifespan="off",
            log_config=None,
            access_log=False,
            http=guard.configure(limits if limits is not None else guard.Limits()),
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield
    finally:
        server.should_exit = True
        await serving


async def _run_worker(
    config: Config, url: str, concurrency: int | None, metrics_socket: socket.socket | None = None
) -> None:
    worker_config = config.worker
    if concurrency is not None:
        worker_config = replace(worker_config, concurrency=concurrency)
    tracing.configure(config.tracing, role="worker")
    pool = db.make_pool(
        url,
        max_size=worker_pool_max(worker_config.concurrency),
        name="effectgate-worker",
        schema=_schema(config),
    )
    await pool.open(wait=False)
    counted = metrics.downstream_call
    async with httpx.AsyncClient() as http:
        services = Services(
            http=http,
            payments=PaymentsClient(http, config.payments, on_call=counted) if config.payments else None,
            shipping=ShippingClient(http, config.shipping, on_call=counted) if config.shipping else None,
            downstreams=downstream_clients(http, config.downstreams.items(), on_call=counted),
        )
        worker = Worker(
            pool, REGISTRY, url=url, config=worker_config, services=services, observer=metrics.WORKER_OBSERVER
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        if os.environ.get(_SUPERVISED_ENV):
            # Under `effectgate up` a terminal's Ctrl-C reaches the whole process group, and the supervisor
            # passes each one on as SIGTERM: heeding both would make the first Ctrl-C a second stop.
            loop.add_signal_handler(signal.SIGINT, lambda: None)
        else:
            loop.add_signal_handler(signal.SIGINT, worker.stop)
        try:
            async with _serving_metrics(
                pool, metrics_socket, config.metrics_token_sha256, config.gateway.limits, worker.health
            ):
                await worker.run()
        finally:
            await pool.close()
            if tracing.enabled():
                await asyncio.to_thread(tracing.flush)


def cmd_worker(args: argparse.Namespace) -> int:
    config = _load_config(args, database=True, role="worker")
    if not REGISTRY.kinds():
        raise ConfigError(f"{config.path}: handlers.modules: no effect handlers registered; nothing to run")
    wait = _startup_wait(args, config)
    sock = None if args.metrics_port is None else _listen_metrics(args.metrics_host, args.metrics_port)
    with _database(args) as url:
        _prepare_schema(args, config, url, wait)
        asyncio.run(_run_worker(config, url, args.concurrency, sock))
    return EXIT_OK


# -- migrate, reconcile ---------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    wait = _startup_wait(args)
    action = (
        "status" if args.status else "check" if args.check else "print-sql" if args.print_sql else "apply"
    )
    if args.format != "table" and action != "status":
        raise UsageError("--format: only with --status")
    with _database(args) as url:
        return asyncio.run(migrate_cli.run(url, wait, action, args.format, _schema()))


def cmd_reconcile(args: argparse.Namespace) -> int:
    config = _load_config(args)
    wait = _startup_wait(args, config)

    async def once(url: str) -> Any:
        await db.wait_until_reachable(url, wait)
        conn = await db.connect(url, schema=_schema(config))
        async with conn:
            async with db.translate_errors():
                pending = await unapplied(conn)
            if pending:
                # Otherwise the pass dies on a missing table, as a driver traceback.
                raise MigrationError(
                    f"the ledger lacks migrations {', '.join(pending)}: run effectgate migrate"
                )
            return await make_reconciler(REGISTRY, config.worker.reconciler).run_once(conn)

    with _database(args) as url:
        result = asyncio.run(once(url))
    if not result.owned:
        print("another process owns this reconciler pass; nothing done")
        return EXIT_OK
    print(
        json.dumps(
            {
                "redriven": result.redriven,
                "parked": result.parked,
                "cancelled": result.cancelled,
                "woken": result.woken,
                "sweeps": result.sweep_acted,
                "sweep_errors": result.sweep_errors,
                "partitions_created": result.partitions.created,
                "partitions_dropped": result.partitions.dropped,
                "purged": {what: n for what, n in result.retention.purged.items() if n},
                "skipped": result.skipped,
                "service_errors": result.service_errors,
            }
        )
    )
    return EXIT_OK


# -- fake providers, demo delivery ----------------------------------------------------------------


def cmd_fake_providers(args: argparse.Namespace) -> int:
    from .testing.fake_providers import serve

    serve(args.host, args.port)
    return EXIT_OK


def cmd_demo_delivery(args: argparse.Namespace) -> int:
    # Stripe's order for a manual capture: amount_capturable_updated (capture), then succeeded (ship).
    code = EXIT_OK
    for body, headers in demo.example_deliveries(args.url, args.order):
        try:
            response = httpx.post(
                f"{args.url.rstrip('/')}/webhooks/stripe", content=body, headers=headers, timeout=10
            )
        except httpx.HTTPError as exc:
            print(f"effectgate: cannot reach {args.url}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"{response.status_code} {response.text}")
        if response.status_code >= 300:
            code = EXIT_FAILURE
    return code


def _send_config(args: argparse.Namespace) -> Config:
    # Only the configuration is needed, not the handler modules: sending runs no user code. Where
    # `up` would run its demo (no configuration anywhere), send to the demo it wrote, with its secrets.
    if (
        args.config is None
        and "EFFECTGATE_CONFIG" not in os.environ
        and not Path(DEFAULT_CONFIG_FILE).exists()
    ):
        demo_config = embedded.home_dir() / "demo.toml"
        if demo_config.exists():
            print(
                f"effectgate: using the demo configuration of `effectgate up`: {demo_config}", file=sys.stderr
            )
            return load(demo_config, env={**demo.DEMO_ENV, **os.environ})
    return load(_config_path(args))


def cmd_send(args: argparse.Namespace) -> int:
    config = _send_config(args)
    source = send.find_source(config, args.source)
    url = send.check_url(args.url) if args.url is not None else send.default_url(config.gateway)
    signing_key = send.signing_key_from(args.signing_key_env)
    event_id = send.check_token("--event-id", args.event_id)
    event_type = send.check_token("--event-type", args.event_type)
    if args.example:
        send.check_token("--example", args.example)
    if args.event_file is not None:
        delivery = send.file_delivery(source, args.event_file, event_type=event_type, event_id=event_id)
        where = f"--event-file {args.event_file}"
    else:
        if event_type is not None:
            raise UsageError("--event-type: with --example the type is its argument (--example TYPE)")
        delivery = send.example_delivery(source, args.example or None, event_id)
        where = f"--example {delivery.event_type}"
    outgoing = send.sign(source, delivery, url=url, signing_key=signing_key, where=where)
    print(
        f"effectgate: POST {outgoing.url}  source {source.name} ({source.scheme_name}), "
        f"type {outgoing.event_type or '-'}, event id {outgoing.event_id or 'in the body'}",
        file=sys.stderr,
    )
    try:
        response = send.post(outgoing)
    except httpx.InvalidURL as exc:
        raise UsageError(f"--url: {exc}") from exc
    except httpx.HTTPError as exc:
        print(f"effectgate: cannot reach {outgoing.url}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{response.status_code} {response.text}")
    return EXIT_OK if 200 <= response.status_code < 300 else EXIT_FAILURE


# -- up -------------------------------------------------------------------------------------------


def _wait_ready(url: str, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def cmd_up(args: argparse.Namespace) -> int:
    home = embedded.home_dir()
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    config_path = args.config or os.environ.get("EFFECTGATE_CONFIG")
    use_demo = config_path is None and not Path(DEFAULT_CONFIG_FILE).exists()
    host = args.host or "127.0.0.1"
    fake_port = 0
    if use_demo:
        port = args.port or 8000
        fake_port = args.fake_port or port + 1
        config_path = str(home / "demo.toml")
        Path(config_path).write_text(demo.demo_config(host=host, port=port, fake_port=fake_port))
        for key, value in demo.DEMO_ENV.items():
            env.setdefault(key, value)
    else:
        config_path = config_path or DEFAULT_CONFIG_FILE
    config = load(config_path, env=env)  # fail here, once, rather than in each child
    import_handlers(config)
    port = config.gateway.port if args.port is None else args.port
    if not use_demo:
        host = args.host or config.gateway.host
    _check_port_free("--port" if args.port is not None else "gateway.port", host, port)
    wait = _startup_wait(args, config)

    with _database(args, embedded_by_default=True) as url:
        # Both names: a child must not prefer an EFFECTGATE_DATABASE_URL of the environment to this choice.
        env["DATABASE_URL"] = env["EFFECTGATE_DATABASE_URL"] = url
        applied = asyncio.run(_migrate(url, wait))
        if applied:
            print(f"effectgate: applied migrations {', '.join(applied)}", flush=True)
        return _run_up(env, config, config_path, use_demo, host, port, fake_port, home)


def _operator_base(config: Config, base: str) -> str:
    """The URL of the dashboard and API: the operator listener's when it is apart, else ``base``."""
    if not config.operator.apart:
        return base
    host = config.operator.listen_host or DEFAULT_OPERATOR_HOST
    return f"http://{f'[{host}]' if ':' in host else host}:{config.operator.listen_port}"


def _run_up(
    env: dict[str, str],
    config: Config,
    config_path: str,
    use_demo: bool,
    host: str,
    port: int,
    fake_port: int,
    home: Path,
) -> int:
    stopping = False
    procs: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if stopping:
            # A second Ctrl-C or SIGTERM: passed on, so the worker hands its running jobs back now.
            print(
                "effectgate: stopping now: the worker hands its running jobs back",
                file=sys.stderr,
                flush=True,
            )
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        stopping = True

    # Before the children start: a SIGTERM from here on stops them too, rather than leaving them behind.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    me = [sys.executable, "-m", "effectgate.gateway.cli"]
    commands = []
    if use_demo:
        commands.append([*me, "fake-providers", "--host", "127.0.0.1", "--port", str(fake_port)])
    commands.append(
        [*me, "serve", "--config", config_path, "--no-migrate", "--host", host, "--port", str(port)]
    )
    commands.append([*me, "worker", "--config", config_path, "--no-migrate"])
    procs.extend(subprocess.Popen(c, env={**env, _SUPERVISED_ENV: "1"}) for c in commands)
    names = {id(p): c[3] for p, c in zip(procs, commands, strict=True)}

    base = f"http://{host}:{port}"
    chosen = _chosen_url(_command_line)
    database = chosen[0] if chosen else f"embedded in {home}"
    if _wait_ready(f"{base}/healthz", procs):
        print(
            f"\neffectgate is up: {base}  (gateway, worker{', fake providers' if use_demo else ''})",
            flush=True,
        )
        print(f"configuration: {config_path}; database: {database}")
        if use_demo:
            print("\nTry a signed Stripe delivery (the signature is valid for five minutes):\n")
            print("  " + demo.curl_command(base) + "\n")
            print(f"or, at any time:  effectgate demo-delivery --url {base} --order 1234")
            print("or any example:   effectgate send --source stripe --example payment_intent.succeeded\n")
            token = env["EFFECTGATE_DEMO_OPERATOR_TOKEN"]
            print(f"Dashboard: {_operator_base(config, base)}/ui/  (operator token: {token})", flush=True)
        elif config.operator.apart:
            print(f"operator plane (/ui, /api, /metrics): {_operator_base(config, base)}", flush=True)
    exit_code = EXIT_OK
    while not stopping:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            print(
                f"effectgate: a process exited ({names[id(dead[0])]}, code {dead[0].returncode}); stopping",
                file=sys.stderr,
            )
            exit_code = EXIT_FAILURE
            break
        time.sleep(0.2)
    if stopping:
        print(
            f"effectgate: stopping: the worker drains for up to {config.worker.drain_timeout:g} s "
            "(its log says what); Ctrl-C again to stop now",
            file=sys.stderr,
            flush=True,
        )
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + config.worker.drain_timeout + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return exit_code


# -- parser ---------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {value}")
    return value


def _trusted_proxies(text: str) -> tuple[str, ...]:
    try:
        return parse_forwarded_allow_ips([p for p in text.split(",") if p.strip()])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--config", help=f"configuration file (default: $EFFECTGATE_CONFIG or ./{DEFAULT_CONFIG_FILE})"
        )
        return p

    def with_startup_wait(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--startup-wait",
            type=_seconds,
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
            type=_seconds,
            metavar="SECONDS",
            help="with --no-migrate: wait this long for the ledger's schema to reach this version, then "
            "refuse to start (exit 2) (default: $EFFECTGATE_MIGRATION_WAIT, [database] migration_wait, "
            f"or {DEFAULT_MIGRATION_WAIT:g})",
        )
        return p

    up = with_startup_wait(
        with_config(
            sub.add_parser("up", help="gateway + worker on the embedded Postgres (demo config if none)")
        )
    )
    up.add_argument("--host")
    up.add_argument("--port", type=_port)
    up.add_argument("--fake-port", type=_port, help="port of the demo's fake providers (default: port + 1)")
    up.set_defaults(func=cmd_up)

    serve = with_migration_wait(
        with_database(with_startup_wait(with_config(sub.add_parser("serve", help="run the gateway"))))
    )
    serve.add_argument("--host")
    serve.add_argument("--port", type=_port)
    serve.add_argument("--no-migrate", action="store_true", help="do not apply pending migrations first")
    serve.add_argument(
        "--workers", type=_positive_int, default=1, help="gateway processes sharing the port (default: 1)"
    )
    serve.add_argument(
        "--operator-port",
        type=_port,
        help="serve /ui, /api and /metrics on this port only; the gateway's port then serves /webhooks/*, "
        "/healthz and /readyz alone (default: [operator] listen, else both on the gateway's port)",
    )
    serve.add_argument(
        "--operator-host",
        help=f"address for --operator-port (default: [operator] listen's, else {DEFAULT_OPERATOR_HOST})",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        type=_trusted_proxies,
        metavar="IPS",
        help="comma-separated proxy addresses/networks whose X-Forwarded-Proto/-For are trusted, '*' for "
        "any, '' for none (default: [gateway] forwarded_allow_ips, else none)",
    )
    serve.set_defaults(func=cmd_serve)

    worker = with_migration_wait(
        with_database(with_startup_wait(with_config(sub.add_parser("worker", help="run a worker"))))
    )
    worker.add_argument("--concurrency", type=_positive_int)
    worker.add_argument("--no-migrate", action="store_true", help="do not apply pending migrations first")
    worker.add_argument("--metrics-port", type=_port, help="serve GET /metrics on this port (default: none)")
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    worker.set_defaults(func=cmd_worker)

    mig = with_database(
        with_startup_wait(
            sub.add_parser(
                "migrate",
                help="apply pending migrations, or show, check or print them",
                description="Apply pending migrations (under an advisory lock), or, without changing "
                "anything: list them (--status), exit 5 while any is pending (--check), or print them as "
                "one SQL script that records itself, for your own migration tool (--print-sql).",
            )
        )
    )
    what = mig.add_mutually_exclusive_group()
    what.add_argument("--status", action="store_true", help="list applied and pending migrations")
    what.add_argument(
        "--check", action="store_true", help=f"exit {migrate_cli.EXIT_PENDING} while any is pending, else 0"
    )
    what.add_argument(
        "--print-sql", action="store_true", help="write the pending migrations to stdout as one SQL script"
    )
    mig.add_argument("--format", choices=["table", "json"], default="table", help="with --status")
    mig.set_defaults(func=cmd_migrate)
    with_database(
        with_startup_wait(with_config(sub.add_parser("reconcile", help="run one reconciler pass")))
    ).set_defaults(func=cmd_reconcile)

    fake = sub.add_parser("fake-providers", help="fake payment and shipping APIs for tests and demos")
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=_port, required=True)
    fake.set_defaults(func=cmd_fake_providers)

    sd = with_config(
        sub.add_parser(
            "send",
            help="sign an example event or a file as a source's provider would, and post it to the gateway",
            description=(
                "Sign a delivery with the source's scheme and first secret, post it to "
                "URL/webhooks/SOURCE and print the answer (exit 0 on 2xx, 1 otherwise). "
                "Examples (any other TYPE gets a generic body): "
                + "; ".join(f"{scheme}: {', '.join(types)}" for scheme, types in EXAMPLE_TYPES.items())
                + ". PayPal cannot be signed locally."
            ),
        )
    )
    sd.add_argument("--source", required=True, help="the configured source to send to ([sources.NAME])")
    body = sd.add_mutually_exclusive_group(required=True)
    body.add_argument(
        "--example",
        nargs="?",
        const="",
        metavar="TYPE",
        help="send an example event of TYPE (default: the scheme's first example type)",
    )
    body.add_argument(
        "--event-file", metavar="FILE", help="send this file's body (JSON; for Twilio JSON or a form)"
    )
    sd.add_argument(
        "--event-id",
        help="the event id (default: a fresh one each run); send the same id again to see a duplicate",
    )
    sd.add_argument(
        "--event-type",
        help="with --event-file: the type for schemes that send it in a header (GitHub, Shopify)",
    )
    sd.add_argument("--url", help="the gateway's base URL (default: from [gateway] host and port)")
    sd.add_argument(
        "--signing-key-env",
        metavar="VAR",
        help="environment variable holding the whsk_ private key, for a standard-webhooks source "
        "configured with a whpk_ public key (Ed25519)",
    )
    sd.set_defaults(func=cmd_send)

    dd = sub.add_parser(
        "demo-delivery",
        help="post a manual-capture payment's two signed Stripe deliveries to a running gateway, in Stripe's order",
    )
    dd.add_argument("--url", default="http://127.0.0.1:8000")
    dd.add_argument("--order", default="1234")
    dd.set_defaults(func=cmd_demo_delivery)
    config_cli.register(sub)
    before = set(sub.choices)
    operator_cli.register(sub, run_on_ledger)
    for name in sorted(set(sub.choices) - before):
        for leaf in _leaf_parsers(sub.choices[name]):
            with_database(leaf)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``effectgate`` console script."""
    global _command_line
    args = build_parser().parse_args(argv)
    _command_line = args
    logs.configure(args.log_level)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args)
        return code
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"effectgate: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, send.SendError) as exc:
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


if __name__ == "__main__":
    sys.exit(main())
