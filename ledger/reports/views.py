"""The ledger's read-only views that are not listing reports: one effect's lineage from delivery to outcome
(``effect_view``), one job (``job_view``), the job gauges ``/metrics`` reads (``job_gauges``) and the
dashboard's series over time (``activity``). ``ledger.reports`` re-exports them: it is the one read path
of the CLI, the HTTP API and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString

from .. import jobs
from ..db import Conn
from ..errors import InvalidParameter
from ..jobs import audit
from ..payload_diffs import payload_diff
from ..queries import Q
from .spec import Row, fetch


@dataclass(frozen=True, slots=True)
class EffectView:
    """One effect from delivery to outcome: the claim, every delivery that asked for it (accepted or
    duplicate), every reject of its key (with a diff against the held payload), its job with each attempt
    (worker, lease token, start, end, error), each recorded step with the idempotency key sent
    downstream and the answer that came back, and every operator action on its job (with its kind's pauses
    and resumes in the job's lifetime). ``job`` is ``None`` only if no job was ever created."""

    effect: dict[str, Any]
    job: jobs.JobRow | None
    deliveries: list[dict[str, Any]]
    rejects: list[dict[str, Any]]
    attempts: list[jobs.AttemptRow]
    steps: list[dict[str, Any]]
    actions: list[audit.ActionRow]


async def effect_view(conn: Conn, effect_key: str, *, tenant: str | None = None) -> EffectView | None:
    """The lineage of one effect, or ``None`` when no such effect was ever claimed.

    Without a tenant, the key is looked up in every tenant; a key held by several raises
    ``InvalidParameter`` with code ``tenant_required``.
    """
    key = effect_key
    if not key:
        raise InvalidParameter("key", "an effect key is required")
    holder = tenant
    if holder is None:
        tenants = [r["tenant"] for r in await _fetch(conn, "effect_tenants_holding_key", {"effect_key": key})]
        if not tenants:
            return None
        if len(tenants) > 1:
            raise InvalidParameter(
                "tenant",
                f"effect key {key!r} is held by several tenants ({', '.join(tenants)}); name one",
                code="tenant_required",
            )
        holder = tenants[0]
    rows = await _fetch(conn, "effect_by_key", {"tenant": holder, "effect_key": key})
    if not rows:
        return None
    effect = rows[0]
    job_id = effect.pop("job_id")
    job = await jobs.get(conn, job_id) if job_id is not None else None
    params = {"effect_id": effect["id"]}
    deliveries = await _fetch(conn, "effect_deliveries", params)
    rejects = await _fetch(conn, "effect_rejects_for_effect", params)
    for reject in rejects:
        reject["diff"], reject["diff_truncated"] = payload_diff(
            effect["payload"], reject.pop("rejected_payload")
        )
    attempts = await jobs.attempts(conn, job_id) if job_id is not None else []
    steps = await _fetch(conn, "steps_for_effect", {**params, "tenant": holder})
    actions = await _actions(conn, job) if job is not None else []
    return EffectView(effect, job, deliveries, rejects, attempts, steps, actions)


@dataclass(frozen=True, slots=True)
class JobView:
    """One job with its effect's key, each attempt, each recorded step and every operator action."""

    job: jobs.JobRow
    attempts: list[jobs.AttemptRow]
    steps: list[dict[str, Any]]
    actions: list[audit.ActionRow]


async def job_view(conn: Conn, job_id: int) -> JobView | None:
    """One job, or ``None`` when there is no such job."""
    job = await jobs.get(conn, job_id)
    if job is None:
        return None
    attempts = await jobs.attempts(conn, job["id"])
    steps = await _fetch(conn, "steps_for_effect", {"effect_id": job["effect_id"], "tenant": job["tenant"]})
    return JobView(job, attempts, steps, await _actions(conn, job))


async def _actions(conn: Conn, job: jobs.JobRow) -> list[audit.ActionRow]:
    return await audit.for_job(
        conn,
        job["id"],
        kind=job["kind"],
        since=job["created_at"],
        until=job["finished_at"],
        tenant=job["tenant"],
    )


async def _fetch(conn: Conn, name: LiteralString, params: dict[str, Any]) -> list[Row]:
    return await fetch(conn, Q[name], params)


@dataclass(frozen=True, slots=True)
class JobGauges:
    """What a metrics scrape reads from the ledger: counts of jobs not done by (state, kind), and how long
    the longest-waiting due job has waited (0 when none waits)."""

    by_state_kind: list[dict[str, Any]]
    oldest_due_seconds: float


async def job_gauges(conn: Conn, *, now: datetime | None = None) -> JobGauges:
    """Pending, running, failed and parked jobs by kind, and the age of the oldest due pending job."""
    rows = await _fetch(conn, "metrics_jobs_not_done_by_state_kind", {})
    [oldest] = await _fetch(conn, "metrics_oldest_due_job", {"now": now})
    waited = (oldest["now"] - oldest["run_at"]).total_seconds() if oldest["run_at"] is not None else 0.0
    return JobGauges(rows, max(waited, 0.0))


MAX_BUCKETS = 400


@dataclass(frozen=True, slots=True)
class Activity:
    """Duplicate deliveries, key conflicts and authentication failures per bucket (an hour for windows of
    up to three days, else a day) of the window, oldest first, every bucket present."""

    since: datetime
    until: datetime
    bucket: timedelta
    rows: list[dict[str, Any]]


async def activity(
    conn: Conn,
    *,
    since: datetime,
    until: datetime,
    source: str | None = None,
) -> Activity:
    """What arrived twice or was turned away in [since, until), hourly up to three days, else daily."""
    if since >= until:
        raise InvalidParameter("until", f"must be after since ({since.isoformat()}), got {until.isoformat()}")
    span = until - since
    bucket = timedelta(hours=1) if span <= timedelta(days=3) else timedelta(days=1)
    if span / bucket > MAX_BUCKETS:
        raise InvalidParameter("since", f"the window is too long for a chart: at most {MAX_BUCKETS} days")
    rows = await _fetch(
        conn,
        "report_activity",
        {
            "bucket": bucket,
            "since": since,
            "until": until,
            "source": source,
        },
    )
    return Activity(since, until, bucket, rows)
