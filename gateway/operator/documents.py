"""The JSON documents of the operator reports: what ``/api/…`` answers and ``--format json`` prints.

Fields are picked by name, not passed through from ledger rows: the documents are a contract (described
by ``/api/openapi.json``), and a column added to a ledger query must not change them by accident.
Times are RFC 3339 in UTC (``2025-03-04T11:00:00Z``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from effectgate.ledger import reports
from effectgate.ledger.jobs import resolutions


def _fields(spec: reports.ReportSpec) -> tuple[str, ...]:
    return tuple(c.name for c in spec.columns)


# The report documents are built from the specs (``reporting.document``); these name their item fields.
DUPLICATE_FIELDS = _fields(reports.DUPLICATES)
CONFLICT_FIELDS = _fields(reports.KEY_CONFLICTS)
REFUSED_FIELDS = _fields(reports.REFUSED_DELIVERIES)
AUTH_MINUTE_FIELDS = _fields(reports.AUTH_FAILURES)
JOB_FIELDS = _fields(reports.JOBS)
JOB_DETAIL_FIELDS = (
    *JOB_FIELDS,
    "orphan_policy",
    "last_error",
    "checkpoint",
    "lock_key",
    "lock_key_held_by",
    "resolved_from",
)
ATTEMPT_FIELDS = (
    "attempt",
    "lease_token",
    "worker",
    "started_at",
    "finished_at",
    "outcome",
    "error_type",
    "error_message",
    "error_facts",
    "traceback",
)
STEP_FIELDS = (
    "name",
    "idempotency_key",
    "status",
    "result",
    "error",
    "found",
    "job_id",
    "lease_token",
    "recorded_at",
)
# An operator's action on the job (or on its kind, within the job's lifetime): ledger.jobs.audit.
ACTION_FIELDS = ("action", "acted_by", "reason", "detail", "acted_at")
EFFECT_FIELDS = (
    "tenant",
    "effect_key",
    "source",
    "handler",
    "event_id",
    "event_type",
    "fingerprint",
    "payload",
    "delivery_count",
    "reject_count",
    "first_seen_at",
    "last_seen_at",
)
DELIVERY_FIELDS = (
    "request_id",
    "received_at",
    "source",
    "event_id",
    "event_type",
    "outcome",
    "fingerprint",
    "secret_index",
)
EFFECT_REJECT_FIELDS = (
    "event_id",
    "event_type",
    "rejected_fingerprint",
    "received_at",
    "diff",
    "diff_truncated",
)


def timestamp(value: datetime) -> str:
    """An aware datetime as RFC 3339 in UTC with a ``Z``."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as RFC 3339 strings, ready for ``json.dumps``."""
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def dumps(document: Any) -> str:
    """A document as compact JSON text."""
    return json.dumps(jsonable(document), ensure_ascii=False, separators=(",", ":"))


def pick(row: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The named fields of a row (``None`` for one the row lacks), as JSON values."""
    return {f: jsonable(row.get(f)) for f in fields}


def _rows(rows: Iterable[Mapping[str, Any]], fields: Iterable[str]) -> list[dict[str, Any]]:
    names = tuple(fields)
    return [pick(r, names) for r in rows]


def effect(view: reports.EffectView) -> dict[str, Any]:
    """The lineage document of one effect."""
    return {
        "effect": pick(view.effect, EFFECT_FIELDS),
        "job": pick(view.job, JOB_DETAIL_FIELDS) if view.job is not None else None,
        "deliveries": _rows(view.deliveries, DELIVERY_FIELDS),
        "rejects": _rows(view.rejects, EFFECT_REJECT_FIELDS),
        "attempts": _rows(view.attempts, ATTEMPT_FIELDS),
        "steps": _rows(view.steps, STEP_FIELDS),
        "actions": _rows(view.actions, ACTION_FIELDS),
    }


def job(view: reports.JobView) -> dict[str, Any]:
    """The document of one job with its attempts, steps and the operators' actions."""
    return {
        "job": pick(view.job, JOB_DETAIL_FIELDS),
        "attempts": _rows(view.attempts, ATTEMPT_FIELDS),
        "steps": _rows(view.steps, STEP_FIELDS),
        "actions": _rows(view.actions, ACTION_FIELDS),
    }


def resolution(outcome: resolutions.Resolved) -> dict[str, Any]:
    """The answer to a resolution by hand: the job, its state, which state it closed, who, why, when, and
    whether it repeats one made earlier (``already``)."""
    return {
        "job_id": outcome.job_id,
        "state": outcome.state,
        "resolved_from": outcome.resolved_from,
        "resolved_at": outcome.resolved_at,
        "resolved_by": outcome.resolved_by,
        "resolved_reason": outcome.resolved_reason,
        "already": outcome.already,
    }
