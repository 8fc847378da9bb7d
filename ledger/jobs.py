"""Jobs and their leases.

A job is a row with a lease on it. ``fetch_and_lease`` hands due jobs to a worker, each under a new
fencing token; every later write by that worker (heartbeat, checkpoint, step, terminal transition,
its own fenced transaction) matches the job id *and* that token in its WHERE clause, so a worker
whose lease was reclaimed changes nothing and gets ``LeaseLost``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, TypedDict, TypeVar, cast

from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from .db import Conn, error_kind
from .errors import LeaseBusy, LeaseLost, LedgerError
from .queries import Q
from .storable import storable_record, storable_text
from .vocabulary import REDRIVABLE_STATES, TERMINAL_STATES, JobState, RefusalCode

# The partial unique index that allows one running job per (tenant, lock key); migrations/0002.
LOCK_KEY_INDEX = "jobs_lock_key_running_unique"
# Two fetches racing for two jobs of one lock key: the loser's statement is refused by the index and
# changed nothing, so it simply asks again (its next snapshot sees the winner as the holder).
FETCH_LOCK_KEY_RETRIES = 3
# A fetch that cancelled superseded jobs (migrations/0020) and leased fewer than asked asks again, this many
# times at most: the newer jobs that superseded them are due, and their wake-ups may already be spent.
FETCH_SUPERSEDED_ROUNDS = 4
# How much of Postgres's refusal a stand-in terminal reason quotes.
MAX_REFUSAL_TEXT = 300

log = logging.getLogger("effectgate.ledger.jobs")
# How many due jobs of one kind a fetch reads at most, whatever it finds there. It only matters when the
# head of a kind's queue is a long run of jobs whose lock keys running jobs hold (or that other fetches
# hold right now): without it every fetch would walk that run, so a hot key with a backlog would make every
# fetch cost the backlog again. 1,000 rows cost about a millisecond (docs/performance.md); the cost is that a
# longer such run holds the rest of its kind back until its holders finish.
FETCH_SCAN_LIMIT = 1_000


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
    per_tenant: bool = False,
) -> list[Lease]:
    """Lease up to ``limit`` due jobs to ``owner``; ``kinds`` maps each kind it runs to its lease TTL.

    Each job is leased for its own kind's TTL: one short-TTL kind must not shorten the lease of a
    long one, whose heartbeats come at a third of *its* TTL. A job whose lock key a running job holds
    is left pending. Each kind's walk reads at most ``scan_limit`` due rows (never fewer than ``limit``),
    so a fetch costs about ``limit`` index reads per kind at any backlog. A job older than the newest
    version claimed for its object is cancelled as superseded instead of leased; of the ``hooked`` kinds
    (those with an ``on_transition`` hook) it is left pending and its id appended to ``to_supersede``, for
    the caller to cancel with the hook in the cancel's transaction.

    ``per_tenant`` (a ledger distributed by tenant on Citus, ``distributed``): the one statement over every
    tenant is a multi-shard ``FOR UPDATE``, which Citus refuses. Instead the tenants with the earliest due
    jobs are read first (no lock), then each tenant's jobs are leased by the same statement restricted to
    that tenant, which Citus routes to its shard: 1 + (tenants leased from) statements per fetch.
    """
    if not per_tenant:
        return await _fetch_tenant(conn, owner, kinds, limit, now, scan_limit, hooked, to_supersede, None)
    leases: list[Lease] = []
    for tenant in await tenants_due(conn, kinds=kinds, limit=limit, now=now):
        leases += await _fetch_tenant(
            conn, owner, kinds, limit - len(leases), now, scan_limit, hooked, to_supersede, tenant
        )
        if len(leases) >= limit:
            break
    return leases


async def tenants_due(
    conn: Conn, *, kinds: Mapping[str, float], limit: int, now: datetime | None = None
) -> list[str]:
    """The tenants of the earliest ``limit`` due pending jobs of ``kinds``, earliest first; read without a
    lock, so a tenant may have nothing left to lease by the time it is asked."""
    rows = await (
        await conn.execute(Q["job_tenants_due"], {"kinds": list(kinds), "limit": limit, "now": now})
    ).fetchall()
    return [row["tenant"] for row in rows]


async def distributed(conn: Conn) -> bool:
    """Whether ``jobs`` is a Citus distributed table here: the worker then leases and batches per tenant."""
    row = await (await conn.execute(Q["jobs_distributed_citus"])).fetchone()
    if row is None or not row["citus"]:
        return False
    row = await (await conn.execute(Q["jobs_distributed_table"])).fetchone()
    return row is not None and bool(row["distributed"])


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
) -> list[Lease]:
    leases: list[Lease] = []
    for _ in range(FETCH_SUPERSEDED_ROUNDS):
        leased, superseded, hooked_ids = await _fetch_once(
            conn, owner, kinds, limit - len(leases), now, scan_limit, list(hooked), tenant
        )
        leases += leased
        if to_supersede is not None:
            to_supersede.extend(i for i in hooked_ids if i not in to_supersede)
        if not superseded or len(leases) >= limit:
            break
    return leases


async def _fetch_once(
    conn: Conn,
    owner: str,
    kinds: Mapping[str, float],
    limit: int,
    now: datetime | None,
    scan_limit: int,
    hooked: list[str],
    tenant: str | None,
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
            if conn.info.transaction_status:
                # Inside the caller's transaction: a savepoint, so a refused fetch does not abort it.
                async with conn.transaction():
                    rows = await (await conn.execute(Q["job_fetch_and_lease"], params)).fetchall()
            else:
                # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT trips.
                rows = await (await conn.execute(Q["job_fetch_and_lease"], params)).fetchall()
            break
        except pg_errors.UniqueViolation as exc:
            if exc.diag.constraint_name != LOCK_KEY_INDEX:
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


def _fenced(job_id: int, lease_token: int, row: Any) -> Any:
    if row is None:
        raise LeaseLost(job_id, lease_token)
    return row


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


FinishState = Literal[JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED]


@dataclass(frozen=True, slots=True)
class Reached:
    """Where a worker's transition left the job, and why (``reason`` is set for terminal states)."""

    state: JobState
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        """Whether the job is done: a terminal state is reached once and never left but by redrive."""
        return self.state in TERMINAL_STATES


