"""Resolved by hand: an operator closes a failed or parked job without running it.

A failed or parked job otherwise stays so until it is redriven, and counts as "waiting for a human" for the
whole history window. ``resolve`` moves it to the terminal state ``resolved`` in one guarded statement,
recording who, why (required) and when, and which state it closed (on the job, and in the operator's record,
``audit``); the failure's own reason and error record stay as they were. A resolved job is never redriven: a human said it was handled outside
effectgate, and running it after that could do the effect twice (docs/adr/0016-resolved-by-hand.md).

Resolving an already resolved job with the same operator and reason answers the resolution that stands
(``already=True``), so a retried command or request is safe; anything else is refused with a code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..db import Conn
from ..errors import InvalidParameter
from ..queries import Q
from ..storable import storable_text
from ..vocabulary import JobState, RefusalCode
from . import audit
from .admin import Refused, routing


@dataclass(frozen=True, slots=True)
class Resolved:
    """A job resolved by hand: the state it closed (``failed`` or ``parked``), who, why and when.
    ``already`` is true when this answer repeats a resolution made earlier with the same who and why."""

    job_id: int
    resolved_from: JobState
    resolved_at: datetime
    resolved_by: str
    resolved_reason: str
    already: bool = False

    @property
    def state(self) -> JobState:
        """Always ``resolved``."""
        return JobState.RESOLVED


def check_reason(reason: str | None) -> str:
    """The reason, stripped, or ``InvalidParameter`` (code ``invalid_reason``): it is required, and otherwise
    an operator's reason as ``audit.check_note`` has it (printable, at most ``audit.MAX_REASON_LENGTH``)."""
    text = audit.check_note(reason)
    if text is None:
        raise InvalidParameter("reason", "a reason is required to resolve a job by hand")
    return text


async def resolve(
    conn: Conn, job_id: int, *, by: str, reason: str, now: datetime | None = None
) -> Resolved | Refused:
    """Close a failed or parked job without running it; ``Resolved``, or ``Refused`` with its code.

    Codes: ``not_found``; ``not_resolvable`` (pending, running, succeeded or cancelled: a live job is
    cancelled instead, a done one needs nothing — also what the loser of a race with a redrive gets);
    ``already_resolved`` (resolved before by someone else or for another reason; the detail says by whom).
    """
    text = check_reason(reason)
    who = storable_text(by.strip()) or "unknown"
    found, tenant = await routing(conn, job_id)
    if not found:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    async with conn.transaction():
        row = await (
            await conn.execute(
                Q["job_resolve_if_failed_or_parked"],
                {"job_id": job_id, "by": who, "reason": storable_text(text), "now": now, "tenant": tenant},
            )
        ).fetchone()
        if row is not None:
            await audit.record(
                conn,
                "resolve",
                by=who,
                reason=text,
                job_id=job_id,
                tenant=tenant,
                detail={"from": row["resolved_from"]},
                now=row["resolved_at"],
            )
            return _resolved(job_id, row, already=False)
    job = await (await conn.execute(Q["job_resolution_get"], {"job_id": job_id})).fetchone()
    if job is None:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    state = JobState(job["state"])
    if state == JobState.RESOLVED:
        if job["resolved_by"] == who and job["resolved_reason"] == storable_text(text):
            return _resolved(job_id, job, already=True)
        return Refused(
            RefusalCode.ALREADY_RESOLVED,
            f"job {job_id} was resolved by {job['resolved_by']} at {job['resolved_at'].isoformat()}: "
            f"{job['resolved_reason']}",
        )
    hint = {
        JobState.PENDING: "; cancel it instead",
        JobState.RUNNING: "; it is leased to a worker right now: cancel it instead",
    }.get(state, "; it needs nothing more")
    return Refused(
        RefusalCode.NOT_RESOLVABLE,
        f"job {job_id} is {state}; only failed and parked jobs can be resolved by hand{hint}",
    )


async def count_between(conn: Conn, *, since: datetime, until: datetime) -> int:
    """How many jobs were resolved by hand in [since, until)."""
    row = await (
        await conn.execute(Q["jobs_resolved_count_between"], {"since": since, "until": until})
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _resolved(job_id: int, row: dict[str, object], *, already: bool) -> Resolved:
    at = row["resolved_at"]
    assert isinstance(at, datetime)
    return Resolved(
        job_id,
        JobState(str(row["resolved_from"])),
        at,
        str(row["resolved_by"]),
        str(row["resolved_reason"]),
        already,
    )
