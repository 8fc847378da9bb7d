"""A job as the operator sees and changes it: its row and attempts, cancel and redrive, and their refusals."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, cast

from ..db import Conn
from ..queries import Q
from ..storable import storable_text
from ..vocabulary import REDRIVABLE_STATES, JobState, RefusalCode
from . import audit


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
    # Set when an operator resolved the job by hand (ledger/jobs/resolutions.py): the state it closed, when, who, why.
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
    # The rest of the error record, where known: code, http_status, request_id (the provider's), decline_code.
    error_facts: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Refused:
    """An operator action that was not carried out, with a machine-readable code.

    Codes: ``not_found``; for cancel ``not_cancellable``; for redrive ``not_redrivable`` (succeeded,
    cancelled and live jobs), ``unrecoverable_requires_force``, ``recorded_failure_requires_force`` (a
    step recorded a terminal error, such as a card decline, that the next run replays without calling the
    provider), ``lock_key_held`` (another live job holds the lock key: wait for it or cancel it).
    """

    code: RefusalCode
    detail: str


async def routing(conn: Conn, job_id: int) -> tuple[bool, str | None]:
    """Where an operator's write to job ``job_id`` goes: ``(True, its tenant)``, read by id (on Citus a read of
    every shard: the operator knows the id, not the tenant), or ``(False, None)`` when there is no such job.
    The write then names the tenant, which Citus needs (it refuses, or sends to every shard, a write that
    names none) and one Postgres matches on its primary key: one read that is right on every topology, so an
    operator's action needs no topology."""
    row = await (await conn.execute(Q["job_tenant_get"], {"job_id": job_id})).fetchone()
    return (False, None) if row is None else (True, row["tenant"])


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
    found, tenant = await routing(conn, job_id)
    if not found:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    async with conn.transaction():
        row = await (
            await conn.execute(
                Q["job_cancel"],
                {
                    "job_id": job_id,
                    "by": storable_text(by),
                    "reason": storable_text(reason),
                    "now": now,
                    "tenant": tenant,
                },
            )
        ).fetchone()
        if row is not None:
            state = JobState(row["state"])
            done = "cancelled" if state == JobState.CANCELLED else "cancel_requested"
            await audit.record(
                conn,
                "cancel",
                by=by,
                reason=reason,
                job_id=job_id,
                tenant=tenant,
                detail={"result": done},
                now=now,
            )
            return state
    job = await get(conn, job_id)
    if job is None:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    return Refused(RefusalCode.NOT_CANCELLABLE, f"job {job_id} is already {job['state']}")


async def redrive(
    conn: Conn,
    job_id: int,
    *,
    by: str,
    reason: str | None = None,
    force: bool = False,
    now: datetime | None = None,
) -> Refused | None:
    """Put a failed or parked job back to pending; ``None`` on success, else ``Refused`` with its code.
    The redrive is recorded (``audit``) with who, why, ``force`` and the recorded failures it replays.

    A job whose effect recorded a terminal error in a step (a card decline) is refused without ``force``:
    its next run replays that error without calling the provider, so a redrive alone changes nothing
    (``audit.replayed_failures`` names the steps). Of two redrives racing for one job exactly one wins;
    the other finds it pending: ``not_redrivable``.
    """
    found, tenant = await routing(conn, job_id)
    if not found:
        return Refused(RefusalCode.NOT_FOUND, f"no job {job_id}")
    async with conn.transaction():
        replays = await audit.replayed_failures(conn, job_id, tenant=tenant)
        row = await (
            await conn.execute(
                Q["job_redrive_if_allowed"], {"job_id": job_id, "force": force, "now": now, "tenant": tenant}
            )
        ).fetchone()
        if row is not None:
            detail: dict[str, object] = {"force": force}
            if replays:
                detail["replays"] = [{"step": f.step, "code": f.code, "message": f.message} for f in replays]
            await audit.record(
                conn, "redrive", by=by, reason=reason, job_id=job_id, tenant=tenant, detail=detail, now=now
            )
    if row is not None:
        # After the commit, from this session (on Citus, the coordinator, where the workers listen). A wake-up
        # lost to a crash right here costs the workers a poll interval, never the redrive.
        await conn.execute(Q["jobs_notify"], {"kinds": [row["kind"]]})
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
    if replays and not force:
        steps = ", ".join(f.describe() for f in replays)
        return Refused(
            RefusalCode.RECORDED_FAILURE_REQUIRES_FORCE,
            f"job {job_id} recorded a terminal error in step {steps}; a redrive replays it without calling the"
            " provider, so the job fails again the same way. Redrive with force to run it anyway (its other"
            " steps run), or resolve it by hand",
        )
    if job["lock_key_held_by"] is not None:
        return Refused(
            RefusalCode.LOCK_KEY_HELD,
            f"job {job['lock_key_held_by']} holds lock key {job['lock_key']!r}; wait for it or cancel it",
        )
    # The job changed between the redrive and this read (another redrive won, say): nothing to redrive.
    return Refused(RefusalCode.NOT_REDRIVABLE, f"job {job_id} could not be redriven from {job['state']}")
