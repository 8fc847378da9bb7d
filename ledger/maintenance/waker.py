"""Pending waker: due jobs that waited longer than their kind's ``pending_ttl`` get a fresh wake-up.

A NOTIFY is best effort — a worker's LISTEN connection may have been down when it was sent — so a job
due for longer than its TTL is woken again (a NOTIFY per kind, and ``updated_at`` marks the wake-up, so a
job nobody can run is woken once per TTL, not on every tick).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..cluster import shards
from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..queries import Q

DEFAULT_PENDING_TTL = 900.0
DEFAULT_BATCH = 1000


@dataclass(frozen=True, slots=True)
class WakerConfig:
    """How long a due job may wait before it is woken again, and how many one pass wakes."""

    pending_ttl: float = DEFAULT_PENDING_TTL
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if not self.pending_ttl > 0:
            raise ValueError("pending_ttl must be > 0 seconds")
        if self.batch < 1:
            raise ValueError("pending waker batch must be >= 1")


@dataclass(slots=True)
class WakeResult:
    """How many due jobs one pass woke."""

    woken: int = 0

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return self.woken > 0


class PendingWaker:
    """Stale pending jobs → woken again; ``pending_ttls`` overrides the TTL per kind."""

    name = "pending_waker"

    def __init__(
        self,
        config: WakerConfig | None = None,
        *,
        pending_ttls: Mapping[str, float] | None = None,
        topology: Topology = SINGLE_NODE,
    ):
        self.config = config or WakerConfig()
        self.pending_ttls = dict(pending_ttls or {})
        self.topology = topology

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> WakeResult:
        """One pass: wake up to ``batch`` stale due jobs.

        On a ledger distributed by tenant (Citus, ``topology.distributed``), as the lease rescuer: the
        tenants with jobs pending past the shortest TTL are read first (shard by shard: a worker node that cannot be
        reached is skipped and logged, ``shards``), then each is woken by the statement
        restricted to it, and the wake-ups are sent from this session."""
        if not self.topology.distributed:
            row = await self._wake(conn, now, self.config.batch, None)
            return WakeResult(int(row["woken"]) if row else 0)
        shortest = min([self.config.pending_ttl, *self.pending_ttls.values()])
        found = await shards.tenants_on_live_nodes(
            conn,
            "job_tenants_stale_pending_on_shard",
            table="jobs",
            params={"pending_ttl": shortest},
            limit=self.config.batch,
            now=now,
        )
        shards.log_skipped(self.name, found.skipped)
        woken, kinds = 0, set[str]()
        for tenant in found.tenants:
            if woken >= self.config.batch:
                break
            row = await self._wake(conn, now, self.config.batch - woken, tenant)
            if row:
                woken += int(row["woken"])
                kinds.update(row["kinds"])
        if kinds:
            await conn.execute(Q["jobs_notify"], {"kinds": sorted(kinds)})
        return WakeResult(woken)

    async def _wake(self, conn: Conn, now: datetime | None, limit: int, tenant: str | None) -> Any:
        return await (
            await conn.execute(
                Q["job_wake_stale_pending"],
                {
                    "now": now,
                    "kinds": list(self.pending_ttls),
                    "pending_ttls": list(self.pending_ttls.values()),
                    "pending_ttl": self.config.pending_ttl,
                    "limit": limit,
                    "tenant": tenant,
                },
            )
        ).fetchone()
