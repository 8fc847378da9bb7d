"""The lease holder's fenced writes: a checkpoint, a transaction of its own, a retry, a hand-back.

Each matches the job id *and* the lease token it was leased under (``leases``), and answers from the row it
changed; no row means the lease was reclaimed, and the write raises ``LeaseLost`` having changed nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..errors import LeaseLost
from ..queries import Q
from ..storable import storable_record
from ..vocabulary import JobState
from .finishes import Reached

__all__ = ["fenced_transaction", "hand_back", "retry", "save_checkpoint"]


def _fenced(job_id: int, lease_token: int, row: Any) -> Any:
    if row is None:
        raise LeaseLost(job_id, lease_token)
    return row


async def save_checkpoint(
    conn: Conn,
    job_id: int,
    lease_token: int,
    checkpoint: Any,
    *,
    now: datetime | None = None,
    tenant: str | None = None,
) -> None:
    """Commit a resume point for the job. Raises ``LeaseLost``. The job's ``tenant``, where known, lets Citus
    route the write to one shard (every fenced write below takes it)."""
    row = await (
        await conn.execute(
            Q["checkpoint_save_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "checkpoint": Jsonb(checkpoint),
                "now": now,
                "tenant": tenant,
            },
        )
    ).fetchone()
    _fenced(job_id, lease_token, row)


@asynccontextmanager
async def fenced_transaction(
    conn: Conn, job_id: int, lease_token: int, *, tenant: str | None = None
) -> AsyncIterator[Conn]:
    """A transaction that holds the job's row lock under the current token, or raises ``LeaseLost``.

    Whatever the caller writes inside commits only together with proof that the lease was still held;
    a reclaim waits for the row lock, so it cannot slip in between the check and the commit.
    """
    async with conn.transaction():
        row = await (
            await conn.execute(
                Q["lease_hold_if_leased"], {"job_id": job_id, "lease_token": lease_token, "tenant": tenant}
            )
        ).fetchone()
        _fenced(job_id, lease_token, row)
        yield conn


def _reached(job_id: int, lease_token: int, row: Any) -> Reached:
    row = _fenced(job_id, lease_token, row)
    return Reached(JobState(row["state"]), row["terminal_reason"])


async def retry(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    delay: float,
    error: dict[str, Any],
    now: datetime | None = None,
    tenant: str | None = None,
    topology: Topology = SINGLE_NODE,
) -> Reached:
    """Give the job back for another attempt after ``delay`` seconds, fenced; ``cancelled`` if a cancel
    was asked meanwhile. The attempt's error is stored with it. Raises ``LeaseLost``.

    A retry due at once wakes the workers of its kind. Where ``topology.distributed`` the statement runs on the tenant's worker node, where its NOTIFY is heard by nobody, so
    the wake-up is sent again from this session (the coordinator)."""
    row = await (
        await conn.execute(
            Q["job_retry_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "delay": float(delay),
                "error": Jsonb(storable_record(error)),
                "now": now,
                "tenant": tenant,
            },
        )
    ).fetchone()
    reached = _reached(job_id, lease_token, row)
    if topology.distributed and delay <= 0 and reached.state == JobState.PENDING:
        assert row is not None  # _reached raised LeaseLost otherwise
        await conn.execute(Q["jobs_notify"], {"kinds": [row["kind"]]})
    return reached


async def hand_back(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    poison_threshold: int,
    by: str,
    now: datetime | None = None,
    tenant: str | None = None,
) -> Reached:
    """Hand the rest of the work back (slice budget spent or draining), fenced: re-queued at once, or
    ``parked`` as poison after ``poison_threshold`` hand-backs in a row that committed nothing, or
    ``cancelled`` if a cancel was asked. Raises ``LeaseLost``."""
    row = await (
        await conn.execute(
            Q["job_hand_back_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "poison_threshold": poison_threshold,
                "by": by,
                "now": now,
                "tenant": tenant,
            },
        )
    ).fetchone()
    return _reached(job_id, lease_token, row)
