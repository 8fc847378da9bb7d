"""How a worker runs: its settings, their defaults, and the connections a pool needs for them.

Apart from the runtime so that configuration (the gateway's config reader, the deploy checks) reads the
defaults without the worker's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from effectgate.ledger.maintenance.scheduler import ReconcilerConfig

__all__ = ["WorkerConfig", "worker_connections"]

# Handlers wait on payment and shipping APIs: a slot spends most of a job awaiting the network, so the
# drain rate grows with the slots (tests/bench/worker_sweep.py), and a backlog of quick jobs drains at the
# size of the batch the slots that end together make (tests/bench/worker_vs_pgqueuer.py; docs/performance.md,
# "A real worker against PgQueuer"). Slots cost no connections past handler_connections (worker_connections).
DEFAULT_CONCURRENCY = 64
# A fallback only: LISTEN/NOTIFY wakes the loop for new jobs, and a finished job wakes it for its slot (unless
# its finish batch's refill already offered that slot to a fetch).
DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_DRAIN_TIMEOUT = 30.0
# Retry waits double from 1 s up to an hour: a blip is retried within seconds, and once an outage has lasted
# an hour the job asks again hourly, so it runs within the hour of the downstream's return. With
# effect_kind.DEFAULT_MAX_ATTEMPTS (60) that is 24-48 h of retries before an effect fails for good
# (handlers.worker.backoff.RetrySchedule; `effectgate config show` prints it).
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_CAP = 3600.0
# The worker's own statements (fetch, heartbeat, finish batch, reconciler tick, a /metrics scrape's ledger
# gauges) each hold at most one pooled connection at a time, on a pool of their own that no handler can
# exhaust.
WORKER_OWN_CONNECTIONS = 5
# The most connections a worker's running jobs share for their own writes (step records and markers,
# checkpoints, fenced writes, retry and yield transitions, a resumed job's recorded steps). A job holds one
# only for a statement or a fenced write, not while it awaits a downstream call, so slots need not each have
# one (worker_connections).
DEFAULT_HANDLER_CONNECTIONS = 16


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs: concurrency, wake-ups, drain, retry backoff, reconciler.

    ``backoff_base=0`` turns retry waits off (the one switch tests use), the kinds' own too; retries then
    run at once. Otherwise a kind may set its own ``backoff_base`` / ``backoff_cap`` (``worker.backoff``).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    handler_connections: int = DEFAULT_HANDLER_CONNECTIONS
    poll_interval: float = DEFAULT_POLL_INTERVAL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    reconciler: ReconcilerConfig = field(default_factory=ReconcilerConfig)
    run_reconciler: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("worker concurrency must be >= 1")
        if self.handler_connections < 1:
            raise ValueError("worker handler_connections must be >= 1")
        if not self.poll_interval > 0:
            raise ValueError("worker poll_interval must be > 0 seconds")
        if not self.drain_timeout >= 0:
            raise ValueError("worker drain_timeout must be >= 0 seconds")
        if not 0 <= self.backoff_base <= self.backoff_cap:
            raise ValueError("worker backoff needs 0 <= backoff_base <= backoff_cap")


def worker_connections(config: WorkerConfig) -> tuple[int, int]:
    """The most connections a worker's two pools may open: its own statements', and its running jobs'.

    The worker's own statements (fetch, heartbeat, finish batch, reconciler tick, a scrape's gauges) each give
    their connection back within a statement, and have a pool of their own: a heartbeat never waits on a
    handler. The running jobs share the other, at most one connection per slot (a step record, a checkpoint,
    a fenced write; a step recorded inside a fenced write would wait on that write's own row lock, so none
    nests) and at most ``handler_connections``: a job holds one only while it writes, so with more slots than
    connections a write waits for one (past the pool's wait, a step's write is retried like a lost database,
    within the kind's lease TTL) instead of each slot costing the server a connection. (The LISTEN connection
    is not pooled.) It was ``concurrency + 4`` on one pool, which made a worker with enough slots for a
    backlog of quick jobs too dear in connections.
    """
    return WORKER_OWN_CONNECTIONS, min(config.concurrency, config.handler_connections)
