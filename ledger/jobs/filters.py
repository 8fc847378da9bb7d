"""Bulk recovery and kind pauses: which jobs a filter matches, and the kinds not to lease.

The bulk actions themselves (redrive, cancel) run job by job through the same fenced statements as the
single-job actions (``effectgate.handlers.actions.bulk``), so each job gets exactly the refusal it would get alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..db import Conn
from ..queries import Q
from . import audit

DEFAULT_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a bulk action takes; ``None`` matches anything. ``since`` is compared with the time the
    job finished, or (not finished) was created."""

    states: tuple[str, ...] | None = None
    kind: str | None = None
    source: str | None = None
    since: datetime | None = None
    limit: int = DEFAULT_LIMIT

    @property
    def empty(self) -> bool:
        """Whether the filter would match every job (refused by the callers: a bulk action needs a filter)."""
        return self.states is None and self.kind is None and self.source is None and self.since is None


async def match(conn: Conn, where: JobFilter) -> list[int]:
    """The ids of the jobs ``where`` matches, oldest first, at most ``where.limit``."""
    rows = await (
        await conn.execute(
            Q["jobs_match_filter"],
            {
                "states": list(where.states) if where.states is not None else None,
                "kind": where.kind,
                "source": where.source,
                "since": where.since,
                "limit": where.limit,
            },
        )
    ).fetchall()
    return [int(r["id"]) for r in rows]


async def pause(
    conn: Conn, kind: str, *, by: str, reason: str | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """Stop leasing ``kind``'s jobs until ``resume``; pausing a paused kind updates who and why. Recorded
    (``audit``) in the kind's log, which the timelines of its jobs show."""
    async with conn.transaction():
        row = await (
            await conn.execute(Q["kind_pause"], {"kind": kind, "by": by, "reason": reason, "now": now})
        ).fetchone()
        assert row is not None
        await audit.record(conn, "pause", by=by, reason=reason, kind=kind, now=now)
    return row


async def resume(
    conn: Conn, kind: str, *, by: str, reason: str | None = None, now: datetime | None = None
) -> bool:
    """Lease ``kind``'s jobs again (and wake the workers); ``False`` if it was not paused. Recorded as
    ``pause`` is."""
    async with conn.transaction():
        row = await (await conn.execute(Q["kind_resume"], {"kind": kind})).fetchone()
        if row is not None:
            await audit.record(conn, "resume", by=by, reason=reason, kind=kind, now=now)
    return row is not None


async def paused(conn: Conn) -> list[dict[str, Any]]:
    """Every paused kind: who paused it, when, why, and how many of its jobs wait pending."""
    return await (await conn.execute(Q["kinds_paused"])).fetchall()


async def unmatched_for_replay(
    conn: Conn, *, source: str, since: datetime, until: datetime | None = None, limit: int = DEFAULT_LIMIT
) -> list[dict[str, Any]]:
    """Unmatched deliveries of ``source`` received in [since, until) that still keep their payload."""
    return await (
        await conn.execute(
            Q["deliveries_unmatched_for_replay"],
            {"source": source, "since": since, "until": until, "limit": limit},
        )
    ).fetchall()
