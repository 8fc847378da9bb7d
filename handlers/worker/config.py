"""How a worker runs: its settings, their defaults, and the connections a pool needs for them.

Apart from the runtime so that configuration (the gateway's config reader, the deploy checks) reads the
defaults without the worker's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from effectgate.ledger.maintenance.scheduler import ReconcilerConfig

__all__ = ["WorkerConfig", "worker_pool_max"]

# Handlers wait on payment and shipping APIs: a slot spends most of a job awaiting the network, so the
# drain rate grows with the slots (measured by tests/bench/worker_sweep.py; docs/performance.md). 16 runs
# 3.5x the jobs of 4 at a 20-50 ms downstream call and keeps a worker at 21 connections (worker_pool_max).
DEFAULT_CONCURRENCY = 16
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
# The worker's own statements (fetch, heartbeat, finish batch, reconciler tick) each hold at most one pooled
# connection at a time.
WORKER_OWN_CONNECTIONS = 4


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs: concurrency, wake-ups, drain, retry backoff, reconciler.

    ``backoff_base=0`` turns retry waits off (the one switch tests use), the kinds' own too; retries then
    run at once. Otherwise a kind may set its own ``backoff_base`` / ``backoff_cap`` (``worker.backoff``).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    poll_interval: float = DEFAULT_POLL_INTERVAL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    reconciler: ReconcilerConfig = field(default_factory=ReconcilerConfig)
    run_reconciler: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("worker concurrency must be >= 1")
        if not self.poll_interval > 0:
            raise ValueError("worker poll_interval must be > 0 seconds")
        if not self.drain_timeout >= 0:
            raise ValueError("worker drain_timeout must be >= 0 seconds")
        if not 0 <= self.backoff_base <= self.backoff_cap:
            raise ValueError("worker backoff needs 0 <= backoff_base <= backoff_cap")


def worker_pool_max(concurrency: int) -> int:
    """The most connections a worker's pool may open: one per slot plus the worker's own statements.

    A slot holds at most one connection at a time (a step record, a checkpoint, a fenced write; a step
    recorded inside a fenced write would wait on that write's own row lock, so none nests), and the
    worker's own statements give theirs back within a statement: every slot and every heartbeat gets a
    connection without waiting on a handler. (The LISTEN connection is not pooled.) It was
    ``concurrency * 2 + 2``, which made a worker with enough slots for network-bound handlers too dear in
    connections; measured, a worker at 64 slots held 3 (docs/performance.md).
    """
    return concurrency + WORKER_OWN_CONNECTIONS
