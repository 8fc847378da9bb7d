"""Terminal transitions: a worker's job reaching succeeded, failed or parked, many in one statement.

Each row is fenced by its own token (a stale one changes nothing and answers ``None``), and one row never
fails the others: what Postgres refuses for one row's data is split off and written with a stand-in
reason, so the job still reaches its terminal state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..error_kinds import error_kind
from ..errors import LeaseLost, LedgerError
from ..queries import Q
from ..storable import storable_record, storable_text
from ..vocabulary import TERMINAL_STATES, JobState

# How much of Postgres's refusal a stand-in terminal reason quotes.
MAX_REFUSAL_TEXT = 300

log = logging.getLogger("effectgate.ledger.jobs.leases")


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
    # The job's tenant, which the statement matches the row on (read from the job where not given); with
    # ``finish_many`` on a distributed ledger the batch is written one tenant at a time.
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
    conn: Conn,
    transitions: Sequence[Finish],
    *,
    now: datetime | None = None,
    topology: Topology = SINGLE_NODE,
    guarded: bool = True,
) -> list[Reached | LedgerError | None]:
    """Many terminal transitions in one statement, each fenced by its own token; as ``finish`` each.

    Returns one answer per transition, in order: where the job got to, or ``None`` where the token no
    longer held it — that row changed nothing, and the others were made all the same — or, where
    Postgres refused even the stand-in below for that row, a ``LedgerError`` for it alone.

    One row never fails the others. Every reason and error record is made storable first (an error
    record Postgres would refuse is rewritten, and says so under ``unstorable``); a batch Postgres still
    refuses for what a row holds is split until that row stands alone, and that row alone is then
    written with a replacement reason and error record naming the refusal (``UnstorableOutcome``).

    Where ``topology.distributed`` (a ledger distributed by tenant on Citus): one statement per tenant, each
    routed to its shard (deploy/README.md, "Past one Postgres").

    Inside the caller's transaction each statement runs in a savepoint, so that a batch Postgres refuses
    can be split there. ``guarded=False`` (not where distributed) sends the one statement without the
    savepoint, two round trips fewer, and does not split: any error propagates, the caller's transaction is
    aborted, and the caller must roll it back and may do it all again guarded (the worker's finish batch).
    """
    if not transitions:
        return []
    storable = await _with_tenants([_storable_finish(t) for t in transitions], conn)
    if not guarded and not topology.distributed:
        return [*await _finish_rows(conn, storable, now, savepoint=False)]
    if not topology.distributed:
        return await _finish_split(conn, storable, now)
    groups: dict[str | None, list[Finish]] = {}
    for t in storable:
        groups.setdefault(t.tenant, []).append(t)
    answers: dict[int, Reached | LedgerError | None] = {}
    for group in groups.values():
        answers.update(zip((id(t) for t in group), await _finish_split(conn, group, now), strict=True))
    return [answers[id(t)] for t in storable]


async def _with_tenants(transitions: list[Finish], conn: Conn) -> list[Finish]:
    """Each transition with its job's tenant: the statement matches a row by its whole primary key. The
    worker always knows it (its lease's); another caller's is read here, one statement for the batch."""
    missing = [t.job_id for t in transitions if t.tenant is None]
    if not missing:
        return transitions
    rows = await (await conn.execute(Q["job_tenants_get"], {"job_ids": missing})).fetchall()
    tenants = {row["id"]: row["tenant"] for row in rows}
    # A job that does not exist keeps no tenant: its row matches nothing and its answer is None, as a
    # token that no longer holds.
    return [t if t.tenant is not None else replace(t, tenant=tenants.get(t.job_id)) for t in transitions]


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


async def _finish_rows(
    conn: Conn, transitions: list[Finish], now: datetime | None, *, savepoint: bool = True
) -> list[Reached | None]:
    params = {
        "job_ids": [t.job_id for t in transitions],
        "tenants": [t.tenant for t in transitions],
        "lease_tokens": [t.lease_token for t in transitions],
        "states": [t.state for t in transitions],
        "bys": [t.by for t in transitions],
        "reasons": [t.reason for t in transitions],
        "errors": [json.dumps(t.error) if t.error is not None else None for t in transitions],
        "unrecoverables": [t.unrecoverable for t in transitions],
        "now": now,
        # One tenant's batch (distributed), else none: each row is still matched on its own tenant.
        "tenant": transitions[0].tenant if len({t.tenant for t in transitions}) == 1 else None,
    }
    if savepoint and conn.info.transaction_status:
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
