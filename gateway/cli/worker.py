"""``effectgate worker``: a worker alone, with ``GET /metrics`` and ``GET /healthz`` on ``--metrics-port``.

SIGTERM (and SIGINT, unless ``up`` supervises the process) makes the worker drain: it stops leasing, lets
its running jobs finish for ``[worker] drain_timeout`` and hands the rest back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx

from effectgate.handlers import providers, tracing
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import clients as downstream_clients
from effectgate.handlers.downstream import paces as downstream_paces
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.registry import REGISTRY
from effectgate.handlers.worker.config import worker_connections
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db, timeline
from effectgate.ledger.cluster import shards
from effectgate.ledger.handle import Ledger
from effectgate.ledger.paces import LedgerTurns

from .. import metrics
from ..config import Config, ConfigError
from ..config.gateway import Limits
from ..edge import guard
from ..exit_codes import EXIT_OK
from ..operator import metrics as metrics_endpoint
from . import database, flags, migrate
from .common import SUPERVISED_ENV, StartFailure
from .loop import run as run_on_loop


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
    limits: Limits | None = None,
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
            metrics_endpoint.app(pool, token_sha256=token_sha256, health=health),
            lifespan="off",
            log_config=None,
            access_log=False,
            http=guard.configure(limits if limits is not None else Limits()),
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

    def pool_of(size: int, name: str) -> db.Pool:
        return db.make_pool(
            url,
            max_size=size,
            name=name,
            schema=database.schema(config),
            idle_in_transaction_timeout=config.database.idle_bound,
        )

    own, handlers = worker_connections(worker_config)
    pool, handler_pool = pool_of(own, "effectgate-worker"), pool_of(handlers, "effectgate-worker-handlers")
    await pool.open(wait=False)
    await handler_pool.open(wait=False)
    # A failover this worker lives through is counted (and logged by the watch itself), and a Citus worker node
    # its fetch or reconciler could not read.
    unwatch = [
        timeline.WATCH.listen(metrics.timeline_changed),
        shards.SKIPS.listen(metrics.shard_reads_skipped),
    ]
    counted = metrics.downstream_call
    # One pace per [downstream.NAME] in this process, shared by every client of that name; its max_per_second
    # reserved from the ledger's schedule, every worker's together (pace_scope = "ledger"). A reservation is the
    # job's own statement: on the running jobs' pool, never crowding the fetch and the heartbeat.
    turns = downstream_paces(config.downstreams.items(), LedgerTurns(handler_pool))
    async with httpx.AsyncClient() as http:
        services = Services(
            http=http,
            payments=(
                PaymentsClient(http, config.payments, on_call=counted, pace=turns.get("payments"))
                if config.payments
                else None
            ),
            shipping=(
                ShippingClient(http, config.shipping, on_call=counted, pace=turns.get("shipping"))
                if config.shipping
                else None
            ),
            downstreams=downstream_clients(http, config.downstreams.items(), on_call=counted, paces=turns),
        )
        worker = Worker(
            Ledger(pool, handler_pool=handler_pool),
            REGISTRY,
            url=url,
            config=worker_config,
            services=services,
            observer=metrics.WORKER_OBSERVER,
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        if os.environ.get(SUPERVISED_ENV):
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
            # After the drain: a handler still running could be using one. Before the loop ends, whose
            # transports the SDK clients' pooled connections hold.
            await providers.close_clients()
            for pace in turns.values():
                await pace.settled()  # a 429's hold on its way to the ledger, before its pool closes
            await handler_pool.close()
            await pool.close()
            for stop_watching in unwatch:
                stop_watching()
            if tracing.enabled():
                await asyncio.to_thread(tracing.flush)


def cmd_worker(args: argparse.Namespace) -> int:
    config = database.load_config(args, database=True, role="worker")
    if not REGISTRY.kinds():
        raise ConfigError(f"{config.path}: handlers.modules: no effect handlers registered; nothing to run")
    wait = flags.database_wait(args, "startup_wait", config)
    sock = None if args.metrics_port is None else _listen_metrics(args.metrics_host, args.metrics_port)
    with database.ledger_url(args) as url:
        migrate.prepare_schema(args, config, url, wait)
        run_on_loop(_run_worker(config, url, args.concurrency, sock))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``worker`` to the command line."""
    worker = flags.with_migration_wait(
        flags.with_database(
            flags.with_startup_wait(flags.with_config(sub.add_parser("worker", help="run a worker")))
        )
    )
    worker.add_argument("--concurrency", type=flags.positive_int)
    worker.add_argument("--no-migrate", action="store_true", help="do not apply pending migrations first")
    worker.add_argument(
        "--metrics-port", type=flags.port, help="serve GET /metrics on this port (default: none)"
    )
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    worker.set_defaults(func=cmd_worker)
