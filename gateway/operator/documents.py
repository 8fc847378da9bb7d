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

DUPLICATE_FIELDS = (
    "tenant",
    "effect_key",
    "source",
    "event_type",
    "delivery_count",
    "first_seen_at",
    "last_seen_at",
)
CONFLICT_FIELDS = (
    "tenant",
    "effect_key",
    "source",
    "event_id",
    "event_type",
    "received_at",
    "held_event_id",
    "held_event_type",
    "held_fingerprint",
    "rejected_fingerprint",
    "diff",
    "diff_truncated",
)
AUTH_REASON_FIELDS = ("source", "reason", "count", "bytes_total", "first_minute", "last_seen_at")
AUTH_MINUTE_FIELDS = ("minute", "source", "reason", "count", "bytes_total", "last_detail", "last_seen_at")
JOB_FIELDS = (
    "id",
    "tenant",
    "kind",
    "state",
    "effect_key",
    "source",
    "event_type",
    "attempt",
    "max_attempts",
    "run_at",
    "lease_token",
    "lease_owner",
    "lease_expires_at",
    "cancel_requested",
    "unrecoverable",
    "terminal_reason",
    "terminal_by",
    "created_at",
    "updated_at",
    "finished_at",
)
JOB_DETAIL_FIELDS = (*JOB_FIELDS, "orphan_policy", "last_error", "checkpoint", "lock_key", "lock_key_held_by")
ATTEMPT_FIELDS = (
    "attempt",
    "lease_token",
    "worker",
    "started_at",
    "finished_at",
    "outcome",
    "error_type",
    "error_message",
    "traceback",
)
STEP_FIELDS = ("name", "idempotency_key", "status", "result", "error", "job_id", "lease_token", "recorded_at")
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


def duplicates(report: reports.DuplicatesReport) -> dict[str, Any]:
    """The duplicates report document."""
    return {
        "since": timestamp(report.since),
        "until": timestamp(report.until),
        "sort": report.sort,
        "items": _rows(report.items, DUPLICATE_FIELDS),
        "next_cursor": report.next_cursor,
        "totals": jsonable(report.totals),
    }


def conflicts(report: reports.ConflictsReport) -> dict[str, Any]:
    """The key-conflicts report document."""
    return {
        "since": timestamp(report.since),
        "until": timestamp(report.until),
        "sort": report.sort,
        "items": _rows(report.items, CONFLICT_FIELDS),
        "next_cursor": report.next_cursor,
        "totals": jsonable(report.totals),
    }


def auth_failures(report: reports.AuthFailuresReport) -> dict[str, Any]:
    """The authentication-failures report document."""
    return {
        "since": timestamp(report.since),
        "until": timestamp(report.until),
        "by_reason": _rows(report.by_reason, AUTH_REASON_FIELDS),
        "per_minute": _rows(report.per_minute, AUTH_MINUTE_FIELDS),
        "next_cursor": report.next_cursor,
    }


def effect(view: reports.EffectView) -> dict[str, Any]:
    """The lineage document of one effect."""
    return {
        "effect": pick(view.effect, EFFECT_FIELDS),
        "job": pick(view.job, JOB_DETAIL_FIELDS) if view.job is not None else None,
        "deliveries": _rows(view.deliveries, DELIVERY_FIELDS),
        "rejects": _rows(view.rejects, EFFECT_REJECT_FIELDS),
        "attempts": _rows(view.attempts, ATTEMPT_FIELDS),
        "steps": _rows(view.steps, STEP_FIELDS),
    }


def jobs(report: reports.JobsReport) -> dict[str, Any]:
    """The jobs list document."""
    return {
        "since": timestamp(report.since) if report.since else None,
        "until": timestamp(report.until) if report.until else None,
        "sort": report.sort,
        "items": _rows(report.items, JOB_FIELDS),
        "next_cursor": report.next_cursor,
    }


def job(view: reports.JobView) -> dict[str, Any]:
    """The document of one job with its attempts and steps."""
    return {
        "job": pick(view.job, JOB_DETAIL_FIELDS),
        "attempts": _rows(view.attempts, ATTEMPT_FIELDS),
        "steps": _rows(view.steps, STEP_FIELDS),
    }
