"""Process metrics and the ``/metrics`` endpoint, in the Prometheus text format (version 0.0.4).

The ingress and the worker count what happens in their process through the module functions
(``delivery``, ``verification_failure``, ``claim_latency``, ``job_run``, ``job_retry``, ``job_reclaim``,
``downstream_call``, ``reconciler_ticked``); a scrape of ``/metrics`` renders those and adds what only
the ledger knows for every process at once — jobs not yet done by state and kind, and the wait of the
oldest due job — read from the database at scrape time, so those are single-valued however many
processes answer. Workers count through ``WORKER_OBSERVER`` and the downstream clients' ``on_call``,
both handed in by ``gateway.cli`` (``handlers`` cannot import this module), and serve the same page from
``app`` when run with ``--metrics-port``.

Counting is ``prometheus_client``'s. ``serve --workers N`` runs N processes behind one port and a scrape
reaches whichever one accepts it, so each process's own count would read as a counter reset on every
other scrape. ``cmd_serve`` therefore gives its children a private ``PROMETHEUS_MULTIPROC_DIR`` before
they import this module: every process writes its series to memory-mapped files there, and every scrape
sums the files of all of them, the dead included, so counters never go backwards. A single process
(``serve`` with one worker, ``worker``) counts in memory.

The metrics are module-level, like a logger: counting is a side channel every layer reaches without
being handed a resource.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client import disable_created_metrics as _disable_created_metrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from effectgate.handlers.observe import WorkerObserver
from effectgate.handlers.outcomes import SliceOutcome
from effectgate.ledger import bulk, db, reports, retention
from effectgate.ledger.vocabulary import DeliveryOutcome

from .throttle import FailureThrottle, client_key, retry_after

log = logging.getLogger("effectgate.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A label value comes from outside (a source name in a URL, a reason code): past this many series a
# metric folds new label sets into one "other" series, so a scan of random URLs cannot exhaust memory.
# The cap holds per process; with N processes a metric has at most N x MAX_SERIES series.
MAX_SERIES = 500
OTHER = "other"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RUN_TIME_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
#: The environment variable ``prometheus_client`` reads, at import, to count into shared files.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# The `_created` series double every counter for a timestamp Prometheus does not need here.
_disable_created_metrics()  # type: ignore[no-untyped-call]


def multiprocess_dir() -> str | None:
    """The directory this process counts into, when it is one of several sharing a port."""
    return os.environ.get(MULTIPROC_ENV) or None


_M = TypeVar("_M", Counter, Histogram)


class _Capped(Generic[_M]):
    """A labelled metric whose label sets are capped at ``MAX_SERIES`` per process."""

    def __init__(self, metric: _M, width: int) -> None:
        self.metric: _M = metric
        self.width = width
        self.seen: set[tuple[str, ...]] = set()

    def labels(self, *values: str) -> _M:
        key = tuple(str(v) for v in values)
        if len(key) != self.width:
            raise ValueError(f"{self.metric._name} takes {self.width} labels, got {key}")
        if key not in self.seen:
            if len(self.seen) >= MAX_SERIES:
                key = (OTHER,) * self.width
            self.seen.add(key)
        series: _M = self.metric.labels(*key)
        return series


REGISTRY = CollectorRegistry(auto_describe=True)
DELIVERIES = _Capped(
    Counter(
        "effectgate_deliveries",
        "Webhook deliveries answered, by source and outcome (accepted, duplicate, rejected, unmatched, or an error code).",
        ("source", "outcome"),
        registry=REGISTRY,
    ),
    2,
)
VERIFICATION_FAILURES = _Capped(
    Counter(
        "effectgate_verification_failures",
        "Deliveries whose signature verification failed, by source and reason code.",
        ("source", "reason"),
        registry=REGISTRY,
    ),
    2,
)
CLAIM_LATENCY = Histogram(
    "effectgate_claim_seconds",
    "Time of the claim transaction of one delivery, in seconds.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
JOB_RUN_TIME = _Capped(
    Histogram(
        "effectgate_job_run_seconds",
        "Time one job slice ran, by kind and how it ended, in seconds.",
        ("kind", "outcome"),
        buckets=RUN_TIME_BUCKETS,
        registry=REGISTRY,
    ),
    2,
)
JOB_RETRIES = _Capped(
    Counter(
        "effectgate_job_retries", "Job attempts that ended in a retry, by kind.", ("kind",), registry=REGISTRY
    ),
    1,
)
JOB_RECLAIMS = _Capped(
    Counter(
        "effectgate_job_reclaims",
        "Jobs taken back from a worker whose lease expired, by kind.",
        ("kind",),
        registry=REGISTRY,
    ),
    1,
)
DOWNSTREAM_CALLS = _Capped(
    Counter(
        "effectgate_downstream_calls",
        "Calls to downstream APIs, by service and HTTP status (or error).",
        ("service", "status"),
        registry=REGISTRY,
    ),
    2,
)
# "max" across processes, the dead included: the latest pass any of them finished. A process that
# died keeps its last tick, which is older than any live process's, so it never hides a stall.
RECONCILER_LAST_TICK = Gauge(
    "effectgate_reconciler_last_tick_timestamp_seconds",
    "Unix time at which a reconciler pass of this gateway or worker last finished.",
    multiprocess_mode="max",
    registry=REGISTRY,
)


def delivery(source: str, outcome: str) -> None:
    """Count one answered delivery of ``source`` with its outcome."""
    DELIVERIES.labels(source, outcome).inc()


def claimed(source: str, outcomes: Iterable[DeliveryOutcome]) -> None:
    """Count one claimed delivery of ``source`` per effect outcome (accepted, duplicate, rejected), or as
    ``unmatched`` when no handler asked for an effect."""
    counted = False
    for outcome in outcomes:
        DELIVERIES.labels(source, outcome).inc()
        counted = True
    if not counted:
        DELIVERIES.labels(source, DeliveryOutcome.UNMATCHED).inc()


def verification_failure(source: str, reason: str) -> None:
    """Count one failed signature verification of ``source`` with its reason code."""
    VERIFICATION_FAILURES.labels(source, reason).inc()


def claim_latency(seconds: float) -> None:
    """Record how long one delivery's claim transaction took."""
    CLAIM_LATENCY.observe(seconds)


