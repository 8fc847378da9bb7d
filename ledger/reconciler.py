"""The reconciler: repairs jobs whose workers are gone. Any process may run it; one owns each pass.

Shape of every maintenance service here: a config with defaults validated at construction,
``run_once() -> Result`` with counts, and a loop (in the worker runtime) that logs non-zero results
and carries on after errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from .db import Conn
from .queries import Q

DEFAULT_TICK = 15.0
DEFAULT_PENDING_TTL = 900.0
DEFAULT_POISON_THRESHOLD = 3
DEFAULT_BATCH = 1000
# Fixed, arbitrary: the advisory lock that makes one process the owner of a pass.
RECONCILER_LOCK_ID = 0x6566_6765_7265_636F  # "efgereco"

Sweep = Callable[[Conn], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    """How the reconciler repairs: tick, pending TTL, poison threshold, batch size."""

    tick: float = DEFAULT_TICK
    pending_ttl: float = DEFAULT_PENDING_TTL
    poison_threshold: int = DEFAULT_POISON_THRESHOLD
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if self.tick <= 0:
            raise ValueError("reconciler tick must be > 0 seconds")
        if self.pending_ttl <= 0:
            raise ValueError("pending_ttl must be > 0 seconds")
        if self.poison_threshold < 1:
            raise ValueError("poison_threshold must be >= 1")
        if self.batch < 1:
            raise ValueError("reconciler batch must be >= 1")


@dataclass(slots=True)
class ReconcileResult:
    """What one pass repaired; ``owned`` is false when another process held the pass."""

    owned: bool = True
    redriven: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    woken: int = 0
    sweep_acted: dict[str, int] = field(default_factory=dict)
    sweep_errors: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return bool(self.redriven or self.parked or self.cancelled or self.woken or self.sweep_errors) or any(
            self.sweep_acted.values()
        )


class Reconciler:
    """Expired leases → redrive or park (by orphan policy), poison → park, stale pending → wake, sweeps."""

    def __init__(
        self, config: ReconcilerConfig | None = None, sweeps: dict[str, Sweep] | None = None
    ) -> None:
        self.config = config or ReconcilerConfig()
        self.sweeps = dict(sweeps or {})

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> ReconcileResult:
        """One pass, if this process can own it; job repairs commit together, then each sweep on its own."""
        result = ReconcileResult()
        async with conn.transaction():
            row = await (
                await conn.execute(Q["reconciler_tick_lock"], {"lock_id": RECONCILER_LOCK_ID})
            ).fetchone()
            if row is None or not row["owned"]:
                result.owned = False
                return result
            rows = await (
                await conn.execute(
                    Q["job_rescue_expired_leases"],
                    {
                        "now": now,
                        "poison_threshold": self.config.poison_threshold,
                        "limit": self.config.batch,
                    },
                )
            ).fetchall()
            for r in rows:
                {"pending": result.redriven, "parked": result.parked, "cancelled": result.cancelled}[
                    r["state"]
                ].append(r["id"])
            woken = await (
                await conn.execute(
                    Q["job_wake_stale_pending"], {"now": now, "pending_ttl": self.config.pending_ttl}
                )
            ).fetchone()
            result.woken = int(woken["woken"]) if woken else 0
        for name, sweep in self.sweeps.items():
            # A sweep that throws counts as one error and stops nothing else.
            try:
                async with conn.transaction():
                    result.sweep_acted[name] = await sweep(conn)
            except Exception as exc:
                result.sweep_errors[name] = f"{type(exc).__name__}: {exc}"
        return result
