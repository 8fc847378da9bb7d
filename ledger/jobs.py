"""Jobs and their leases.

A job is a row with a lease on it. ``fetch_and_lease`` hands due jobs to a worker, each under a new
fencing token; every later write by that worker (heartbeat, checkpoint, step, terminal transition,
its own fenced transaction) matches the job id *and* that token in its WHERE clause, so a worker
whose lease was reclaimed changes nothing and gets ``LeaseLost``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg.types.json import Jsonb

from .db import Conn
from .errors import LeaseLost
from .queries import Q

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "parked"})
LIVE_STATES = frozenset({"pending", "running"})


@dataclass(frozen=True, slots=True)
class Lease:
    """A job leased to one worker under one fencing token, with what its handler needs."""

    job_id: int
    effect_id: int
    kind: str
    tenant: str
    attempt: int
    max_attempts: int
    lease_token: int
    checkpoint: Any
    cancel_requested: bool
    effect_key: str
    source: str
    event_id: str
    event_type: str
    payload: Any


async def fetch_and_lease(
    conn: Conn,
    *,
    owner: str,
    kinds: Sequence[str],
    limit: int,
    ttl: float,
    now: datetime | None = None,
) -> list[Lease]:
    """Lease up to ``limit`` due jobs of ``kinds`` to ``owner`` for ``ttl`` seconds."""
    rows = await (
        await conn.execute(
            Q["job_fetch_and_lease"],
            {"owner": owner, "kinds": list(kinds), "limit": limit, "ttl": ttl, "now": now},
        )
    ).fetchall()
    return [
        Lease(
            job_id=r["id"],
            effect_id=r["effect_id"],
            kind=r["kind"],
            tenant=r["tenant"],
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            lease_token=r["lease_token"],
            checkpoint=r["checkpoint"],
            cancel_requested=r["cancel_requested"],
            effect_key=r["effect_key"],
            source=r["source"],
            event_id=r["event_id"],
            event_type=r["event_type"],
            payload=r["payload"],
        )
        for r in rows
    ]


def _fenced(job_id: int, lease_token: int, row: Any) -> Any:
    if row is None:
        raise LeaseLost(job_id, lease_token)
    return row


async def extend_lease(
    conn: Conn, job_id: int, lease_token: int, *, ttl: float, now: datetime | None = None
) -> bool:
    """Heartbeat: extend the lease; returns whether a cancel was requested. Raises ``LeaseLost``."""
    row = await (
        await conn.execute(
            Q["lease_extend_if_held"], {"job_id": job_id, "lease_token": lease_token, "ttl": ttl, "now": now}
        )
    ).fetchone()
    return bool(_fenced(job_id, lease_token, row)["cancel_requested"])


async def save_checkpoint(
    conn: Conn, job_id: int, lease_token: int, checkpoint: Any, *, now: datetime | None = None
) -> None:
    """Commit a resume point for the job. Raises ``LeaseLost``."""
    row = await (
        await conn.execute(
            Q["checkpoint_save_if_leased"],
            {"job_id": job_id, "lease_token": lease_token, "checkpoint": Jsonb(checkpoint), "now": now},
        )
    ).fetchone()
    _fenced(job_id, lease_token, row)


@asynccontextmanager
async def fenced_transaction(conn: Conn, job_id: int, lease_token: int) -> AsyncIterator[Conn]:
    """A transaction that holds the job's row lock under the current token, or raises ``LeaseLost``.

    Whatever the caller writes inside commits only together with proof that the lease was still held;
    a reclaim waits for the row lock, so it cannot slip in between the check and the commit.
    """
    async with conn.transaction():
        row = await (
            await conn.execute(Q["lease_hold_if_leased"], {"job_id": job_id, "lease_token": lease_token})
        ).fetchone()
        _fenced(job_id, lease_token, row)
        yield conn


FinishState = Literal["succeeded", "failed", "parked"]


async def finish(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    state: FinishState,
    by: str,
    reason: str | None = None,
    error: dict[str, Any] | None = None,
    unrecoverable: bool = False,
    now: datetime | None = None,
) -> str:
    """The terminal transition, fenced; returns the state reached (``cancelled`` if a cancel won)."""
    row = await (
        await conn.execute(
            Q["job_finish_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "state": state,
                "by": by,
                "reason": reason,
                "error": Jsonb(error) if error is not None else None,
                "unrecoverable": unrecoverable,
                "now": now,
            },
        )
    ).fetchone()
    return str(_fenced(job_id, lease_token, row)["state"])


async def retry(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    delay: float,
    error: dict[str, Any],
    now: datetime | None = None,
) -> str:
    """Give the job back for another attempt after ``delay`` seconds, fenced; returns the state reached."""
    row = await (
        await conn.execute(
            Q["job_retry_if_leased"],
            {"job_id": job_id, "lease_token": lease_token, "delay": delay, "error": Jsonb(error), "now": now},
        )
    ).fetchone()
    return str(_fenced(job_id, lease_token, row)["state"])


async def hand_back(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    poison_threshold: int,
    by: str,
    now: datetime | None = None,
) -> str:
    """Hand the rest of the work back (slice budget spent), fenced; returns the state reached."""
    row = await (
        await conn.execute(
            Q["job_hand_back_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "poison_threshold": poison_threshold,
                "by": by,
                "now": now,
            },
        )
    ).fetchone()
    return str(_fenced(job_id, lease_token, row)["state"])


@dataclass(frozen=True, slots=True)
class Refused:
    """An operator action that was not carried out, with a machine-readable code."""

    code: str
    detail: str


async def get(conn: Conn, job_id: int) -> dict[str, Any] | None:
    """One job with its effect's key, source and event type, or ``None``."""
    return await (await conn.execute(Q["job_get"], {"job_id": job_id})).fetchone()


async def cancel(
    conn: Conn, job_id: int, *, by: str, reason: str = "cancelled by operator", now: datetime | None = None
) -> str | Refused:
    """Cancel a job: at once if pending, by flag if running. Returns the job's state, or ``Refused``."""
    row = await (
        await conn.execute(Q["job_cancel"], {"job_id": job_id, "by": by, "reason": reason, "now": now})
    ).fetchone()
    if row is not None:
        return str(row["state"])
    job = await get(conn, job_id)
    if job is None:
        return Refused("not_found", f"no job {job_id}")
    return Refused("not_cancellable", f"job {job_id} is already {job['state']}")


async def redrive(
    conn: Conn, job_id: int, *, force: bool = False, now: datetime | None = None
) -> Refused | None:
    """Put a failed or parked job back to pending; ``None`` on success, else ``Refused`` with its code."""
    row = await (
        await conn.execute(Q["job_redrive_if_allowed"], {"job_id": job_id, "force": force, "now": now})
    ).fetchone()
    if row is not None:
        return None
    job = await get(conn, job_id)
    if job is None:
        return Refused("not_found", f"no job {job_id}")
    if job["state"] in ("failed", "parked") and job["unrecoverable"] and not force:
        return Refused(
            "unrecoverable_requires_force", f"job {job_id} failed unrecoverably; redrive with force"
        )
    return Refused(
        "not_redrivable", f"job {job_id} is {job['state']}; only failed and parked jobs can be redriven"
    )
