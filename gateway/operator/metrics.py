"""The ``/metrics`` endpoint, in the Prometheus text format (version 0.0.4): the series every process counts
(``gateway.metrics``) and what only the ledger knows for every process at once — jobs not yet done by
state and kind, and the wait of the oldest due job — read from the database through ``LedgerGauges`` (at
most once per ``LEDGER_GAUGES_TTL`` per process or ``serve`` tree), so those are single-valued however many
processes answer. Workers serve the same page from ``app`` when run with ``--metrics-port``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from effectgate.gateway.metrics import CONTENT_TYPE, label_text, multiprocess_dir, render
from effectgate.ledger import db, reports
from effectgate.ledger.jobs import filters
from effectgate.ledger.maintenance import retention

from .throttle import FailureThrottle, client_key, retry_after

log = logging.getLogger("effectgate.metrics")


def render_job_gauges(gauges: reports.JobGauges | None) -> str:
    """The ledger's gauges in the text format; ``effectgate_ledger_up 0`` when it could not be read."""
    lines = [
        "# HELP effectgate_ledger_up Whether this scrape could read the ledger database.",
        "# TYPE effectgate_ledger_up gauge",
        f"effectgate_ledger_up {0 if gauges is None else 1}",
    ]
    if gauges is None:
        return "\n".join(lines) + "\n"
    lines += [
        "# HELP effectgate_jobs Jobs not yet done (pending, running) or waiting for a human (failed, parked; "
        "a job resolved by hand waits no more).",
        "# TYPE effectgate_jobs gauge",
    ]
    for row in gauges.by_state_kind:
        lines.append(
            f"effectgate_jobs{label_text(('state', 'kind'), (row['state'], row['kind']))} {row['n']}"
        )
    lines += [
        "# HELP effectgate_oldest_due_job_seconds How long the longest-waiting due pending job has waited.",
        "# TYPE effectgate_oldest_due_job_seconds gauge",
        f"effectgate_oldest_due_job_seconds {round(gauges.oldest_due_seconds, 3)!r}",
    ]
    return "\n".join(lines) + "\n"


def render_retention(purged: Mapping[str, int] | None) -> str:
    """Rows retention purged so far, per table or column: counters kept in the ledger, so every process
    reports the same totals whichever one ran the purge."""
    if purged is None:
        return ""
    lines = [
        "# HELP effectgate_retention_purged_rows_total Rows (or column values) retention purged, by table.",
        "# TYPE effectgate_retention_purged_rows_total counter",
    ]
    for what in sorted(purged):
        lines.append(
            f"effectgate_retention_purged_rows_total{label_text(('table',), (what,))} {purged[what]}"
        )
    return "\n".join(lines) + "\n"


def render_paused(kinds: Sequence[str] | None) -> str:
    """One series per paused kind (``effectgate jobs pause``): its jobs are not being leased."""
    if kinds is None:
        return ""
    lines = [
        "# HELP effectgate_kind_paused 1 for each handler kind an operator paused; its jobs wait pending.",
        "# TYPE effectgate_kind_paused gauge",
    ]
    lines += [f"effectgate_kind_paused{label_text(('kind',), (kind,))} 1" for kind in kinds]
    return "\n".join(lines) + "\n"


def bearer_ok(request: Request, token_sha256: bytes | None) -> bool:
    """Whether ``request`` may scrape: always when no token is configured, else with ``Bearer <token>``."""
    if token_sha256 is None:
        return True
    scheme, _, presented = (request.headers.get("authorization") or "").strip().partition(" ")
    digest = hashlib.sha256(presented.strip().encode("utf-8")).digest()
    return scheme.lower() == "bearer" and hmac.compare_digest(digest, token_sha256)


#: How long the ledger's part of a ``/metrics`` page is served from memory before it is read again.
#: Shorter than any scrape interval worth having, so each scrape still sees a recent value, yet every
#: scrape within it (two Prometheus replicas, a dashboard, the N processes of ``serve --workers N``)
#: shares one read.
LEDGER_GAUGES_TTL = 10.0
# The file through which the processes of one `serve --workers N` tree share the ledger's text. Not
# `*.db`: prometheus_client's multiprocess collector reads only those.
_SHARED_FILE = "ledger-gauges.prom"


async def read_ledger_gauges(pool: db.Pool, *, now: float | None = None) -> str:
    """The ledger's part of a ``/metrics`` page, read from the database now: job gauges, retention
    counters, paused kinds, and when they were read; ``effectgate_ledger_up 0`` alone when it could not."""
    try:
        async with db.connection(pool) as conn:
            gauges = await reports.job_gauges(conn)
            purged = await retention.purge_totals(conn)
            paused = [row["kind"] for row in await filters.paused(conn)]
    except Exception as exc:
        # A scrape must answer even when the database does not: ledger_up 0 is the signal.
        log.warning("metrics.ledger_unreadable", extra={"error": f"{type(exc).__name__}: {exc}"})
        return render_job_gauges(None)
    read_at = time.time() if now is None else now
    return (
        render_job_gauges(gauges)
        + render_retention(purged)
        + render_paused(paused)
        + "# HELP effectgate_ledger_read_timestamp_seconds Unix time at which the ledger gauges were read.\n"
        + "# TYPE effectgate_ledger_read_timestamp_seconds gauge\n"
        + f"effectgate_ledger_read_timestamp_seconds {read_at!r}\n"
    )