def job_run(kind: str, outcome: SliceOutcome, seconds: float) -> None:
    """Record how long one job slice of ``kind`` ran and how it ended."""
    JOB_RUN_TIME.labels(kind, outcome).observe(seconds)


def job_retry(kind: str) -> None:
    """Count one attempt of ``kind`` given back for a retry."""
    JOB_RETRIES.labels(kind).inc()


def job_reclaim(kind: str) -> None:
    """Count one job of ``kind`` taken back after its lease expired."""
    JOB_RECLAIMS.labels(kind).inc()


def downstream_call(service: str, status: int | str) -> None:
    """Count one downstream call with its HTTP status (or an error name)."""
    DOWNSTREAM_CALLS.labels(service, str(status)).inc()


def reconciler_ticked() -> None:
    """Note that a reconciler pass of this process finished (owned or not: either way it ran)."""
    RECONCILER_LAST_TICK.set_to_current_time()


#: What a worker (and a gateway's reconciler loop) reports, counted into this process's metrics.
WORKER_OBSERVER = WorkerObserver(
    on_slice=job_run, on_retry=job_retry, on_reclaim=job_reclaim, on_tick=reconciler_ticked
)


def render() -> str:
    """The counted metrics in the text format: this process's, or, with several processes sharing a
    ``PROMETHEUS_MULTIPROC_DIR``, the sum over all of them."""
    directory = multiprocess_dir()
    if directory is None:
        return generate_latest(REGISTRY).decode("utf-8")
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(merged).decode("utf-8")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    return "{" + ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)) + "}"


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
        lines.append(f"effectgate_jobs{_labels(('state', 'kind'), (row['state'], row['kind']))} {row['n']}")
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
        lines.append(f"effectgate_retention_purged_rows_total{_labels(('table',), (what,))} {purged[what]}")
    return "\n".join(lines) + "\n"


def render_paused(kinds: Sequence[str] | None) -> str:
    """One series per paused kind (``effectgate jobs pause``): its jobs are not being leased."""
    if kinds is None:
        return ""
    lines = [
        "# HELP effectgate_kind_paused 1 for each handler kind an operator paused; its jobs wait pending.",
        "# TYPE effectgate_kind_paused gauge",
    ]
    lines += [f"effectgate_kind_paused{_labels(('kind',), (kind,))} 1" for kind in kinds]
    return "\n".join(lines) + "\n"


def bearer_ok(request: Request, token_sha256: bytes | None) -> bool:
    """Whether ``request`` may scrape: always when no token is configured, else with ``Bearer <token>``."""
    if token_sha256 is None:
        return True
    scheme, _, presented = (request.headers.get("authorization") or "").strip().partition(" ")
    digest = hashlib.sha256(presented.strip().encode("utf-8")).digest()
    return scheme.lower() == "bearer" and hmac.compare_digest(digest, token_sha256)


async def endpoint(request: Request) -> Response:
    """``GET /metrics``: the counted metrics, the ledger's job gauges, retention counters and paused kinds."""
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
    gauges: reports.JobGauges | None
    purged: dict[str, int] | None
    paused: list[str] | None
    try:
        async with db.connection(request.app.state.pool) as conn:
            gauges = await reports.job_gauges(conn)
            purged = await retention.purge_totals(conn)
            paused = [row["kind"] for row in await bulk.paused(conn)]
    except Exception as exc:
        # A scrape must answer even when the database does not: ledger_up 0 is the signal.
        log.warning("metrics.ledger_unreadable", extra={"error": f"{type(exc).__name__}: {exc}"})
        gauges, purged, paused = None, None, None
    body = render() + render_job_gauges(gauges) + render_retention(purged) + render_paused(paused)
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
    return metrics_app
