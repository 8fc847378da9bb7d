"""Jobs and their leases.

A job is a row with a lease on it. ``fetch_and_lease`` hands due jobs to a worker, each under a new
random fencing token (never the last one + 1: a failover that lost WAL could hand it out twice); every later write by that worker (heartbeat, checkpoint, step, terminal transition,
its own fenced transaction) matches the job id *and* that token in its WHERE clause, so a worker
whose lease was reclaimed changes nothing and gets ``LeaseLost``.

The lease holder's fenced writes (a checkpoint, its own transaction, a retry, a hand-back) live in
``fenced``, heartbeats and given-up leases in ``heartbeats``, terminal transitions in ``finishes`` and the
operator's reads and actions in ``admin``; the room's facade (``ledger/jobs/__init__.py``) gathers the names
callers use as ``jobs.…``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from ..cluster import shards
from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..queries import Q, without_cte

__all__ = [
    "FETCH_LOCK_KEY_RETRIES",
    "FETCH_SCAN_LIMIT",
    "FETCH_SUPERSEDED_ROUNDS",
    "LOCK_KEY_INDEX",
    "Lease",
    "fetch_and_lease",
    "listen",
    "tenants_due",
]

# The partial unique index that allows one running job per (tenant, lock key); migrations/0002.
LOCK_KEY_INDEX = "jobs_lock_key_running_unique"
# Two fetches racing for two jobs of one lock key: the loser's statement is refused by the index and
# changed nothing, so it simply asks again (its next snapshot sees the winner as the holder).
FETCH_LOCK_KEY_RETRIES = 3
# A fetch that cancelled superseded jobs (migrations/0020) and leased fewer than asked asks again, this many
# times at most: the newer jobs that superseded them are due, and their wake-ups may already be spent.
FETCH_SUPERSEDED_ROUNDS = 4
# How many due jobs of one kind a fetch reads at most, whatever it finds there. It only matters when the
# head of a kind's queue is a long run of jobs whose lock keys running jobs hold (or that other fetches
# hold right now): without it every fetch would walk that run, so a hot key with a backlog would make every
# fetch cost the backlog again. 1,000 rows cost about a millisecond (docs/performance.md); the cost is that a
# longer such run holds the rest of its kind back until its holders finish.
FETCH_SCAN_LIMIT = 1_000

# The fetch for one tenant on Citus: job_fetch_and_lease without its attempts CTE, which is one router task;
# the attempts are opened by job_attempt_open in the same transaction (_fetch_routed).
_ROUTED_FETCH = without_cte(Q["job_fetch_and_lease"], "attempt")


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
    lock_key: str | None = None
    # Whether an earlier attempt recorded any step: a first attempt need not ask for them.
    has_steps: bool = True
    # The traceparent of the delivery span that claimed the job (None: tracing was off then).
    trace_parent: str | None = None


async def fetch_and_lease(
    conn: Conn,
    *,
    owner: str,
    kinds: Mapping[str, float],
    limit: int,
    now: datetime | None = None,
    scan_limit: int = FETCH_SCAN_LIMIT,
    hooked: Collection[str] = (),
    to_supersede: list[int] | None = None,
    topology: Topology = SINGLE_NODE,
    guarded: bool = True,
) -> list[Lease]:
    """Lease up to ``limit`` due jobs to ``owner``; ``kinds`` maps each kind it runs to its lease TTL.

    Each job is leased for its own kind's TTL: one short-TTL kind must not shorten the lease of a
    long one, whose heartbeats come at a third of *its* TTL. A job whose lock key a running job holds
    is left pending. Each kind's walk reads at most ``scan_limit`` due rows (never fewer than ``limit``),
    so a fetch costs about ``limit`` index reads per kind at any backlog. A job older than the newest
    version claimed for its object is cancelled as superseded instead of leased; of the ``hooked`` kinds
    (those with an ``on_transition`` hook) it is left pending and its id appended to ``to_supersede``, for
    the caller to cancel with the hook in the cancel's transaction.

    Where ``topology.distributed`` (a ledger distributed by tenant on Citus) the one statement over every
    tenant is a multi-shard ``FOR UPDATE``, which Citus refuses. Instead up to ``limit`` tenants with due jobs
    are read first, by their oldest due job (no lock, ``tenants_due``: two statements, three when one tenant
    holds several of the earliest jobs), then each tenant's jobs are leased by the same statement restricted
    to that tenant, which Citus routes to its shard: each tenant first up to an equal share of ``limit``, then
    what is left to those that had more. 2 + (tenants leased from) statements per fetch, plus one per tenant
    asked again.

    Inside the caller's transaction the statement runs in a savepoint, so a fetch that loses a lock key's
    race (retried here) or fails does not abort the caller's transaction. ``guarded=False`` leaves the
    savepoint out, two round trips fewer: any error then propagates at once, the caller's transaction is
    aborted, and the caller must roll it back and may do it all again guarded (the worker's finish batch).
    """
    if not topology.distributed:
        return await _fetch_tenant(
            conn, owner, kinds, limit, now, scan_limit, hooked, to_supersede, None, guarded
        )
    tenants = await tenants_due(conn, kinds=kinds, limit=limit, now=now, topology=topology)
    if not tenants:
        return []
    # Each tenant found gets a fair share of the batch first (the earliest the odd places): asked in discovery's
    # order for all it has, a hot tenant's backlog would take the whole batch and its neighbours none. What a
    # tenant leaves unused goes to those that filled their share, in a second pass only when the first left room.
    share = -(-limit // len(tenants))
    leases: list[Lease] = []
    full: list[str] = []
    for tenant in tenants:
        got = await _fetch_tenant(
            conn, owner, kinds, min(share, limit - len(leases)), now, scan_limit, hooked, to_supersede, tenant
        )
        leases += got
        if len(got) >= share:
            full.append(tenant)
        if len(leases) >= limit:
            return leases
    for tenant in full:
        leases += await _fetch_tenant(
            conn, owner, kinds, limit - len(leases), now, scan_limit, hooked, to_supersede, tenant
        )
        if len(leases) >= limit:
            break
    return leases


async def tenants_due(
    conn: Conn,
    *,
    kinds: Mapping[str, float],
    limit: int,
    now: datetime | None = None,
    topology: Topology,
    node_connection_timeout: float = shards.DEFAULT_NODE_CONNECTION_TIMEOUT,
) -> list[str]:
    """Up to ``limit`` distinct tenants with due pending jobs of ``kinds``, ordered by each one's oldest due
    job; read without a lock, so a tenant may have nothing left to lease by the time it is asked. A tenant
    with a large backlog takes one place, so tenants behind it are found in the same fetch.

    On Citus one cheap statement reads the tenants of the earliest ``limit`` due jobs over every shard, its
    bound in each shard's plan; that is the answer when they are ``limit`` distinct tenants or every due job.
    Otherwise (one tenant holds several of the earliest jobs) the read goes node by node (``shards``), each
    shard stepping from tenant to tenant on its tenant-keyed index (``job_tenants_due_on_shard``). If a worker
    node cannot be reached (Citus fails the first statement whole), the same node-by-node read is made: the
    tenants of the nodes that answer come back, the lost node's shards are logged, and its tenants come back
    in the first fetch after it returns. Without Citus (``topology.citus`` false: per-tenant leasing on one
    Postgres is only for tests) the second read is ``job_tenants_due_one_node``. ``node_connection_timeout`` bounds how long a node that does not
    answer holds the fetch (each read)."""
    unpaused: list[str] | None = None
    try:
        # A transaction of its own (a savepoint inside the caller's, to whose commit the timeout then lasts), so a
        # read refused for a lost node leaves the caller's transaction usable.
        async with conn.transaction():
            row = await (
                await conn.execute(
                    Q["job_tenants_due_prepare"],
                    {"kinds": list(kinds), "timeout_ms": _ms(node_connection_timeout)},
                )
            ).fetchone()
            unpaused = row["kinds"] if row else []
            if not unpaused:
                return []
            params = {"kinds": unpaused, "limit": limit, "now": now}
            rows = await (await conn.execute(Q["job_tenants_due"], params)).fetchall()
        tenants = list(dict.fromkeys(row["tenant"] for row in rows))
        if len(rows) < limit or len(tenants) >= limit:
            return tenants
        if not topology.citus:
            rows = await (await conn.execute(Q["job_tenants_due_one_node"], params)).fetchall()
            return [row["tenant"] for row in rows]
    except psycopg.Error as exc:
        if unpaused is None or not shards.node_lost(conn, exc):
            raise
    found = await shards.tenants_on_live_nodes(
        conn,
        "job_tenants_due_on_shard",
        table="jobs",
        params={"kinds": unpaused},
        limit=limit,
        now=now,
        node_connection_timeout=node_connection_timeout,
    )
    shards.log_skipped("fetch", found.skipped)
    return found.tenants


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


async def _fetch_tenant(
    conn: Conn,
    owner: str,
    kinds: Mapping[str, float],
    limit: int,
    now: datetime | None,
    scan_limit: int,
    hooked: Collection[str],
    to_supersede: list[int] | None,
    tenant: str | None,
    guarded: bool = True,
) -> list[Lease]:
    leases: list[Lease] = []
    for _ in range(FETCH_SUPERSEDED_ROUNDS):
        leased, superseded, hooked_ids = await _fetch_once(
            conn, owner, kinds, limit - len(leases), now, scan_limit, list(hooked), tenant, guarded
        )
        leases += leased
        if to_supersede is not None:
            to_supersede.extend(i for i in hooked_ids if i not in to_supersede)
        if not superseded or len(leases) >= limit:
            break
    return leases


async def _fetch_routed(conn: Conn, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One tenant's fetch on Citus: the fetch without its attempts CTE (one router task), then each leased
    job's attempt row (router inserts, pipelined), in one transaction on the tenant's node (or a savepoint in
    the caller's)."""
    async with conn.transaction():
        rows = await (await conn.execute(_ROUTED_FETCH, params)).fetchall()
        opened = [
            {
                "job_id": r["id"],
                "tenant": r["tenant"],
                "attempt": r["attempt"],
                "lease_token": r["lease_token"],
                "owner": params["owner"],
                "now": params["now"],
            }
            for r in rows
            if r["id"] is not None
        ]
        if opened:
            async with conn.cursor() as cur:
                await cur.executemany(Q["job_attempt_open"], opened)
    return rows


async def _fetch_once(
    conn: Conn,
    owner: str,
    kinds: Mapping[str, float],
    limit: int,
    now: datetime | None,
    scan_limit: int,
    hooked: list[str],
    tenant: str | None,
    guarded: bool = True,
) -> tuple[list[Lease], int, list[int]]:
    params = {
        "tenant": tenant,
        "hooked": hooked,
        "owner": owner,
        "kinds": list(kinds),
        "ttls": [float(ttl) for ttl in kinds.values()],
        "limit": limit,
        "scan_limit": max(scan_limit, limit),
        "now": now,
    }
    for _ in range(FETCH_LOCK_KEY_RETRIES):
        try:
            if tenant is not None:
                rows = await _fetch_routed(conn, params)
            elif conn.info.transaction_status and guarded:
                # Inside the caller's transaction: a savepoint, so a refused fetch does not abort it.
                async with conn.transaction():
                    rows = await (await conn.execute(Q["job_fetch_and_lease"], params)).fetchall()
            else:
                # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT trips.
                rows = await (await conn.execute(Q["job_fetch_and_lease"], params)).fetchall()
            break
        except pg_errors.UniqueViolation as exc:
            # Unguarded inside the caller's transaction, the race aborted it: the caller starts again.
            if (
                exc.diag.constraint_name != LOCK_KEY_INDEX
                or conn.info.transaction_status == TransactionStatus.INERROR
            ):
                raise
    else:
        return [], 0, []
    superseded = rows[0]["superseded"] if rows else 0
    hooked_ids: list[int] = (rows[0]["to_supersede"] or []) if rows else []
    return (
        [
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
                lock_key=r["lock_key"],
                has_steps=r["has_steps"],
                trace_parent=r["trace_parent"],
            )
            for r in rows
            if r["id"] is not None
        ],
        superseded,
        hooked_ids,
    )


async def listen(conn: Conn) -> None:
    """Subscribe ``conn`` to job wake-ups (new, re-queued and redriven jobs); read them with
    ``conn.notifies()``. The payload is the job's kind; a wake-up promises nothing but "fetch now"."""
    await conn.execute(Q["job_notifications_listen"])
