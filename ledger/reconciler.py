"""The reconciler: repairs jobs whose workers are gone. Any process may run it; one owns each pass.

Shape of every maintenance service here: a config with defaults validated at construction,
``run_once() -> Result`` with counts, and a loop (in the worker runtime) that logs non-zero results
and carries on after errors.

A pass, in order: expired leases → re-queued (orphan policy ``redrive``), parked (``park``), parked as
poison (orphaned N times in a row without a commit) or cancelled (a cancel was asked); stale pending
jobs → woken again; then every sweep. Job repairs commit together under a transaction-scoped advisory
lock, so of several processes ticking at once one does them; each repair is also guarded in its own
WHERE clause, so even a second pass on the same rows finds nothing left to do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .db import Conn
from .queries import Q
from .vocabulary import JobState

DEFAULT_TICK = 15.0
DEFAULT_PENDING_TTL = 900.0
DEFAULT_POISON_THRESHOLD = 3
DEFAULT_BATCH = 1000
DEFAULT_SIGNATURE_FAILURE_RETENTION = 30 * 24 * 3600.0
# Fixed, arbitrary: the advisory lock that makes one process the owner of a pass.
RECONCILER_LOCK_ID = 0x6566_6765_7265_636F  # "efgereco"

Sweep = Callable[[Conn], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """Per-kind overrides of the reconciler's settings; ``None`` keeps the reconciler's own."""

    pending_ttl: float | None = None
    poison_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class Repaired:
    """A job the reconciler took off ``running``: what it became and why (the transition hook sees this)."""

    job_id: int
    kind: str
    effect_key: str
    state: JobState
    reason: str | None


TransitionHook = Callable[[Conn, Repaired], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    """How the reconciler repairs: tick, pending TTL, poison threshold, batch size."""

    tick: float = DEFAULT_TICK
    pending_ttl: float = DEFAULT_PENDING_TTL
    poison_threshold: int = DEFAULT_POISON_THRESHOLD
    batch: int = DEFAULT_BATCH
    # How long failed-verification counters are kept: they are bounded per minute, this bounds them in time.
    signature_failure_retention: float = DEFAULT_SIGNATURE_FAILURE_RETENTION

    def __post_init__(self) -> None:
        if not self.tick > 0:
            raise ValueError("reconciler tick must be > 0 seconds")
        if not self.pending_ttl > 0:
            raise ValueError("pending_ttl must be > 0 seconds")
        if self.poison_threshold < 1:
            raise ValueError("poison_threshold must be >= 1")
        if self.batch < 1:
            raise ValueError("reconciler batch must be >= 1")
        if not self.signature_failure_retention > 0:
            raise ValueError("signature_failure_retention must be > 0 seconds")


@dataclass(slots=True)
class ReconcileResult:
    """What one pass repaired; ``owned`` is false when another process held the pass."""

    owned: bool = True
    redriven: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    woken: int = 0
    expired_signature_failures: int = 0
    sweep_acted: dict[str, int] = field(default_factory=dict)
    sweep_errors: dict[str, str] = field(default_factory=dict)
    sweeps_skipped: list[str] = field(default_factory=list)
    hook_errors: dict[int, str] = field(default_factory=dict)
    # Every job this pass took off ``running``, with its kind (what metrics count reclaims by); kept out of
    # the repr, which the reconciler loop logs and which the id lists above already tell.
    repaired: list[Repaired] = field(default_factory=list, repr=False)

    @property
    def errors(self) -> int:
        """How many things in this pass threw: one per failing sweep, one per failing transition hook."""
        return len(self.sweep_errors) + len(self.hook_errors)

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return bool(
            self.redriven
            or self.parked
            or self.cancelled
            or self.woken
            or self.expired_signature_failures
            or self.errors
        ) or any(self.sweep_acted.values())


def sweep_lock_id(sweep_id: str) -> int:
    """The advisory lock one sweep runs under: stable across processes and versions, signed 64-bit."""
    digest = hashlib.sha256(f"effectgate.sweep:{sweep_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Reconciler:
    """Expired leases → redrive or park (by orphan policy), poison → park, stale pending → wake, sweeps.

    ``kinds`` gives per-kind pending TTL and poison threshold; ``on_transition`` runs in the same
    transaction as each terminal transition the reconciler makes (parked, cancelled).
    """

    def __init__(
        self,
        config: ReconcilerConfig | None = None,
        sweeps: Mapping[str, Sweep] | None = None,
        *,
        kinds: Mapping[str, KindPolicy] | None = None,
        on_transition: TransitionHook | None = None,
    ) -> None:
        self.config = config or ReconcilerConfig()
        self.sweeps = dict(sweeps or {})
        self.kinds = dict(kinds or {})
        self.on_transition = on_transition

    def poison_threshold(self, kind: str) -> int:
        """The poison threshold that applies to ``kind``."""
        policy = self.kinds.get(kind)
        if policy is not None and policy.poison_threshold is not None:
            return policy.poison_threshold
        return self.config.poison_threshold

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
            expired = await (
                await conn.execute(Q["job_expired_leases_lock"], {"now": now, "limit": self.config.batch})
            ).fetchall()
            for job in expired:
                await self._rescue(conn, job["id"], job["kind"], now, result)
            pending_ttls = {
                kind: policy.pending_ttl
                for kind, policy in self.kinds.items()
                if policy.pending_ttl is not None
            }
            woken = await (
                await conn.execute(
                    Q["job_wake_stale_pending"],
                    {
                        "now": now,
                        "kinds": list(pending_ttls),
                        "pending_ttls": list(pending_ttls.values()),
                        "pending_ttl": self.config.pending_ttl,
                        "limit": self.config.batch,
                    },
                )
            ).fetchone()
            result.woken = int(woken["woken"]) if woken else 0
            deleted = await conn.execute(
                Q["signature_failures_delete_expired"],
                {
                    "now": now,
                    "retention": self.config.signature_failure_retention,
                    "limit": self.config.batch,
                },
            )
            result.expired_signature_failures = deleted.rowcount
        # Sweeps run after the job repairs have committed, each in a transaction of its own under a lock of
        # its own: one that throws counts as one error and stops nothing else, and two processes never run
        # the same sweep at once.
        for name, sweep in self.sweeps.items():
            try:
                async with conn.transaction():
                    lock = await (
                        await conn.execute(Q["reconciler_tick_lock"], {"lock_id": sweep_lock_id(name)})
                    ).fetchone()
                    if lock is None or not lock["owned"]:
                        result.sweeps_skipped.append(name)
                        continue
                    result.sweep_acted[name] = await sweep(conn)
            except Exception as exc:
                result.sweep_errors[name] = f"{type(exc).__name__}: {exc}"
        return result

    async def _rescue(
        self, conn: Conn, job_id: int, kind: str, now: datetime | None, result: ReconcileResult
    ) -> None:
        params = {"job_id": job_id, "now": now, "poison_threshold": self.poison_threshold(kind)}
        repaired: Repaired | None = None
        try:
            # A savepoint per job: the kind's hook commits with the transition or neither does.
            async with conn.transaction():
                repaired = await self._rescue_one(conn, params)
                if (
                    repaired is not None
                    and repaired.state != JobState.PENDING
                    and self.on_transition is not None
                ):
                    await self.on_transition(conn, repaired)
        except Exception as exc:
            if repaired is None:
                raise
            # The hook failed. A job left running forever is worse than a user row that missed its mirror
            # (which a sweep can repair), so the transition is made again without the hook, and reported.
            result.hook_errors[job_id] = f"{type(exc).__name__}: {exc}"
            async with conn.transaction():
                repaired = await self._rescue_one(conn, params)
        if repaired is not None:
            result.repaired.append(repaired)
            {
                JobState.PENDING: result.redriven,
                JobState.PARKED: result.parked,
                JobState.CANCELLED: result.cancelled,
            }[repaired.state].append(repaired.job_id)

    async def _rescue_one(self, conn: Conn, params: Mapping[str, object]) -> Repaired | None:
        row = await (await conn.execute(Q["job_rescue_if_expired"], params)).fetchone()
        if row is None:
            return None
        return Repaired(
            row["id"], row["kind"], row["effect_key"], JobState(row["state"]), row["terminal_reason"]
        )
