"""The reconciler: the scheduler that runs the maintenance services, once per tick, in any process.

A pass runs, in order, each under an advisory lock of its own (see ``maintenance``) and in transactions of its
own: the lease rescuer (``rescuer``), the pending waker (``waker``), the partition keeper (``partitions``, one
per partition), the retention keeper (``retention``, one per batch) and the sweeps (``sweeps``). Of several processes ticking at once, one runs each service;
each service's statements are also guarded in their own WHERE clauses, so even a second pass on the same
rows finds nothing left to do. A service that throws is one error in the result and stops nothing else.

``ReconcilerConfig`` is the flat, backward-compatible view of the services' configs (the
``[reconciler]`` keys of effectgate.toml map onto it); each service still validates its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from .partitions import PartitionConfig, PartitionKeeper, PartitionResult
from .rescuer import (
    DEFAULT_BATCH,
    DEFAULT_POISON_THRESHOLD,
    LeaseRescuer,
    Repaired,
    RescuerConfig,
    RescueResult,
    TransitionHook,
)
from .retention import DEFAULT_SIGNATURE_FAILURES, RetentionConfig, RetentionKeeper, RetentionResult
from .service import R, lock_id, run_locked, run_session_locked
from .sweeps import Sweep, SweepConfig, SweepResult, SweepRunner, sweep_lock_id
from .waker import DEFAULT_PENDING_TTL, PendingWaker, WakerConfig, WakeResult

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_PENDING_TTL",
    "DEFAULT_POISON_THRESHOLD",
    "DEFAULT_SIGNATURE_FAILURE_RETENTION",
    "DEFAULT_TICK",
    "RECONCILER_LOCK_ID",
    "KindPolicy",
    "ReconcileResult",
    "Reconciler",
    "ReconcilerConfig",
    "Repaired",
    "Sweep",
    "TransitionHook",
    "service_lock_id",
    "sweep_lock_id",
]

DEFAULT_TICK = 15.0
DEFAULT_SIGNATURE_FAILURE_RETENTION = DEFAULT_SIGNATURE_FAILURES
# Fixed, arbitrary: the lease rescuer's lock, the one a whole pass took before the services were split
# (so a process of the previous version and one of this version never rescue at once).
RECONCILER_LOCK_ID = 0x6566_6765_7265_636F  # "efgereco"


def service_lock_id(service: str) -> int:
    """The advisory lock a maintenance service runs under."""
    if service == LeaseRescuer.name:
        return RECONCILER_LOCK_ID
    return lock_id("effectgate.maintenance", service)


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """Per-kind overrides of the reconciler's settings; ``None`` keeps the reconciler's own."""

    pending_ttl: float | None = None
    poison_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    """How often the services run, and their settings: pending TTL, poison threshold, batch size,
    retention windows (``retention``; ``signature_failure_retention`` is its older spelling)."""

    tick: float = DEFAULT_TICK
    pending_ttl: float = DEFAULT_PENDING_TTL
    poison_threshold: int = DEFAULT_POISON_THRESHOLD
    batch: int = DEFAULT_BATCH
    # How long failed-verification counters are kept: they are bounded per minute, this bounds them in time.
    signature_failure_retention: float = DEFAULT_SIGNATURE_FAILURE_RETENTION
    # Each service's own config; None builds it from the flat fields above (the older spelling).
    rescuer: RescuerConfig | None = None
    waker: WakerConfig | None = None
    retention: RetentionConfig | None = None
    partitions: PartitionConfig = field(default_factory=PartitionConfig)
    sweeps: SweepConfig = field(default_factory=SweepConfig)

    def __post_init__(self) -> None:
        if not self.tick > 0:
            raise ValueError("reconciler tick must be > 0 seconds")
        # Each service validates its own settings; building them here reports a mistake at start.
        self.rescuer_config()
        self.waker_config()
        self.retention_config()

    def rescuer_config(self) -> RescuerConfig:
        """The lease rescuer's settings."""
        if self.rescuer is not None:
            return self.rescuer
        return RescuerConfig(batch=self.batch, poison_threshold=self.poison_threshold)

    def waker_config(self) -> WakerConfig:
        """The pending waker's settings."""
        if self.waker is not None:
            return self.waker
        return WakerConfig(pending_ttl=self.pending_ttl, batch=self.batch)

    def retention_config(self) -> RetentionConfig:
        """The retention keeper's settings."""
        if self.retention is not None:
            return self.retention
        return RetentionConfig(signature_failures=self.signature_failure_retention, batch=self.batch)


