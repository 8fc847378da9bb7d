"""What every process counts, as Prometheus series: deliveries and requests, verification failures, the
penalty box, claims, job runs, retries, reclaims, downstream calls, the reconciler's ticks, and the build.

The ingress, the connection guard, the worker (through ``WORKER_OBSERVER`` and the downstream clients'
``on_call``, handed in by ``gateway.cli.worker``: ``handlers`` cannot import this module) and maintenance count
through the module functions; ``render`` gives this process's series, or with several processes the sum of
all of them. The ``/metrics`` endpoint that serves them beside what only the ledger knows lives with the
operator plane (``gateway.operator.metrics``); counting does not reach into the operator's room.

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

import importlib.metadata
import logging
import os
import platform
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client import disable_created_metrics as _disable_created_metrics

from effectgate.handlers.observe import WorkerObserver
from effectgate.handlers.outcomes import SliceOutcome
from effectgate.ledger.vocabulary import DeliveryOutcome

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
        # The series each label tuple resolved to: every delivery counts into two or three of them, and
        # prometheus_client's labels() takes a lock and rebuilds the key each time.
        self._series: dict[tuple[str, ...], _M] = {}

    def labels(self, *values: str) -> _M:
        series = self._series.get(values)
        if series is None:
            series = self._resolve(values)
        return series

    def _resolve(self, values: tuple[str, ...]) -> _M:
        key = tuple(str(v) for v in values)
        if len(key) != self.width:
            raise ValueError(f"{self.metric._name} takes {self.width} labels, got {key}")
        if key not in self.seen:
            if len(self.seen) >= MAX_SERIES:
                key = (OTHER,) * self.width
            self.seen.add(key)
        series: _M = self.metric.labels(*key)
        if len(self._series) < 2 * MAX_SERIES:
            # Bounded like the series: past the cap, labels seen once more are resolved each time.
            self._series[values] = series
        return series


REGISTRY = CollectorRegistry(auto_describe=True)
DELIVERIES = _Capped(
    Counter(
        "effectgate_deliveries",
        "Webhook deliveries answered, by source and outcome (accepted, duplicate, rejected, superseded, unmatched, or an error code).",
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
        "Requests of boxed clients refused or delayed, by source and how: waited (for the client's turn), "
        "held (connection paused until the header timeout), closed (past the hold limit), answered (429).",
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

# A failover seen by a process (ledger/timeline.py), and the acknowledged claims it found missing after one
# (gateway/ingress/acknowledged.py): each process counts what it saw, so the sum over processes counts a
# failover once per process that lived through it.
TIMELINE_CHANGES = Counter(
    "effectgate_ledger_timeline_changes_total",
    "Times this process's database connections reached another Postgres timeline (a failover or a restore).",
    registry=REGISTRY,
)
SHARD_READS_SKIPPED = Counter(
    "effectgate_shard_reads_skipped_total",
    "Passes (the fetch, the rescuer, the waker, retention) that could not read a Citus worker node's shards: the "
    "tenants on that node are not leased, rescued or purged until it answers again.",
    ["pass_name", "node"],
    registry=REGISTRY,
)
ACKNOWLEDGED_LOST = Counter(
    "effectgate_acknowledged_lost_total",
    "Claims this gateway answered 2xx for that the ledger lacked after a failover (asynchronous replication).",
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
    """Count one claimed delivery of ``source`` per effect outcome (accepted, duplicate, rejected, superseded), or as
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
    """Count one request of a boxed client refused or delayed (``waited``, ``held``, ``closed`` or ``answered``)."""
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


def timeline_changed(change: object) -> None:
    """Count a timeline change this process saw (a ``ledger.timeline`` listener)."""
    TIMELINE_CHANGES.inc()


def shard_reads_skipped(pass_name: str, node: str, shards: int) -> None:
    """Count a pass that skipped ``node``'s shards (a ``ledger.cluster.shards`` listener)."""
    SHARD_READS_SKIPPED.labels(pass_name, node).inc()


def acknowledged_lost(count: int) -> None:
    """Count acknowledged claims a failover lost."""
    ACKNOWLEDGED_LOST.inc(count)


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
        f"effectgate_build_info{label_text(('version', 'python'), (version, python))} 1\n"
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


def label_text(names: Sequence[str], values: Sequence[str]) -> str:
    """A series' label set in the text format: ``{name="value",…}``, values escaped."""
    return "{" + ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)) + "}"


# Rendered as text, not a Gauge: in multiprocess mode a gauge is one series per process (or an
# aggregate of them), while this is a constant of the installed package, the same in every process.
BUILD_INFO = _build_info()
