"""Operator actions that end a job outside a worker, with the kind's ``on_transition`` in the same
transaction — so a user's own row mirrors a cancel or a resolution by hand exactly as it mirrors a
worker's terminal state."""

from __future__ import annotations

import logging

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import resolutions
from effectgate.ledger.vocabulary import JobState

from ..event import Transition
from ..registry import Registry

log = logging.getLogger("effectgate.control")


async def cancel(
    conn: db.Conn,
    registry: Registry,
    job_id: int,
    *,
    by: str,
    reason: str = "cancelled by operator",
) -> JobState | jobs.Refused:
    """Cancel a job (at once if pending, by flag if running); returns its state or ``Refused``.

    A pending job ends ``cancelled`` here, and its kind's ``on_transition`` runs in the same
    transaction. A hook that raises is logged and the cancel is made without it: an operator's
    cancel must not be blocked by a mirror that fails (a running job's cancel ends in its worker,
    which runs the hook there).
    """
    try:
        async with conn.transaction():
            outcome = await jobs.cancel(conn, job_id, by=by, reason=reason)
            if outcome == JobState.CANCELLED:
                await _mirror(conn, registry, job_id)
        return outcome
    except _HookFailed as exc:
        log.error("control.on_transition_failed", extra={"job_id": job_id, "error": str(exc.__cause__)})
        return await jobs.cancel(conn, job_id, by=by, reason=reason)


async def resolve(
    conn: db.Conn, registry: Registry, job_id: int, *, by: str, reason: str
) -> resolutions.Resolved | jobs.Refused:
    """Resolve a failed or parked job by hand (``ledger.jobs.resolutions.resolve``); its kind's
    ``on_transition`` sees state ``resolved`` with the operator's reason, in the same transaction.

    As for a cancel, a hook that raises is logged and the resolution is made without it. A repeated
    resolution (``already``) changes nothing and runs no hook.
    """
    try:
        async with conn.transaction():
            outcome = await resolutions.resolve(conn, job_id, by=by, reason=reason)
            if isinstance(outcome, resolutions.Resolved) and not outcome.already:
                await _mirror(conn, registry, job_id, JobState.RESOLVED, outcome.resolved_reason)
        return outcome
    except _HookFailed as exc:
        log.error("control.on_transition_failed", extra={"job_id": job_id, "error": str(exc.__cause__)})
        return await resolutions.resolve(conn, job_id, by=by, reason=reason)


class _HookFailed(Exception):
    pass


async def _mirror(
    conn: db.Conn,
    registry: Registry,
    job_id: int,
    state: JobState = JobState.CANCELLED,
    reason: str | None = None,
) -> None:
    job = await jobs.get(conn, job_id)
    if job is None:
        return
    kind = registry.get(job["kind"])
    if kind is None or kind.on_transition is None:
        return
    try:
        await kind.on_transition(
            conn, Transition(job_id, job["effect_key"], state, reason or job["terminal_reason"])
        )
    except Exception as exc:
        raise _HookFailed from exc
