"""Partition keeper: time partitions of the history tables, made ahead of time and dropped when expired.

``deliveries``, ``effect_rejects`` and ``signature_failures`` are partitioned by range of arrival time
(migration 0008). Each pass, for each of them, the keeper makes the partitions covering now up to
``premake`` intervals ahead (so an insert never waits for DDL), and drops every partition whose whole range
is older than the table's retention window — ``DROP TABLE``, not ``DELETE``: no dead rows, no vacuum. A row is
therefore kept between its window and its window plus one ``interval``. Rows no time partition covers (the
legacy partition of the rows from before the upgrade, the DEFAULT partition) are deleted a batch at a time
by the retention keeper, which leaves time partitions alone.

Partition DDL takes the parent table exclusively for a moment: each partition is made or dropped in its own
short transaction under a ``lock_timeout``, and one whose lock is not granted in time waits for the next tick
rather than queue every claim behind it. The scheduler runs this service under a session-level advisory lock
(not a transaction-scoped one like the others), which is what lets those transactions commit one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from ..db import Conn
from ..queries import Q
from .retention import RetentionConfig

DEFAULT_INTERVAL = 86400.0
DEFAULT_PREMAKE = 3
DEFAULT_LOCK_TIMEOUT = 2.0
#: The partitioned tables, and which retention window each is kept for.
PARENTS = ("deliveries", "effect_rejects", "signature_failures")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """How wide each partition is (seconds), how many are made ahead, how long DDL may wait for its lock."""

    interval: float = DEFAULT_INTERVAL
    premake: int = DEFAULT_PREMAKE
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT

    def __post_init__(self) -> None:
        # Below a minute, partitions would be made faster than anyone reads them.
        if not self.interval >= 60:
            raise ValueError("partition interval must be >= 60 seconds")
        if self.premake < 1:
            raise ValueError("partition premake must be >= 1")
        if not self.lock_timeout > 0:
            raise ValueError("partition lock_timeout must be > 0 seconds")


@dataclass(slots=True)
class PartitionResult:
    """Partitions one pass made and dropped (name → rows that went with it)."""

    created: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    # Partitions left for the next pass because their table's lock was not granted within lock_timeout.
    waited: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the pass made or dropped anything."""
        return bool(self.created or self.dropped or self.waited)


def window_for(parent: str, retention: RetentionConfig) -> float:
    """How long ``parent``'s rows are kept."""
    return retention.signature_failures if parent == "signature_failures" else retention.history


def floor_to(when: datetime, interval: float) -> datetime:
    """``when`` rounded down to a multiple of ``interval`` seconds since the Unix epoch (UTC)."""
    seconds = (when - EPOCH).total_seconds()
    return EPOCH + timedelta(seconds=seconds - seconds % interval)


class PartitionKeeper:
    """Makes the history tables' partitions ahead of time and drops the expired ones."""

    name = "partitions"

    def __init__(
        self, config: PartitionConfig | None = None, retention: RetentionConfig | None = None
    ) -> None:
        self.config = config or PartitionConfig()
        self.retention = retention or RetentionConfig()

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> PartitionResult:
        """One pass over every partitioned table: drop what expired, then make what is missing ahead.

        Each partition is made or dropped in a transaction of its own, so the pass never holds two tables'
        exclusive locks at once: holding the deliveries parent while waiting for effect_rejects (which a
        claim or a retention pass may hold while waiting for deliveries) would be a deadlock. A partition
        whose lock is not granted within ``lock_timeout`` is left for the next pass.
        """
        result = PartitionResult()
        clock = now or await self._now(conn)
        known = await (await conn.execute(Q["history_partitions_list"])).fetchall()
        for parent in PARENTS:
            mine = [p for p in known if p["parent"] == parent]
            cutoff = clock - timedelta(seconds=window_for(parent, self.retention))
            for partition in mine:
                if partition["range_to"] <= cutoff:
                    await self._drop(conn, parent, partition["name"], now, result)
            # Ahead from the current interval (or the last partition's end, if later); never backwards into
            # the past, where DEFAULT and the row deletes already cover whatever arrives late.
            start = floor_to(clock, self.config.interval)
            ends = [p["range_to"] for p in mine if p["range_to"] > start]
            if ends:
                start = max(ends)
            horizon = clock + timedelta(seconds=self.config.interval * self.config.premake)
            while start < horizon:
                end = start + timedelta(seconds=self.config.interval)
                if not await self._create(conn, parent, start, end, result):
                    break  # the next ones must not leave a gap before this one: next pass
                start = end
        return result

    async def _locked(self, conn: Conn) -> None:
        await conn.execute(
            Q["maintenance_lock_timeout_set"], {"lock_timeout": f"{int(self.config.lock_timeout * 1000)}ms"}
        )

    async def _create(
        self, conn: Conn, parent: str, start: datetime, end: datetime, result: PartitionResult
    ) -> bool:
        try:
            async with conn.transaction():
                await self._locked(conn)
                row = await (
                    await conn.execute(
                        Q["history_partition_create_for_range"],
                        {"parent": parent, "range_from": start, "range_to": end},
                    )
                ).fetchone()
        except psycopg.errors.LockNotAvailable:
            result.waited.append(f"{parent}@{start.isoformat()}")
            return False
        if row is not None:
            result.created.append(row["name"])
        return True

    async def _drop(
        self, conn: Conn, parent: str, name: str, now: datetime | None, result: PartitionResult
    ) -> None:
        try:
            async with conn.transaction():
                await self._locked(conn)
                row = await (
                    await conn.execute(Q["history_partition_drop_registered"], {"name": name})
                ).fetchone()
                rows = int(row["rows"]) if row else 0
                # Counted with the drop, in its transaction: the counters never miss or double a partition.
                await conn.execute(
                    Q["retention_purges_count"], {"now": now, "whats": [parent], "counts": [rows]}
                )
        except psycopg.errors.LockNotAvailable:
            result.waited.append(name)
            return
        result.dropped[name] = rows

    @staticmethod
    async def _now(conn: Conn) -> datetime:
        row = await (await conn.execute(Q["maintenance_clock"])).fetchone()
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]
