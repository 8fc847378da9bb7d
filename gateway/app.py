"""The Starlette application: ingress, health and readiness. Resources come from the lifespan."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from effectgate.handlers import tracing
from effectgate.handlers.registry import Registry
from effectgate.handlers.worker.maintenance import reconcile_forever
from effectgate.ledger import claim_batcher, db, timeline
from effectgate.ledger.cluster import shards
from effectgate.ledger.handle import Ledger
from effectgate.ledger.readiness import ReadinessProbe
from effectgate.ledger.signature_failures import DEFAULT_INTERVAL as DEFAULT_FLUSH_INTERVAL
from effectgate.ledger.signature_failures import FailureCounter, FailureFlusher

from . import metrics
from .bodies import BodyTooLarge
from .config import Config, ConfigError
from .config.handler_imports import identity_problems
from .edge.penalty_box import PenaltyBox
from .ingress import deliver, error
from .ingress.acknowledged import Acknowledged, GapCheck
from .ingress.inbound import webhook_source
from .ingress.signature_failures import SignatureFailures
from .operator import metrics as metrics_endpoint
from .operator.api import ApiHeaders
from .operator.dashboard.signin import form_too_large
from .operator.routes import operator_routes
from .operator.throttle import FailureThrottle
from .planes import PlaneGate

log = logging.getLogger("effectgate.gateway")


# Seconds /readyz waits for its connection and its statement (kubelet's probe timeout is 3 s).
READYZ_TIMEOUT = 2.0


async def healthz(request: Request) -> Response:
    """The process is alive."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """The ledger database answers and every migration is applied, asked on the probe's own connection:
    a burst that takes every connection of the claim or operator pool leaves the gateway in rotation."""
    try:
        todo = await request.app.state.readiness.check()
    except Exception as exc:
        # The exception's text can name the database host and user: the log gets it, the answer not.
        log.warning("readyz.ledger_unavailable", extra={"error": f"{type(exc).__name__}: {exc}"})
        return error(
            503, "ledger_unavailable", f"the ledger database cannot be reached ({type(exc).__name__})"
        )
    if todo:
        return error(503, "migrations_pending", "pending migrations: " + ", ".join(todo))
    return JSONResponse({"status": "ready"})


async def client_disconnected(request: Request, exc: Exception) -> Response:
    """A client that went away mid-body (or was cut off by the body timeout) is not the gateway's error:
    one line at info, no traceback. Nothing was claimed, and the answer reaches no one."""
    log.info(
        "request.client_disconnected",
        extra={"path": request.url.path, "request_id": request.headers.get("x-request-id")},
    )
    return error(400, "client_disconnected", "the client closed the connection before the body was read")


async def body_too_large(request: Request, exc: Exception) -> Response:
    """A body over its limit, refused before it was buffered: the dashboard's 413 page, or the JSON error."""
    assert isinstance(exc, BodyTooLarge)
    if request.url.path.startswith("/ui/"):
        return form_too_large(exc)
    return error(413, "payload_too_large", str(exc))