@dataclass(slots=True)
class ReconcileResult:
    """What one pass did, per service; ``owned`` is false when another process held the lease rescue."""

    owned: bool = True
    rescue: RescueResult = field(default_factory=RescueResult)
    wake: WakeResult = field(default_factory=WakeResult)
    partitions: PartitionResult = field(default_factory=PartitionResult)
    retention: RetentionResult = field(default_factory=RetentionResult)
    sweep: SweepResult = field(default_factory=SweepResult)
    # Services another process ran this tick, and services that threw (name → error).
    skipped: list[str] = field(default_factory=list)
    service_errors: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What the pass did, as JSON values: what ``effectgate reconcile`` prints and the worker logs."""
        return {
            "redriven": self.redriven,
            "parked": self.parked,
            "cancelled": self.cancelled,
            "woken": self.woken,
            "sweeps": self.sweep_acted,
            "sweep_errors": self.sweep_errors,
            "partitions_created": self.partitions.created,
            "partitions_dropped": self.partitions.dropped,
            "purged": {what: n for what, n in self.retention.purged.items() if n},
            "skipped": self.skipped,
            "service_errors": self.service_errors,
        }

    @property
    def redriven(self) -> list[int]:
        """Jobs re-queued after their lease expired."""
        return self.rescue.redriven

    @property
    def parked(self) -> list[int]:
        """Jobs parked after their lease expired (orphan policy park, or poison)."""
        return self.rescue.parked

    @property
    def cancelled(self) -> list[int]:
        """Jobs whose asked-for cancel the rescuer completed."""
        return self.rescue.cancelled

    @property
    def repaired(self) -> list[Repaired]:
        """Every job this pass took off ``running``, with its kind (what metrics count reclaims by)."""
        return self.rescue.repaired

    @property
    def hook_errors(self) -> dict[int, str]:
        """Transition hooks that threw, by job id (the transition stood)."""
        return self.rescue.hook_errors

    @property
    def woken(self) -> int:
        """Due jobs woken again."""
        return self.wake.woken

    @property
    def expired_signature_failures(self) -> int:
        """Failed-verification counters forgotten."""
        return self.retention.purged.get("signature_failures", 0)

    @property
    def sweep_acted(self) -> dict[str, int]:
        """Per sweep, how many things it acted on."""
        return self.sweep.acted

    @property
    def sweep_errors(self) -> dict[str, str]:
        """Per sweep that threw, its error."""
        return self.sweep.errors

    @property
    def sweeps_skipped(self) -> list[str]:
        """Sweeps another process was running."""
        return self.sweep.skipped

    @property
    def errors(self) -> int:
        """How many things in this pass threw: services, sweeps, transition hooks."""
        return len(self.service_errors) + len(self.sweep.errors) + len(self.rescue.hook_errors)

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return bool(self.service_errors) or any(
            r.changed for r in (self.rescue, self.wake, self.partitions, self.retention, self.sweep)
        )


class Reconciler:
    """Runs the maintenance services in order, each under its own advisory lock.

    ``kinds`` gives per-kind pending TTL and poison threshold; ``on_transition`` runs in the same
    transaction as each terminal transition the lease rescuer makes (parked, cancelled). ``topology`` is the
    ledger's (its handle's): on a distributed one the rescuer, the waker and retention go tenant by tenant.
    """

    def __init__(
        self,
        config: ReconcilerConfig | None = None,
        sweeps: Mapping[str, Sweep] | None = None,
        *,
        kinds: Mapping[str, KindPolicy] | None = None,
        on_transition: TransitionHook | None = None,
        topology: Topology = SINGLE_NODE,
    ) -> None:
        self.config = config or ReconcilerConfig()
        self.sweeps = dict(sweeps or {})
        self.kinds = dict(kinds or {})
        self.on_transition = on_transition
        self.rescuer = LeaseRescuer(
            self.config.rescuer_config(),
            poison_thresholds={
                k: p.poison_threshold for k, p in self.kinds.items() if p.poison_threshold is not None
            },
            on_transition=on_transition,
            topology=topology,
        )
        self.waker = PendingWaker(
            self.config.waker_config(),
            pending_ttls={k: p.pending_ttl for k, p in self.kinds.items() if p.pending_ttl is not None},
            topology=topology,
        )
        self.keeper = RetentionKeeper(self.config.retention_config(), topology=topology)
        self.partitioner = PartitionKeeper(self.config.partitions, self.config.retention_config())
        self.sweeper = SweepRunner(self.sweeps, self.config.sweeps)

    def poison_threshold(self, kind: str) -> int:
        """The poison threshold that applies to ``kind``."""
        return self.rescuer.poison_thresholds.get(kind, self.rescuer.config.poison_threshold)

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> ReconcileResult:
        """One pass: each service that this process can own, in order, each committed on its own."""
        result = ReconcileResult()
        rescued = await self._service(
            conn, LeaseRescuer.name, lambda: self.rescuer.run_once(conn, now=now), result
        )
        result.owned = rescued is not None
        if rescued is not None:
            result.rescue = rescued
        woken = await self._service(
            conn, PendingWaker.name, lambda: self.waker.run_once(conn, now=now), result
        )
        if woken is not None:
            result.wake = woken
        # Partitions first: what a dropped partition held is not deleted row by row afterwards.
        parted = await self._service(
            conn,
            PartitionKeeper.name,
            lambda: self.partitioner.run_once(conn, now=now),
            result,
            session=True,
        )
        if parted is not None:
            result.partitions = parted
        # Retention commits batch by batch (its row locks never outlive one batch), so its lock is the
        # session's, as the partition keeper's.
        kept = await self._service(
            conn, RetentionKeeper.name, lambda: self.keeper.run_once(conn, now=now), result, session=True
        )
        if kept is not None:
            result.retention = kept
        # Sweeps run after the job repairs have committed; each takes its own lock (sweeps.SweepRunner).
        result.sweep = await self.sweeper.run_once(conn, now=now)
        return result

    @staticmethod
    async def _service(
        conn: Conn,
        name: str,
        run: Callable[[], Awaitable[R]],
        result: ReconcileResult,
        *,
        session: bool = False,
    ) -> R | None:
        locked = run_session_locked if session else run_locked
        try:
            owned, value = await locked(conn, service_lock_id(name), run)
        except Exception as exc:
            result.service_errors[name] = f"{type(exc).__name__}: {exc}"
            return None
        if not owned:
            result.skipped.append(name)
        return value
