"""Retention keeper: what the ledger forgets, and when.

Part one of its work: failed-verification counters, bounded per minute by their key, are bounded in
time here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .db import Conn
from .queries import Q

DAY = 86400.0
DEFAULT_SIGNATURE_FAILURES = 30 * DAY
DEFAULT_BATCH = 1000


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention windows in seconds, and how many rows one statement purges."""

    signature_failures: float = DEFAULT_SIGNATURE_FAILURES
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        if not self.signature_failures > 0:
            raise ValueError("signature_failure_retention must be > 0 seconds")
        if self.batch < 1:
            raise ValueError("retention batch must be >= 1")


@dataclass(slots=True)
class RetentionResult:
    """Rows purged by one pass, per table (or per column purged, ``effects.payload``)."""

    purged: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the pass purged anything."""
        return any(self.purged.values())


class RetentionKeeper:
    """Purges what has outlived its window, a batch per table per pass."""

    name = "retention"

    def __init__(self, config: RetentionConfig | None = None) -> None:
        self.config = config or RetentionConfig()

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> RetentionResult:
        """One pass over every window."""
        result = RetentionResult()
        deleted = await conn.execute(
            Q["signature_failures_delete_expired"],
            {"now": now, "retention": self.config.signature_failures, "limit": self.config.batch},
        )
        result.purged["signature_failures"] = deleted.rowcount
        return result