def _reached(job_id: int, lease_token: int, row: Any) -> Reached:
    row = _fenced(job_id, lease_token, row)
    return Reached(JobState(row["state"]), row["terminal_reason"])


@dataclass(frozen=True, slots=True)
class Finish:
    """One terminal transition a worker asks for: the job, its token, and the state it should reach."""

    job_id: int
    lease_token: int
    state: FinishState
    by: str
    reason: str | None = None
    error: dict[str, Any] | None = None
    unrecoverable: bool = False
    # The job's tenant: with ``finish_many(per_tenant=True)`` the batch is written one tenant at a time.
    tenant: str | None = None


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
) -> Reached:
    """The terminal transition, fenced; a cancel requested meanwhile wins (``cancelled``).

    Raises ``LeaseLost`` if ``lease_token`` no longer holds the job, ``LedgerError`` if Postgres refuses the
    transition even with a stand-in reason (see ``finish_many``).
    """
    [reached] = await finish_many(
        conn, [Finish(job_id, lease_token, state, by, reason, error, unrecoverable)], now=now
    )
    if reached is None:
        raise LeaseLost(job_id, lease_token)
    if isinstance(reached, LedgerError):
        raise reached
    return reached


async def finish_many(
    conn: Conn, transitions: Sequence[Finish], *, now: datetime | None = None, per_tenant: bool = False
) -> list[Reached | LedgerError | None]:
    """Many terminal transitions in one statement, each fenced by its own token; as ``finish`` each.

    Returns one answer per transition, in order: where the job got to, or ``None`` where the token no
    longer held it — that row changed nothing, and the others were made all the same — or, where
    Postgres refused even the stand-in below for that row, a ``LedgerError`` for it alone.

    One row never fails the others. Every reason and error record is made storable first (an error
    record Postgres would refuse is rewritten, and says so under ``unstorable``); a batch Postgres still
    refuses for what a row holds is split until that row stands alone, and that row alone is then
    written with a replacement reason and error record naming the refusal (``UnstorableOutcome``).

    ``per_tenant`` (a ledger distributed by tenant): one statement per tenant, each routed to its shard.
    """
    if not transitions:
        return []
    storable = [_storable_finish(t) for t in transitions]
    if not per_tenant:
        return await _finish_split(conn, storable, now)
    answers: dict[int, Reached | LedgerError | None] = {}
    for _, group in _by_tenant(storable, [t.tenant or "" for t in storable]):
        answers.update(zip((id(t) for t in group), await _finish_split(conn, group, now), strict=True))
    return [answers[id(t)] for t in storable]


