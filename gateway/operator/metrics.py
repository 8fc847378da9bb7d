"""Process metrics and the ``/metrics`` endpoint, in the Prometheus text format (version 0.0.4).

The ingress and the worker count what happens in their process through the module functions
(``delivery``, ``verification_failure``, ``claim_latency``, ``job_run``, ``job_retry``, ``job_reclaim``,
``downstream_call``); a scrape of ``/metrics`` renders those counters and adds what only the ledger knows
for every process at once — jobs not yet done by state and kind, and the wait of the oldest due job.
Workers count through ``WORKER_OBSERVER`` and the downstream clients' ``on_call``, both handed in by
``gateway.cli`` (``handlers`` cannot import this module), and serve the same page from ``app`` when run
with ``--metrics-port``.

The registry is module-level, like a logger: counting is a side channel every layer reaches without
being handed a resource, and a counter costs one dict update. Each process counts its own; with several
gateway processes, Prometheus sums them per instance, which is how its counters are meant to be read.
The text format is small enough to write here rather than take a dependency for it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from effectgate.handlers.observe import WorkerObserver
from effectgate.ledger import bulk, db, reports, retention

log = logging.getLogger("effectgate.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A label value comes from outside (a source name in a URL, a reason code): past this many series a
# metric folds new label sets into one "other" series, so a scan of random URLs cannot exhaust memory.
MAX_SERIES = 500
OTHER = "other"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RUN_TIME_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


_LE_INF = 'le="+Inf"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass
class _Metric:
    name: str
    help: str
    labelnames: tuple[str, ...]

    def _key(self, labels: Sequence[str], series: Mapping[tuple[str, ...], object]) -> tuple[str, ...]:
        key = tuple(str(v) for v in labels)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {key}")
        if key not in series and len(series) >= MAX_SERIES:
            return tuple(OTHER for _ in key)
        return key

    def _header(self, kind: str) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {kind}"]


@dataclass
class Counter(_Metric):
    """A monotonically increasing count per label set."""

    values: dict[tuple[str, ...], float] = field(default_factory=dict)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        """Add ``amount`` (default 1) to the series of ``labels``."""
        key = self._key(labels, self.values)
        self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        """The metric's lines in the text format."""
        lines = self._header("counter")
        for key in sorted(self.values):
            lines.append(f"{self.name}{_labels(self.labelnames, key)} {_number(self.values[key])}")
        return lines


@dataclass
class _Series:
    buckets: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count, per label set."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    series: dict[tuple[str, ...], _Series] = field(default_factory=dict)

    def observe(self, value: float, *labels: str) -> None:
        """Record one observation for ``labels``."""
        key = self._key(labels, self.series)
        entry = self.series.get(key)
        if entry is None:
            entry = self.series[key] = _Series([0] * len(self.buckets))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                entry.buckets[i] += 1
        entry.total += value
        entry.count += 1

    def render(self) -> list[str]:
        """The metric's lines in the text format: buckets are cumulative, ending with ``+Inf``."""
        lines = self._header("histogram")
        for key in sorted(self.series):
            entry = self.series[key]
            for bound, n in zip(self.buckets, entry.buckets, strict=True):
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {n}")
            lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, _LE_INF)} {entry.count}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(entry.total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {entry.count}")
        return lines


_M = TypeVar("_M", Counter, Histogram)


class Registry:
    """The metrics of one process, rendered together."""

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Histogram] = {}

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        """Register a counter; a name is registered once."""
        return self._add(Counter(name, help, tuple(labelnames)))

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        """Register a histogram with ascending bucket bounds; a name is registered once."""
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be ascending and distinct")
        return self._add(Histogram(name, help, tuple(labelnames), tuple(buckets)))

    def _add(self, metric: _M) -> _M:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is registered already")
        self._metrics[metric.name] = metric
        return metric

    def render(self) -> str:
        """Every metric in the text format."""
        lines: list[str] = []
        for name in sorted(self._metrics):
            lines += self._metrics[name].render()
        return "\n".join(lines) + "\n" if lines else ""


