"""Process metrics and the ``/metrics`` endpoint, in the Prometheus text format (version 0.0.4).

The ingress and the worker count what happens in their process through the module functions
(``delivery``, ``verification_failure``, ``claim_latency``, ``job_run``, ``job_retry``, ``job_reclaim``,
``downstream_call``, ``reconciler_ticked``); a scrape of ``/metrics`` renders those and adds what only
the ledger knows for every process at once — jobs not yet done by state and kind, and the wait of the
oldest due job — read from the database through ``LedgerGauges`` (at most once per ``LEDGER_GAUGES_TTL``
per process or ``serve`` tree), so those are single-valued however many processes answer. Workers count through ``WORKER_OBSERVER`` and the downstream clients' ``on_call``,
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

import asyncio
import hashlib
import hmac
import importlib.metadata
import logging
import math
import os
import platform
import time
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
PENALTY_BOX_ENTRIES = _Capped(
    Counter(
        "effectgate_penalty_box_entries",
        "Clients put in the penalty box for a source, by reason: failures (repeated failed "
        "authentications) or replays (one delivery repeated too often).",
        ("source", "reason"),
        registry=REGISTRY,
    ),
    2,
)
PENALTY_BOX_REFUSALS = _Capped(
    Counter(
        "effectgate_penalty_box_refusals",
        "Requests of boxed clients refused, by source and how: held (connection paused until the header "
        "timeout), closed (past the hold limit), answered (429, behind a trusted proxy).",
        ("source", "how"),
        registry=REGISTRY,
    ),
    2,
)
CLIENT_SLOT_WAITS = Counter(
    "effectgate_client_slot_waits",
    "Requests that waited, unread, because their client had [gateway] client_concurrency requests in flight.",
    registry=REGISTRY,
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
# Every answer of the delivery plane (POST /webhooks/{source}), one per HTTP request whatever it held:
# unlike DELIVERIES (one per effect claimed), a delivery asking for three effects counts once here,
# and 404 unknown_source and 413 payload_too_large are counted too.
WEBHOOK_REQUESTS = _Capped(
    Counter(
        "effectgate_webhook_requests",
        "HTTP requests answered on the delivery plane, by source and HTTP status.",
        ("source", "status"),
        registry=REGISTRY,
    ),
    2,
)
WEBHOOK_REQUEST_TIME = _Capped(
    Histogram(
        "effectgate_webhook_request_seconds",
        "Time from a delivery request's routing to its answer, by source and status class (2xx, 4xx, 5xx).",
        ("source", "status_class"),
        buckets=LATENCY_BUCKETS,
        registry=REGISTRY,
    ),
    2,
)
DOWNSTREAM_CALL_TIME = _Capped(
    Histogram(
        "effectgate_downstream_call_seconds",
        "Time of one call to a downstream API, by service and outcome (2xx, 4xx, 5xx, or error), in seconds.",
        ("service", "outcome"),
        buckets=LATENCY_BUCKETS,
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


#: The ``source`` label of a request to a source name that is not configured: one series for all of them
#: (source names are letters, digits, '-' and '_', so it cannot be a real one), so a scan of random
#: URLs cannot push the configured sources into ``other``.
UNKNOWN_SOURCE = "(unknown)"
_STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def status_class(status: int) -> str:
    """``2xx`` for 204, and so on; ``other`` for a number outside 100-599."""
    return _STATUS_CLASSES[status // 100 - 1] if 100 <= status < 600 else OTHER


def webhook_request(source: str, status: int, seconds: float) -> None:
    """Count one answered request of the delivery plane and how long it took."""
    WEBHOOK_REQUESTS.labels(source, str(status)).inc()
    WEBHOOK_REQUEST_TIME.labels(source, status_class(status)).observe(seconds)


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


def penalty_box_entered(source: str, reason: str) -> None:
    """Count one client put in the penalty box for ``source`` (reason ``failures`` or ``replays``)."""
    PENALTY_BOX_ENTRIES.labels(source, reason).inc()


def penalty_box_refusal(source: str, how: str) -> None:
    """Count one request of a boxed client refused (``held``, ``closed`` or ``answered``)."""
    PENALTY_BOX_REFUSALS.labels(source, how).inc()


def client_slot_wait() -> None:
    """Count one request that waited for a slot of its client's."""
    CLIENT_SLOT_WAITS.inc()


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


def downstream_call(service: str, status: int | str, seconds: float) -> None:
    """Count one downstream call with its HTTP status (or an error name), and how long it took."""
    DOWNSTREAM_CALLS.labels(service, str(status)).inc()
    outcome = status_class(status) if isinstance(status, int) else "error"
    DOWNSTREAM_CALL_TIME.labels(service, outcome).observe(seconds)


def reconciler_ticked() -> None:
    """Note that a reconciler pass of this process finished (owned or not: either way it ran)."""
    RECONCILER_LAST_TICK.set_to_current_time()


#: What a worker (and a gateway's reconciler loop) reports, counted into this process's metrics.
WORKER_OBSERVER = WorkerObserver(
    on_slice=job_run, on_retry=job_retry, on_reclaim=job_reclaim, on_tick=reconciler_ticked
)


def _build_info() -> str:
    try:
        version = importlib.metadata.version("effectgate")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    python = platform.python_version()
    return (
        "# HELP effectgate_build_info Always 1; the labels say which effectgate and Python this process runs.\n"
        "# TYPE effectgate_build_info gauge\n"
        f"effectgate_build_info{_labels(('version', 'python'), (version, python))} 1\n"
    )


def render() -> str:
    """The counted metrics in the text format: this process's, or, with several processes sharing a
    ``PROMETHEUS_MULTIPROC_DIR``, the sum over all of them; then ``effectgate_build_info``."""
    directory = multiprocess_dir()
    if directory is None:
        return generate_latest(REGISTRY).decode("utf-8") + BUILD_INFO
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(merged).decode("utf-8") + BUILD_INFO


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    return "{" + ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)) + "}"


# Rendered as text, not a Gauge: in multiprocess mode a gauge is one series per process (or an
# aggregate of them), while this is a constant of the installed package, the same in every process.
BUILD_INFO = _build_info()


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
            paused = [row["kind"] for row in await bulk.paused(conn)]
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
