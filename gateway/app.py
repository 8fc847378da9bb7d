"""The Starlette application: ingress, health and readiness. Resources come from the lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from effectgate.handlers.registry import Registry
from effectgate.handlers.worker import reconcile_forever
from effectgate.ledger import claims, db
from effectgate.ledger.migrate import unapplied

from .config import Config
from .ingress import error, receive
from .operator import metrics
from .operator.routes import operator_routes

log = logging.getLogger("effectgate.gateway")


async def healthz(request: Request) -> Response:
    """The process is alive."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """The ledger database answers and every migration is applied."""
    try:
        async with db.connection(request.app.state.pool) as conn:
            todo = await unapplied(conn)
    except Exception as exc:
        # The exception's text can name the database host and user: the log gets it, the answer not.
        log.warning("readyz.ledger_unavailable", extra={"error": f"{type(exc).__name__}: {exc}"})
        return error(
            503, "ledger_unavailable", f"the ledger database cannot be reached ({type(exc).__name__})"
        )
    if todo:
        return error(503, "migrations_pending", "pending migrations: " + ", ".join(todo))
    return JSONResponse({"status": "ready"})


def create_app(
    config: Config, registry: Registry, database_url: str, *, pool_timeout: float = db.DEFAULT_POOL_TIMEOUT
) -> Starlette:
    """The gateway app for ``config``; the pool opens with the lifespan and closes with it.

    ``pool_timeout`` bounds how long a request waits for a database connection before it is
    answered 503 ``ledger_unavailable``.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = db.make_pool(database_url, max_size=config.gateway.pool_max, timeout=pool_timeout)
        # Open without waiting for a connection: a gateway whose database is down still starts and
        # answers 503, rather than crash-looping behind its load balancer.
        await pool.open(wait=False)
        app.state.pool = pool
        # Group commit: the claims of concurrent deliveries in this process share a statement and a commit.
        batcher = claims.ClaimBatcher(pool)
        app.state.batcher = batcher
        # Gateways tick the reconciler too, so jobs are repaired even while no worker runs.
        stopping = asyncio.Event()
        reconciler = (
            asyncio.create_task(
                reconcile_forever(
                    pool, registry, config.worker.reconciler, stopping, observer=metrics.WORKER_OBSERVER
                )
            )
            if config.gateway.run_reconciler
            else None
        )
        try:
            yield
        finally:
            stopping.set()
            if reconciler is not None:
                await reconciler
            await batcher.close()
            await pool.close()

    app = Starlette(
        routes=[
            Route("/webhooks/{source}", receive, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            *operator_routes(),
        ],
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.registry = registry
    return app