def _storable_finish(t: Finish) -> Finish:
    return replace(
        t,
        by=storable_text(t.by),
        reason=storable_text(t.reason) if t.reason is not None else None,
        error=storable_record(t.error) if t.error is not None else None,
    )


async def _finish_split(
    conn: Conn, transitions: list[Finish], now: datetime | None
) -> list[Reached | LedgerError | None]:
    try:
        return [*await _finish_rows(conn, transitions, now)]
    except Exception as exc:
        if not _refused_for_a_row(exc):
            raise
        if len(transitions) > 1:
            half = len(transitions) // 2
            return [
                *await _finish_split(conn, transitions[:half], now),
                *await _finish_split(conn, transitions[half:], now),
            ]
        [t] = transitions
        refusal = _refusal(exc)
        log.error("jobs.finish_refused", extra={"job_id": t.job_id, "error": refusal})
        # The job must still reach its terminal state (invariant 8): the state it asked for, with what
        # Postgres refused replaced by a record of the refusal.
        stand_in = Finish(
            t.job_id,
            t.lease_token,
            t.state,
            storable_text(t.by),
            f"{t.state}; its reason or error record could not be stored ({refusal})",
            {"type": "UnstorableOutcome", "message": refusal},
            t.unrecoverable,
            t.tenant,
        )
        try:
            return [*await _finish_rows(conn, [stand_in], now)]
        except Exception as again:
            if not _refused_for_a_row(again):
                raise
            # Not the row's data, then (a trigger, a constraint on the job itself): this job's answer alone.
            return [
                LedgerError(f"job {t.job_id}: Postgres refused its terminal transition: {_refusal(again)}")
            ]


async def _finish_rows(conn: Conn, transitions: list[Finish], now: datetime | None) -> list[Reached | None]:
    params = {
        "job_ids": [t.job_id for t in transitions],
        "lease_tokens": [t.lease_token for t in transitions],
        "states": [t.state for t in transitions],
        "bys": [t.by for t in transitions],
        "reasons": [t.reason for t in transitions],
        "errors": [json.dumps(t.error) if t.error is not None else None for t in transitions],
        "unrecoverables": [t.unrecoverable for t in transitions],
        "now": now,
        # One tenant's batch (per_tenant), else none: the statement then matches on id and token alone.
        "tenant": transitions[0].tenant if len({t.tenant for t in transitions}) == 1 else None,
    }
    if conn.info.transaction_status:
        # Inside the caller's transaction: a savepoint, so a batch refused for one row can be split
        # without aborting the caller's transaction.
        async with conn.transaction():
            rows = await (await conn.execute(Q["job_finish_if_leased"], params)).fetchall()
    else:
        rows = await (await conn.execute(Q["job_finish_if_leased"], params)).fetchall()
    reached = {row["job_id"]: Reached(JobState(row["state"]), row["terminal_reason"]) for row in rows}
    return [reached.get(t.job_id) for t in transitions]


def _refused_for_a_row(exc: BaseException) -> bool:
    # A value json or the driver could not write (TypeError, ValueError) belongs to its row too.
    return error_kind(exc) == "row" or isinstance(exc, TypeError | ValueError)


def _refusal(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None)
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = f"{type(exc).__name__}: {message}" + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
    return storable_text(text[:MAX_REFUSAL_TEXT])


async def retry(
    conn: Conn,
    job_id: int,
    lease_token: int,
    *,
    delay: float,
    error: dict[str, Any],
    now: datetime | None = None,
    tenant: str | None = None,
) -> Reached:
    """Give the job back for another attempt after ``delay`` seconds, fenced; ``cancelled`` if a cancel
    was asked meanwhile. The attempt's error is stored with it. Raises ``LeaseLost``."""
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
    return _reached(job_id, lease_token, row)


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


class JobRow(TypedDict):
    """One job as ``get`` reads it: the row, its effect's key, source and event type, and the live job
    holding its lock key (if any)."""

    id: int
    effect_id: int
    tenant: str
    kind: str
    state: JobState
    attempt: int
    max_attempts: int
    orphan_policy: str
    run_at: datetime
    lease_token: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    checkpoint: Any
    cancel_requested: bool
    unrecoverable: bool
    releases_without_commit: int
    committed_since_release: bool
    last_error: dict[str, Any] | None
    terminal_reason: str | None
    terminal_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    lock_key: str | None
    payload_purged: bool
    # Set when an operator resolved the job by hand (ledger/resolutions.py): the state it closed, when, who, why.
    resolved_from: str | None
    resolved_at: datetime | None
    resolved_by: str | None
    resolved_reason: str | None
    lock_key_held_by: int | None
    effect_key: str
    source: str
    event_type: str


