"""Which server timeline this process's connections reach, and what a change of it means (issue 42).

A promoted standby starts a new timeline: the WAL timeline id in every file name it writes goes up by one. A
process that sees a higher (or merely another) timeline than before has lived through a failover or a
point-in-time restore, and anything the old primary committed that had not reached the new one is gone. With
synchronous replication nothing acknowledged is; with asynchronous replication the last few hundred
milliseconds of commits may be (deploy/README.md, "Failover").

The pool's check (``db._check_writable``) already runs one statement before it hands a connection out; that
statement also reads the timeline, so watching costs no round trip. ``WATCH`` is per process, like a logger:
every pool of the process feeds it, and the first reading is a baseline, not a change (a process started
after a failover cannot tell). Listeners run on the event loop of the checkout that saw the change, and must
not block: the gateway's counts the change and schedules its gap check (``gateway.ingress.acknowledged``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .listeners import Listeners

log = logging.getLogger("effectgate.ledger")


@dataclass(frozen=True, slots=True)
class TimelineChange:
    """The server's timeline went from ``before`` to ``after`` between two checkouts of this process."""

    before: int
    after: int


Listener = Callable[[TimelineChange], None]


class TimelineWatch:
    """The last timeline this process's connections reached; tells its listeners when it changes."""

    def __init__(self) -> None:
        self.timeline: int | None = None
        self._listeners: Listeners[[TimelineChange]] = Listeners("ledger.timeline")

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` on every change from now on; returns the function that stops it."""
        return self._listeners.listen(listener)

    def observe(self, timeline: int | None) -> TimelineChange | None:
        """Record the timeline a connection reached (None: not known, e.g. a standby); the change, if any."""
        if timeline is None or timeline == self.timeline:
            return None
        before, self.timeline = self.timeline, timeline
        if before is None:
            return None
        change = TimelineChange(before, timeline)
        log.warning(
            "ledger.timeline_changed",
            extra={
                "timeline_before": before,
                "timeline_after": timeline,
                "meaning": "the database failed over or was restored; commits the old primary had not "
                "replicated are gone (none with synchronous replication)",
            },
        )
        # One listener's bug must not fail the checkout that saw the change.
        self._listeners.tell(change)
        return change


#: This process's watch; every pool made by ``db.make_pool`` feeds it.
WATCH = TimelineWatch()