class LedgerGauges:
    """The ledger's part of ``/metrics``, read from the database at most once per ``ttl`` seconds.

    What the ledger knows is the same for every process, so reading it per scrape multiplies the same
    queries by scrapers and processes. One instance serves an app (one per process): scrapes within
    ``ttl`` of a read get its text, concurrent scrapes past it wait for one read rather than each
    starting their own. With ``directory`` (the ``PROMETHEUS_MULTIPROC_DIR`` of ``serve --workers N``)
    the text is shared through a file there too, so the processes of one tree read the ledger about
    once per ``ttl`` between them (two that find it stale at the same moment may both read: harmless).
    A failed read (``effectgate_ledger_up 0``) is kept for ``ttl`` as well: a database that is down is
    not asked again by every scrape.
    """

    def __init__(
        self,
        ttl: float = LEDGER_GAUGES_TTL,
        *,
        directory: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl < 0:
            raise ValueError(f"ttl must be >= 0 seconds, got {ttl!r}")
        self.ttl = ttl
        self.reads = 0
        self._clock = clock
        self._shared = os.path.join(directory, _SHARED_FILE) if directory else None
        self._text = ""
        self._read_at = -math.inf
        self._lock = asyncio.Lock()

    async def text(self, pool: db.Pool) -> str:
        """The text last read, or a new read when it is older than ``ttl``."""
        if self._fresh(self._clock()):
            return self._text
        async with self._lock:
            now = self._clock()
            if self._fresh(now) or self._take_shared(now):
                return self._text
            self._text = await read_ledger_gauges(pool, now=now)
            self._read_at = now
            self.reads += 1
            self._give_shared()
            return self._text

    def _fresh(self, now: float) -> bool:
        return now - self._read_at < self.ttl

    def _take_shared(self, now: float) -> bool:
        if self._shared is None:
            return False
        try:
            with open(self._shared, encoding="utf-8") as f:
                stamp, _, text = f.read().partition("\n")
            read_at = float(stamp)
        except (OSError, ValueError):
            return False
        if not now - self.ttl < read_at <= now:
            return False
        self._text, self._read_at = text, read_at
        return True

    def _give_shared(self) -> None:
        if self._shared is None:
            return
        # Written aside and renamed: a sibling reads the old text or the new one, never half of one.
        partial = f"{self._shared}.{os.getpid()}"
        try:
            with open(partial, "w", encoding="utf-8") as f:
                f.write(f"{self._read_at!r}\n{self._text}")
            os.replace(partial, self._shared)
        except OSError as exc:
            log.warning("metrics.ledger_gauges_not_shared", extra={"error": f"{type(exc).__name__}: {exc}"})


async def endpoint(request: Request) -> Response:
    """``GET /metrics``: the counted metrics, then the ledger's job gauges, retention counters and paused kinds
    as ``LedgerGauges`` last read them."""
    if not bearer_ok(request, getattr(request.app.state, "metrics_token_sha256", None)):
        # A wrong token (not a missing one) is a guess, counted per client like the operator tokens'; the
        # right one is checked first and never refused (gateway.operator.throttle).
        throttle: FailureThrottle | None = getattr(request.app.state, "auth_throttle", None)
        if throttle is not None and request.headers.get("authorization"):
            wait = throttle.failed(client_key(request))
            if wait > 0:
                return Response(
                    '{"error":"too_many_failures","detail":"too many wrong tokens from this address"}',
                    status_code=429,
                    media_type="application/json",
                    headers={"Retry-After": retry_after(wait), "Cache-Control": "no-store"},
                )
        return Response(
            '{"error":"invalid_token","detail":"GET /metrics needs Authorization: Bearer <metrics token>"}',
            status_code=401,
            media_type="application/json",
            headers={"WWW-Authenticate": 'Bearer realm="effectgate-metrics"', "Cache-Control": "no-store"},
        )
    ledger: LedgerGauges = request.app.state.ledger_gauges
    body = render() + await ledger.text(request.app.state.pool)
    return Response(body, media_type=CONTENT_TYPE)


def app(
    pool: db.Pool,
    *,
    token_sha256: bytes | None = None,
    health: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
) -> Starlette:
    """``GET /metrics`` alone, for a process that serves nothing else (``effectgate worker --metrics-port``);
    the job gauges are read through ``pool``, which the caller owns; ``token_sha256``, when given, is the
    hash of the bearer token a scrape must present. ``health``, when given, answers ``GET /healthz``
    (200 or 503 with its JSON; no token: it reads process state only, never the database)."""
    routes = [Route("/metrics", endpoint, methods=["GET"])]
    if health is not None:
        check = health

        async def healthz(request: Request) -> Response:
            alive, state = check()
            return JSONResponse(state, status_code=200 if alive else 503)

        routes.append(Route("/healthz", healthz, methods=["GET"]))
    metrics_app = Starlette(routes=routes)
    metrics_app.state.pool = pool
    metrics_app.state.metrics_token_sha256 = token_sha256
    metrics_app.state.auth_throttle = FailureThrottle()
    metrics_app.state.ledger_gauges = LedgerGauges(directory=multiprocess_dir())
    return metrics_app