REGISTRY = Registry()
DELIVERIES = REGISTRY.counter(
    "effectgate_deliveries_total",
    "Webhook deliveries answered, by source and outcome (accepted, duplicate, rejected, unmatched, or an error code).",
    ("source", "outcome"),
)
VERIFICATION_FAILURES = REGISTRY.counter(
    "effectgate_verification_failures_total",
    "Deliveries whose signature verification failed, by source and reason code.",
    ("source", "reason"),
)
CLAIM_LATENCY = REGISTRY.histogram(
    "effectgate_claim_seconds", "Time of the claim transaction of one delivery, in seconds."
)
JOB_RUN_TIME = REGISTRY.histogram(
    "effectgate_job_run_seconds",
    "Time one job slice ran, by kind and how it ended, in seconds.",
    ("kind", "outcome"),
    buckets=RUN_TIME_BUCKETS,
)
JOB_RETRIES = REGISTRY.counter(
    "effectgate_job_retries_total", "Job attempts that ended in a retry, by kind.", ("kind",)
)
JOB_RECLAIMS = REGISTRY.counter(
    "effectgate_job_reclaims_total", "Jobs taken back from a worker whose lease expired, by kind.", ("kind",)
)
DOWNSTREAM_CALLS = REGISTRY.counter(
    "effectgate_downstream_calls_total",
    "Calls to downstream APIs, by service and HTTP status (or error).",
    ("service", "status"),
)


def delivery(source: str, outcome: str) -> None:
    """Count one answered delivery of ``source`` with its outcome."""
    DELIVERIES.inc(source, outcome)


def claimed(source: str, outcomes: Iterable[str]) -> None:
    """Count one claimed delivery of ``source`` per effect outcome (accepted, duplicate, rejected), or as
    ``unmatched`` when no handler asked for an effect."""
    counted = False
    for outcome in outcomes:
        DELIVERIES.inc(source, outcome)
        counted = True
    if not counted:
        DELIVERIES.inc(source, "unmatched")


def verification_failure(source: str, reason: str) -> None:
    """Count one failed signature verification of ``source`` with its reason code."""
    VERIFICATION_FAILURES.inc(source, reason)


def claim_latency(seconds: float) -> None:
    """Record how long one delivery's claim transaction took."""
    CLAIM_LATENCY.observe(seconds)


def job_run(kind: str, outcome: str, seconds: float) -> None:
    """Record how long one job slice of ``kind`` ran and how it ended."""
    JOB_RUN_TIME.observe(seconds, kind, outcome)


def job_retry(kind: str) -> None:
    """Count one attempt of ``kind`` given back for a retry."""
    JOB_RETRIES.inc(kind)


def job_reclaim(kind: str) -> None:
    """Count one job of ``kind`` taken back after its lease expired."""
    JOB_RECLAIMS.inc(kind)


def downstream_call(service: str, status: int | str) -> None:
    """Count one downstream call with its HTTP status (or an error name)."""
    DOWNSTREAM_CALLS.inc(service, str(status))


#: What a worker (and a gateway's reconciler loop) reports, counted into this process's registry.
WORKER_OBSERVER = WorkerObserver(on_slice=job_run, on_retry=job_retry, on_reclaim=job_reclaim)


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
        "# HELP effectgate_jobs Jobs not yet done (pending, running) or waiting for a human (failed, parked).",
        "# TYPE effectgate_jobs gauge",
    ]
    for row in gauges.by_state_kind:
        lines.append(f"effectgate_jobs{_labels(('state', 'kind'), (row['state'], row['kind']))} {row['n']}")
    lines += [
        "# HELP effectgate_oldest_due_job_seconds How long the longest-waiting due pending job has waited.",
        "# TYPE effectgate_oldest_due_job_seconds gauge",
        f"effectgate_oldest_due_job_seconds {_number(round(gauges.oldest_due_seconds, 3))}",
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


async def endpoint(request: Request) -> Response:
    """``GET /metrics``: this process's counters, the ledger's job gauges and retention counters."""
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
    body = REGISTRY.render() + render_job_gauges(gauges) + render_retention(purged) + render_paused(paused)
    return Response(body, media_type=CONTENT_TYPE)


def app(pool: db.Pool) -> Starlette:
    """``GET /metrics`` alone, for a process that serves nothing else (``effectgate worker --metrics-port``);
    the job gauges are read through ``pool``, which the caller owns."""
    metrics_app = Starlette(routes=[Route("/metrics", endpoint, methods=["GET"])])
    metrics_app.state.pool = pool
    return metrics_app
