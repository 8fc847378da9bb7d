"""What this gateway process recently told providers it kept, and which of it a failover lost (issue 42).

With asynchronous replication a promoted standby may lack the last commits of the old primary, and claims the
gateway already answered 2xx for are then gone: the provider will not send them again (Stripe retries only
what was not answered 2xx). Nothing in the new primary can tell; only the process that answered knows. So
each process keeps the (tenant, effect key) of its last ``DEFAULT_SIZE`` acknowledged claims (accepted or
duplicate) in memory, and when its connections reach another timeline (``ledger.timeline``) it asks the new
primary which of them it lacks: each is logged (``ledger.acknowledged_lost``, with the source and event id an
operator asks the provider to re-send) and counted (``effectgate_acknowledged_lost_total``, which an alert
watches). A claim the provider re-sent in between is on the new primary and is not counted: it was recovered.

Memory, not a table: the old primary's table is what was lost. A process that dies or restarts across the
failover forgets what it acknowledged; the alert on the timeline change still fires (deploy/README.md,
"Failover").
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, ClaimOutcome, Delivery, Duplicate, effects_missing
from effectgate.ledger.timeline import TimelineChange

log = logging.getLogger("effectgate.ingress")

# About 10 s of acknowledgements at this machine's 5,000 a second per process, minutes at a production rate: an
# asynchronous standby is typically under a second behind. One that is further behind loses more than the check
# can name (the log line says how many it checked). About 250 bytes an entry, so about 12 MB at most.
DEFAULT_SIZE = 50_000
# How many lost claims one log line names; the count is always whole.
NAMED_AT_MOST = 1_000


class Acknowledgement(NamedTuple):
    tenant: str
    effect_key: str
    source: str
    event_id: str


@dataclass(frozen=True, slots=True)
class Gap:
    """What a gap check found: how many recent acknowledgements it checked, and those the ledger lacks."""

    checked: int
    lost: list[Acknowledgement]


class Acknowledged:
    """The claims this process answered 2xx for, newest last, at most ``size`` of them."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError(f"expected a size of at least 1, got {size}")
        self._recent: deque[Acknowledgement] = deque(maxlen=size)

    def record(self, planned: Sequence[Delivery], outcomes: Sequence[Sequence[ClaimOutcome]]) -> None:
        """Note the claims of an answered delivery that the answer said are kept."""
        for delivery, per_event in zip(planned, outcomes, strict=True):
            for outcome in per_event:
                if isinstance(outcome, Accepted | Duplicate):
                    self._recent.append(
                        Acknowledgement(
                            delivery.tenant, outcome.effect_key, delivery.source, delivery.event_id
                        )
                    )

    def snapshot(self) -> list[Acknowledgement]:
        """Everything acknowledged until now, oldest first (a copy: answers go on while it is checked)."""
        return list(self._recent)


async def find_gap(pool: db.Pool, acknowledged: Sequence[Acknowledgement]) -> Gap:
    """Which of ``acknowledged`` the ledger behind ``pool`` has no effect for."""
    unique = list(dict.fromkeys(acknowledged))
    async with db.connection(pool) as conn:
        missing = await effects_missing(conn, [(a.tenant, a.effect_key) for a in unique])
    return Gap(len(unique), [a for a in unique if (a.tenant, a.effect_key) in missing])


class GapCheck:
    """Runs ``find_gap`` once per timeline change, in the background, and reports what it found."""

    def __init__(self, pool: db.Pool, acknowledged: Acknowledged, *, on_lost: Callable[[int], None]) -> None:
        self.pool = pool
        self.acknowledged = acknowledged
        self.on_lost = on_lost
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, change: TimelineChange) -> None:
        # Called from a pool's check, inside a checkout: the query needs a connection of its own, later.
        task = asyncio.get_running_loop().create_task(self._check(change, self.acknowledged.snapshot()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, change: TimelineChange, acknowledged: list[Acknowledgement]) -> None:
        try:
            gap = await db.retry_while_unavailable(lambda: find_gap(self.pool, acknowledged), within=60.0)
        except Exception as exc:
            log.error(
                "ledger.gap_check_failed",
                extra={
                    "timeline_after": change.after,
                    "acknowledged": len(acknowledged),
                    "error": f"{type(exc).__name__}: {exc}",
                },
            )
            return
        extra = {"timeline_before": change.before, "timeline_after": change.after, "checked": gap.checked}
        if not gap.lost:
            log.warning("ledger.acknowledged_intact", extra=extra)
            return
        self.on_lost(len(gap.lost))
        log.error(
            "ledger.acknowledged_lost",
            extra={
                **extra,
                "lost": len(gap.lost),
                "named": [a._asdict() for a in gap.lost[:NAMED_AT_MOST]],
                "meaning": "answered 2xx before the failover, missing from the new primary: ask each source to "
                "re-send these events (the claim takes them as new)",
            },
        )

    async def close(self) -> None:
        """Let a check in progress finish (a gateway stopping right after a failover still reports)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
