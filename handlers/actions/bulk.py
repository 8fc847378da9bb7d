"""Bulk redrive, cancel and resolve: every job a filter matches, one at a time through the single-job actions.

Each job goes through the same fenced statement as ``jobs redrive`` / ``jobs cancel`` / ``jobs resolve`` (a
cancel or a resolution also runs its kind's ``on_transition``), so a bulk action refuses exactly what the single action would, and the summary
counts the refusals by code. A dry run does all of it inside one transaction that is rolled back: what it
reports is what the real run would do at that moment (wake-ups are sent at commit, so none leave).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import audit, filters, resolutions

from ..registry import Registry
from . import control

Action = Literal["redrive", "cancel", "resolve"]
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class BulkResult:
    """What a bulk action did (or, dry, would do): jobs matched, done, refused by code."""

    action: str
    dry_run: bool
    matched: list[int] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    refused: dict[str, list[int]] = field(default_factory=dict)
    # Redriven (with force) although a step recorded a terminal error the next run replays without calling
    # the provider; without force those are refused ``recorded_failure_requires_force``.
    replaying: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """Counts, as the CLI and the API print them."""
        return {
            "action": self.action,
            "dry_run": self.dry_run,
            "matched": len(self.matched),
            "done": len(self.done),
            "refused": {code: len(ids) for code, ids in sorted(self.refused.items())},
            "replaying_recorded_failure": len(self.replaying),
        }


async def run(
    conn: db.Conn,
    registry: Registry,
    action: Action,
    where: filters.JobFilter,
    *,
    by: str,
    reason: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> BulkResult:
    """Apply ``action`` to every job ``where`` matches; ``progress(done, total)`` after each job.

    ``resolve`` needs a reason of its own; a reason that is not an operator's (``audit.check_note``) is
    ``InvalidParameter`` before anything is matched."""
    if action == "resolve":
        why: str | None = resolutions.check_reason(reason)
    elif action == "redrive":
        why = audit.check_note(reason)
    else:
        why = audit.check_note(reason) or "cancelled by operator"
    result = BulkResult(action, dry_run)
    result.matched = await filters.match(conn, where)
    if dry_run:
        async with conn.transaction(force_rollback=True):
            await _apply(conn, registry, action, result, by=by, reason=why, force=force, progress=progress)
    else:
        await _apply(conn, registry, action, result, by=by, reason=why, force=force, progress=progress)
    return result


async def _apply(
    conn: db.Conn,
    registry: Registry,
    action: Action,
    result: BulkResult,
    *,
    by: str,
    reason: str | None,
    force: bool,
    progress: Progress | None,
) -> None:
    total = len(result.matched)
    for n, job_id in enumerate(result.matched, 1):
        refusal: jobs.Refused | None
        if action == "redrive":
            replays = await audit.replayed_failures(conn, job_id) if force else []
            refusal = await jobs.redrive(conn, job_id, by=by, reason=reason, force=force)
            if refusal is None and replays:
                result.replaying.append(job_id)
        elif action == "resolve":
            resolved = await control.resolve(conn, registry, job_id, by=by, reason=reason or "")
            refusal = resolved if isinstance(resolved, jobs.Refused) else None
        else:
            outcome = await control.cancel(
                conn, registry, job_id, by=by, reason=reason or "cancelled by operator"
            )
            refusal = outcome if isinstance(outcome, jobs.Refused) else None
        if refusal is None:
            result.done.append(job_id)
        else:
            result.refused.setdefault(refusal.code, []).append(job_id)
        if progress is not None:
            progress(n, total)