class AttemptRow(TypedDict):
    """One attempt of a job: who ran it under which token, how it ended (``outcome``: a terminal state,
    ``retry``, ``handed_back`` or ``lease_expired``; ``None`` while it runs) and its error."""

    job_id: int
    attempt: int
    lease_token: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error_type: str | None
    error_message: str | None
    traceback: str | None


@dataclass(frozen=True, slots=True)
class Refused:
    """An operator action that was not carried out, with a machine-readable code.

    Codes: ``not_found``; for cancel ``not_cancellable``; for redrive ``not_redrivable`` (succeeded,
    cancelled and live jobs), ``unrecoverable_requires_force``, ``lock_key_held`` (another live job
    holds the lock key: wait for it or cancel it).
    """

    code: RefusalCode
    detail: str


async def get(conn: Conn, job_id: int) -> JobRow | None:
    """One job with its effect's key, source and event type, or ``None``."""
    row = await (await conn.execute(Q["job_get"], {"job_id": job_id})).fetchone()
    if row is None:
        return None
    row["state"] = JobState(row["state"])
    return cast(JobRow, row)


async def attempts(conn: Conn, job_id: int) -> list[AttemptRow]:
    """Every attempt of a job, oldest first, with its worker, outcome and error (type, message, traceback)."""
    rows = await (await conn.execute(Q["job_attempts_for_job"], {"job_id": job_id})).fetchall()
    return cast(list[AttemptRow], rows)


async def cancel(
    conn: Conn, job_id: int, *, by: str, reason: str = "cancelled by operator", now: datetime | None = None
) -> JobState | Refused:
    """Cancel a job: at once if pending (returns ``cancelled``), by flag if running (returns ``running``;
    its worker sees the flag at the next heartbeat and the job ends ``cancelled``, never ``succeeded``).
    """
    row = await (
        await conn.execute(
            Q["job_cancel"],
            {"job_id": job_id, "by": storable_text(by), "reason": storable_text(reason), "now": now},
        )
    ).fetchone()
    if row is not None:
        return JobState(row["state"])
    job = await get(conn, job_id)
    if job is None:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    return Refused(RefusalCode.NOT_CANCELLABLE, f"job {job_id} is already {job['state']}")


async def redrive(
    conn: Conn, job_id: int, *, force: bool = False, now: datetime | None = None
) -> Refused | None:
    """Put a failed or parked job back to pending; ``None`` on success, else ``Refused`` with its code.

    Of two redrives racing for one job exactly one wins; the other finds it pending: ``not_redrivable``.
    """
    row = await (
        await conn.execute(Q["job_redrive_if_allowed"], {"job_id": job_id, "force": force, "now": now})
    ).fetchone()
    if row is not None:
        return None
    job = await get(conn, job_id)
    if job is None:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    if job["state"] not in REDRIVABLE_STATES:
        return Refused(
            RefusalCode.NOT_REDRIVABLE,
            f"job {job_id} is {job['state']}; only failed and parked jobs can be redriven",
        )
    if job["payload_purged"]:
        return Refused(
            RefusalCode.PAYLOAD_PURGED,
            f"job {job_id} finished before its retention window; its payload is purged",
        )
    if job["unrecoverable"] and not force:
        return Refused(
            RefusalCode.UNRECOVERABLE_REQUIRES_FORCE, f"job {job_id} failed unrecoverably; redrive with force"
        )
    if job["lock_key_held_by"] is not None:
        return Refused(
            RefusalCode.LOCK_KEY_HELD,
            f"job {job['lock_key_held_by']} holds lock key {job['lock_key']!r}; wait for it or cancel it",
        )
    # The job changed between the redrive and this read (another redrive won, say): nothing to redrive.
    return Refused(RefusalCode.NOT_REDRIVABLE, f"job {job_id} could not be redriven from {job['state']}")


async def listen(conn: Conn) -> None:
    """Subscribe ``conn`` to job wake-ups (new, re-queued and redriven jobs); read them with
    ``conn.notifies()``. The payload is the job's kind; a wake-up promises nothing but "fetch now"."""
    await conn.execute(Q["job_notifications_listen"])
