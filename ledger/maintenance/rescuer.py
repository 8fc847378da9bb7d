"""Lease rescuer: takes jobs whose lease expired off ``running``, many per statement.

A worker that vanished (SIGKILL, a partition, a slice abandoned past its deadline) leaves its job
``running`` with a lease that runs out. One statement (``job_rescue_expired_batch``) takes up to ``batch``
of them by the job-release rule (migration 0006): a cancel that was asked wins, then poison (orphaned
``poison_threshold`` times in a row without a commit) parks, then the kind's orphan policy re-queues or
parks. Each kind may override the poison threshold. A terminal repair (parked, cancelled) runs the kind's
transition hook in the same transaction, under a savepoint: a hook that throws is rolled back and
reported, the repair stands — a job left running forever is worse than a user row that missed its mirror.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..cluster import shards
from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..queries import Q
from ..vocabulary import JobState

DEFAULT_BATCH = 1000
DEFAULT_POISON_THRESHOLD = 3


@dataclass(frozen=True, slots=True)
class Repaired:
    """A job the rescuer took off ``running``: what it became and why (the transition hook sees this)."""

    job_id: int
    kind: str
    effect_key: str
    state: JobState
    reason: str | None


TransitionHook = Callable[[Conn, Repaired], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RescuerConfig:
    """How many expired leases one statement takes, and after how many orphanings a job is poison."""

    batch: int = DEFAULT_BATCH
    poison_threshold: int = DEFAULT_POISON_THRESHOLD

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError("lease rescuer batch must be >= 1")
        if self.poison_threshold < 1:
            raise ValueError("poison_threshold must be >= 1")


@dataclass(slots=True)
class RescueResult:
    """The jobs one pass took off ``running``, by what they became, and the hooks that failed."""

    redriven: list[int] = field(default_factory=list)
    parked: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    hook_errors: dict[int, str] = field(default_factory=dict)
    repaired: list[Repaired] = field(default_factory=list, repr=False)
    # Citus: the worker nodes whose shards could not be read, so their tenants' expired leases wait for the
    # node's return (shards.log_skipped named them).
    unreached: list[shards.Skipped] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return bool(self.repaired or self.hook_errors)


class LeaseRescuer:
    """Expired leases → re-queued, parked, parked as poison, or cancelled; one statement per ``batch``."""

    name = "lease_rescuer"

    def __init__(
        self,
        config: RescuerConfig | None = None,
        *,
        poison_thresholds: Mapping[str, int] | None = None,
        on_transition: TransitionHook | None = None,
        topology: Topology = SINGLE_NODE,
    ) -> None:
        self.config = config or RescuerConfig()
        self.poison_thresholds = dict(poison_thresholds or {})
        self.on_transition = on_transition
        self.topology = topology

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> RescueResult:
        """One batch of rescues, and the hooks of the terminal ones, in the caller's transaction (or one
        of its own on an autocommit connection).

        On a ledger distributed by tenant (Citus, ``topology.distributed``) the statement over every
        tenant is a multi-shard ``FOR UPDATE``, which Citus refuses: the tenants of the earliest expired leases
        are read first (no lock), then each tenant's are rescued by the same statement restricted to it, up to
        ``batch`` in all, and the workers are woken from this session (a routed statement's NOTIFY fires on a
        worker node, where nobody listens)."""
        result = RescueResult()
        if not self.topology.distributed:
            await self._rescue(conn, now, self.config.batch, None, result)
            return result
        found = await shards.tenants_on_live_nodes(
            conn, "job_tenants_expired_on_shard", table="jobs", params={}, limit=self.config.batch, now=now
        )
        shards.log_skipped(self.name, found.skipped)
        result.unreached = found.skipped
        for tenant in found.tenants:
            left = self.config.batch - len(result.repaired)
            if left <= 0:
                break
            await self._rescue(conn, now, left, tenant, result)
        kinds = sorted({r.kind for r in result.repaired if r.state == JobState.PENDING})
        if kinds:
            await conn.execute(Q["jobs_notify"], {"kinds": kinds})
        return result

    async def _rescue(
        self, conn: Conn, now: datetime | None, limit: int, tenant: str | None, result: RescueResult
    ) -> None:
        async with conn.transaction():
            rows = await (
                await conn.execute(
                    Q["job_rescue_expired_batch"],
                    {
                        "now": now,
                        "limit": limit,
                        "poison_threshold": self.config.poison_threshold,
                        "kinds": list(self.poison_thresholds),
                        "poison_thresholds": list(self.poison_thresholds.values()),
                        "tenant": tenant,
                    },
                )
            ).fetchall()
            for row in rows:
                repaired = Repaired(
                    row["id"], row["kind"], row["effect_key"], JobState(row["state"]), row["terminal_reason"]
                )
                if repaired.state != JobState.PENDING and self.on_transition is not None:
                    try:
                        async with conn.transaction():  # a savepoint: the hook's writes or none of them
                            await self.on_transition(conn, repaired)
                    except Exception as exc:
                        result.hook_errors[repaired.job_id] = f"{type(exc).__name__}: {exc}"
                result.repaired.append(repaired)
                {
                    JobState.PENDING: result.redriven,
                    JobState.PARKED: result.parked,
                    JobState.CANCELLED: result.cancelled,
                }[repaired.state].append(repaired.job_id)
