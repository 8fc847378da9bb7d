"""Partition keeper: time partitions of the history tables, made ahead of time and dropped when expired.

``deliveries``, ``effect_rejects`` and ``signature_failures`` are partitioned by range of arrival time
(migration 0008). Each pass, for each of them, the keeper makes the partitions covering now up to
``premake`` intervals ahead (so an insert never waits for DDL), and drops every partition whose whole range
is older than the table's retention window — ``DROP TABLE``, not ``DELETE``: no dead rows, no vacuum. A row is
therefore kept between its window and its window plus one ``interval``. Rows no time partition covers (the
legacy partition of the rows from before the upgrade, the DEFAULT partition) are deleted a batch at a time
by the retention keeper, which leaves time partitions alone.

Partition DDL takes the parent table exclusively for a moment; the pass sets a ``lock_timeout`` and, if it
cannot get the lock, gives up until the next tick rather than queue every claim behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from .db import Conn
from .queries import Q
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

    @property
    def changed(self) -> bool:
        """Whether the pass made or dropped anything."""
        return bool(self.created or self.dropped)


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
        """One pass over every partitioned table: drop what expired, then make what is missing ahead."""
        result = PartitionResult()
        async with conn.transaction():
            clock = now or await self._now(conn)
            await conn.execute(
                Q["maintenance_lock_timeout_set"],
                {"lock_timeout": f"{int(self.config.lock_timeout * 1000)}ms"},
            )
            known = await (await conn.execute(Q["history_partitions_list"])).fetchall()
            counts: dict[str, int] = {}
            for parent in PARENTS:
                mine = [p for p in known if p["parent"] == parent]
                cutoff = clock - timedelta(seconds=window_for(parent, self.retention))
                for partition in mine:
                    if partition["range_to"] <= cutoff:
                        row = await (
                            await conn.execute(
                                Q["history_partition_drop_registered"], {"name": partition["name"]}
                            )
                        ).fetchone()
                        rows = int(row["rows"]) if row else 0
                        result.dropped[partition["name"]] = rows
                        counts[parent] = counts.get(parent, 0) + rows
                # Ahead from the current interval (or the last partition's end, if later); never backwards
                # into the past, where DEFAULT and the row deletes already cover whatever arrives late.
                start = floor_to(clock, self.config.interval)
                ends = [p["range_to"] for p in mine if p["range_to"] > start]
                if ends:
                    start = max(ends)
                horizon = clock + timedelta(seconds=self.config.interval * self.config.premake)
                while start < horizon:
                    end = start + timedelta(seconds=self.config.interval)
                    row = await (
                        await conn.execute(
                            Q["history_partition_create_for_range"],
                            {"parent": parent, "range_from": start, "range_to": end},
                        )
                    ).fetchone()
                    if row is not None:
                        result.created.append(row["name"])
                    start = end
            if counts:
                await conn.execute(
                    Q["retention_purges_count"],
                    {"now": now, "whats": list(counts), "counts": list(counts.values())},
                )
        return result

    @staticmethod
    async def _now(conn: Conn) -> datetime:
        row = await (await conn.execute(Q["maintenance_clock"])).fetchone()
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]
