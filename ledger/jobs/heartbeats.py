"""Heartbeats and given-up leases: the writes a worker makes for every job it holds at once.

A heartbeat extends many leases in one statement and skips a row another transaction holds locked (it comes
back ``busy``), so one job's slow fenced write never stalls the others' heartbeats. Giving a lease up expires
it now, where its token still holds; the reconciler hands the job on by its release rule. Both match the job
id *and* the fencing token, as every write by a lease holder does (``leases``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from ..db import Conn
from ..errors import LeaseBusy, LeaseLost
from ..queries import Q


async def extend_lease(
    conn: Conn, job_id: int, lease_token: int, *, ttl: float, now: datetime | None = None
) -> bool:
    """Heartbeat: extend the lease; returns whether a cancel was requested. Raises ``LeaseLost``, or
    ``LeaseBusy`` when another transaction holds the job's row locked at that instant."""
    beat = await extend_leases(conn, [(job_id, lease_token, ttl)], now=now)
    if job_id in beat.busy:
        raise LeaseBusy(job_id, lease_token)
    if job_id not in beat.held:
        raise LeaseLost(job_id, lease_token)
    return beat.held[job_id]


@dataclass(frozen=True, slots=True)
class Extended:
    """What one heartbeat did. ``held`` maps each extended lease's job id to whether a cancel was asked;
    ``busy`` holds the jobs whose row another transaction had locked at that instant — not extended, not
    lost: ask again shortly. A job in neither lost its lease."""

    held: dict[int, bool]
    busy: frozenset[int] = frozenset()

    def lost(self, job_id: int) -> bool:
        """Whether ``job_id``'s lease is gone: its token no longer holds the job."""
        return job_id not in self.held and job_id not in self.busy


async def extend_leases(
    conn: Conn,
    leases: Sequence[tuple[int, int, float]],
    *,
    now: datetime | None = None,
    tenants: Sequence[str] | None = None,
) -> Extended:
    """Heartbeat for many leases, given as (job id, lease token, TTL), in one statement.

    A row locked by another transaction is skipped rather than waited for (it comes back ``busy``), so
    one slow fenced write cannot hold back the heartbeats of the other leases. A job missing from the
    answer lost its lease (the write changed nothing for it, and only for it). With ``tenants`` (each
    lease's, on a ledger distributed by tenant), one statement per tenant, each routed to its shard.
    """
    rows: list[Any] = []
    for tenant, group in _by_tenant(leases, tenants):
        rows += await (
            await conn.execute(
                Q["lease_extend_if_held"],
                {
                    "job_ids": [job_id for job_id, _, _ in group],
                    "lease_tokens": [token for _, token, _ in group],
                    "ttls": [float(ttl) for _, _, ttl in group],
                    "now": now,
                    "tenant": tenant,
                },
            )
        ).fetchall()
    return Extended(
        {row["id"]: bool(row["cancel_requested"]) for row in rows if not row["busy"]},
        frozenset(row["id"] for row in rows if row["busy"]),
    )


_T = TypeVar("_T")


def _by_tenant(items: Sequence[_T], tenants: Sequence[str] | None) -> list[tuple[str | None, list[_T]]]:
    """``items`` in one group for every tenant (``tenants`` None: one statement over all), else grouped by
    their tenant, one statement each: Citus routes a statement to one shard only when it names one tenant."""
    if not items:
        return []
    if tenants is None:
        return [(None, list(items))]
    groups: dict[str, list[_T]] = {}
    for item, tenant in zip(items, tenants, strict=True):
        groups.setdefault(tenant, []).append(item)
    return list(groups.items())


async def abandon_leases(
    conn: Conn,
    leases: Sequence[tuple[int, int]],
    *,
    now: datetime | None = None,
    tenants: Sequence[str] | None = None,
) -> list[int]:
    """Give up many leases, given as (job id, lease token), in one statement: each expires now, where its
    token still holds, and the reconciler hands the job on by its release rule at its next pass. Returns
    the jobs whose lease was given up (one taken by someone else meanwhile is not among them). ``tenants``:
    as ``extend_leases``."""
    rows: list[Any] = []
    for tenant, group in _by_tenant(leases, tenants):
        rows += await (
            await conn.execute(
                Q["lease_abandon_if_held"],
                {
                    "job_ids": [job_id for job_id, _ in group],
                    "lease_tokens": [token for _, token in group],
                    "now": now,
                    "tenant": tenant,
                },
            )
        ).fetchall()
    return sorted(row["id"] for row in rows)