class Gateway(Starlette):
    """The gateway's app. A delivery (``POST /webhooks/{source}`` on the public listener) goes straight to
    ``ingress.deliver``, past Starlette's middleware and routing: on a 2-core machine they were a fifth of
    a delivery's CPU, and none of them does anything for it (the plane gate lets it through, the API headers
    are for ``/api``, the exception handlers' cases are answered in ingress). Everything else, including a
    webhook sent to the operator listener, takes the Starlette path."""

    def __init__(self, *, operator_port: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.operator_port = operator_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = webhook_source(scope)
            if name is not None and not self._on_operator_listener(scope):
                scope["app"] = self
                await deliver(self, name, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _on_operator_listener(self, scope: Scope) -> bool:
        # As the plane gate decides it: by the socket's own local port, which no client header can change.
        server = scope.get("server")
        return self.operator_port is not None and server is not None and server[1] == self.operator_port


class _Webhooks:
    # The Starlette route's endpoint (an ASGI app: a class, so Starlette does not wrap it as a request
    # handler), reached only where Gateway.__call__ did not take the request itself (a root_path): the same
    # raw ASGI ingress. The route also gives other methods their 405.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await deliver(scope["app"], scope["path_params"]["source"], scope, receive, send)


def create_app(
    config: Config,
    registry: Registry,
    database_url: str,
    *,
    pool_timeout: float = db.DEFAULT_POOL_TIMEOUT,
    session_key: bytes | None = None,
    operator_port: int | None = None,
    failure_flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    penalty_box: PenaltyBox | None = None,
) -> Starlette:
    """The gateway app for ``config``; the pool opens with the lifespan and closes with it.

    ``pool_timeout`` bounds how long a request waits for a database connection before it is
    answered 503 ``ledger_unavailable``. ``session_key`` signs the dashboard's session cookies when
    the configuration names no secret (a random one otherwise: sessions then last as long as the app).
    ``operator_port`` is the local port of the operator plane's own listener (``gateway.planes``; by
    default ``[operator] listen``'s), or None when both planes share one listener.
    ``failure_flush_interval`` is how often the failed-verification counts are written to the ledger
    (and once more at shutdown).
    Raises ``ConfigError`` when an effect's key, lock-key or require function reads a field its
    source does not sign (``handler_imports.identity_problems``).
    """
    problems = identity_problems(config, registry)
    if problems:
        raise ConfigError(*problems)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        schema = config.database.schema
        pool = db.make_pool(
            database_url,
            max_size=config.gateway.pool_max,
            timeout=pool_timeout,
            schema=schema,
            idle_in_transaction_timeout=config.database.idle_bound,
        )
        # Open without waiting for a connection: a gateway whose database is down still starts and
        # answers 503, rather than crash-looping behind its load balancer.
        await pool.open(wait=False)
        app.state.pool = pool
        # /readyz has a connection of its own, with short waits: readiness says whether the ledger answers,
        # not whether this process's pools are busy (all of them busy must not take every gateway out of
        # rotation at once). Not a pool: a pool's reconnect backoff kept readiness 503 for half a minute after
        # the database was back (ledger/readiness.py).
        readiness = ReadinessProbe(database_url, schema=schema, timeout=min(pool_timeout, READYZ_TIMEOUT))
        app.state.readiness = readiness
        # The claim path has a pool of its own, so its lock and statement timeouts bound claims and nothing else
        # (reports and maintenance on the other pool may rightly run longer): one connection per batch in
        # flight, one per tenant's call left going while its shard moves (Citus), and one for the probe that
        # finds a locked key.
        gw = config.gateway
        claim_pool = db.make_pool(
            database_url,
            min_size=1,
            max_size=claim_batcher.ClaimBatcher.connections(),
            timeout=pool_timeout,
            name="effectgate-claims",
            lock_timeout=gw.claim_lock_timeout,
            statement_timeout=gw.claim_statement_timeout,
            schema=schema,
            idle_in_transaction_timeout=config.database.idle_bound,
        )
        await claim_pool.open(wait=False)
        app.state.claim_pool = claim_pool
        # The process's one handle on the ledger: its pools, and what the database is, asked once.
        ledger = Ledger(pool, claim_pool=claim_pool)
        app.state.ledger = ledger
        # Group commit: the claims of concurrent deliveries in this process share a statement and a commit.
        batcher = claim_batcher.ClaimBatcher(ledger, max_queue=gw.claim_queue_max, deadline=gw.claim_deadline)
        app.state.batcher = batcher
        # What this process answered 2xx for, checked against the ledger when its connections reach another
        # timeline (a failover): the claims an asynchronous standby never received are logged and counted.
        acknowledged = Acknowledged()
        app.state.acknowledged = acknowledged
        gap_check = GapCheck(pool, acknowledged, on_lost=metrics.acknowledged_lost)
        # And a Citus worker node its reconciler could not read (ledger.cluster.shards).
        unwatch = [
            timeline.WATCH.listen(metrics.timeline_changed),
            timeline.WATCH.listen(gap_check),
            shards.SKIPS.listen(metrics.shard_reads_skipped),
        ]
        # Failed verifications are counted in memory and written by this flusher on its own connection, never
        # through the claim pool per request (a flood of 401s would otherwise queue genuine claims).
        failures = SignatureFailures(FailureCounter())
        app.state.signature_failures = failures
        flusher = FailureFlusher(
            failures.counter, database_url, interval=failure_flush_interval, schema=schema
        )
        app.state.signature_failure_flusher = flusher
        stopping_flusher = asyncio.Event()
        flushing = asyncio.create_task(flusher.run(stopping_flusher))
        # Gateways tick the reconciler too, so jobs are repaired even while no worker runs.
        stopping = asyncio.Event()
        reconciler = (
            asyncio.create_task(
                reconcile_forever(
                    ledger, registry, config.worker.reconciler, stopping, observer=metrics.WORKER_OBSERVER
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
            for stop_watching in unwatch:
                stop_watching()
            await gap_check.close()
            await batcher.close()
            await claim_pool.close()
            failures.diagnoser.close()
            # Last: its final pass writes what the requests answered until now counted.
            stopping_flusher.set()
            await flushing
            await readiness.close()
            await pool.close()
            if tracing.enabled():
                await asyncio.to_thread(tracing.flush)

    gate_port = operator_port if operator_port is not None else config.operator.listen_port
    app = Gateway(
        operator_port=gate_port,
        routes=[
            Route("/webhooks/{source}", _Webhooks(), methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            *operator_routes(),
        ],
        lifespan=lifespan,
        middleware=[
            Middleware(PlaneGate, operator_port=gate_port),
            Middleware(ApiHeaders),
        ],
        exception_handlers={ClientDisconnect: client_disconnected, BodyTooLarge: body_too_large},
    )
    app.state.config = config
    app.state.registry = registry
    app.state.metrics_token_sha256 = config.metrics_token_sha256
    app.state.ledger_gauges = metrics_endpoint.LedgerGauges(directory=metrics.multiprocess_dir())
    secret = config.dashboard.session_secret
    # The key is derived, so the configured secret itself signs nothing and is never compared.
    app.state.session_key = (
        hmac.new(secret, b"effectgate-dashboard-session-v1", hashlib.sha256).digest()
        if secret is not None
        else session_key or os.urandom(32)
    )
    # The connection guard of this process enforces the same box (``guard.configure``).
    app.state.penalty_box = penalty_box if penalty_box is not None else PenaltyBox(config.gateway.penalty_box)
    app.state.auth_throttle = FailureThrottle(config.operator.throttle_limit, config.operator.throttle_window)
    return app
