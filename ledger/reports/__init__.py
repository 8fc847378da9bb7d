"""Read-only views of the ledger for operators: the one code path the CLI, the HTTP API and the dashboard read.

The listing reports are declared once each, as a ``ReportSpec`` (``spec.py``) over one SQL block:
``DUPLICATES``, ``KEY_CONFLICTS`` (with a field-level diff of the held and rejected payloads),
``AUTH_FAILURES`` and ``JOBS``; ``REPORTS`` lists them, and ``run`` runs any of them. Next to them,
declared in ``views.py`` and re-exported here so every reader has one module to ask: ``effect_view`` (an
effect's lineage from delivery to outcome), ``job_view``, ``activity`` (the dashboard's series over time)
and ``job_gauges`` (what ``/metrics`` reads). The payload diff is ``payload_diffs.py``.

Everything here takes typed values (datetimes, ints, tuples of states); reading text (``24h``, a
cursor) is the gateway's business. Pages are keyset-paginated on (sort columns, id), so a page costs the
same at any depth and rows inserted meanwhile neither repeat nor vanish.
"""

from __future__ import annotations

from datetime import timedelta
from typing import LiteralString

from ..errors import InvalidParameter
from ..payload_diffs import payload_diff
from ..vocabulary import JobState
from .spec import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    MAX_NAME_LENGTH,
    Column,
    ColumnType,
    Filter,
    FilterType,
    Page,
    ReportQuery,
    ReportSpec,
    Row,
    Sort,
    Summary,
    by_name,
    run,
)
from .views import Activity, EffectView, JobGauges, JobView, activity, effect_view, job_gauges, job_view

__all__ = [
    "AUTH_FAILURES",
    "DEFAULT_LIMIT",
    "DUPLICATES",
    "JOBS",
    "JOB_STATES",
    "KEY_CONFLICTS",
    "MAX_LIMIT",
    "MAX_NAME_LENGTH",
    "REFUSED_DELIVERIES",
    "REPORTS",
    "Activity",
    "EffectView",
    "InvalidParameter",
    "JobGauges",
    "JobView",
    "Page",
    "ReportQuery",
    "ReportSpec",
    "activity",
    "effect_view",
    "job_gauges",
    "job_view",
    "payload_diff",
    "run",
]

DEFAULT_WINDOW = timedelta(hours=24)
MAX_KEY_LENGTH = 1000
JOB_STATES = tuple(JobState)

T = ColumnType
_SOURCE = Filter("source", FilterType.NAME, "Only this webhook source.")
_TENANT = Filter("tenant", FilterType.NAME, "Only this tenant.")
_EVENT_TYPE = Filter("event_type", FilterType.NAME, "Only this event type.")
_EVENT_ID = Filter("event_id", FilterType.NAME, "Only this event id.")


def _sorts(*named: tuple[str, tuple[LiteralString, ...], str]) -> tuple[Sort, ...]:
    # (name, keyset columns, help); a name starting with "-" is descending.
    return tuple(Sort(name, columns, name.startswith("-"), help) for name, columns, help in named)


FIELDS: dict[str, Column] = {
    c.name: c
    for c in (
        Column("tenant", T.TEXT, "tenant"),
        Column("effect_key", T.TEXT, "key"),
        Column("source", T.TEXT, "source"),
        Column("event_type", T.TEXT, "event type"),
        Column("delivery_count", T.INTEGER, "deliveries"),
        Column("first_seen_at", T.TIME, "first seen"),
        Column("last_seen_at", T.TIME, "last seen"),
        Column("effects", T.INTEGER, "effects"),
        Column("deliveries", T.INTEGER, "deliveries"),
        Column("duplicate_deliveries", T.INTEGER, "duplicates"),
        Column("event_id", T.TEXT, "event"),
        Column("received_at", T.TIME, "received"),
        Column("held_event_id", T.TEXT, "held by"),
        Column("held_event_type", T.TEXT, "held event type"),
        Column("held_fingerprint", T.TEXT, "held fingerprint"),
        Column("rejected_fingerprint", T.TEXT, "rejected fingerprint"),
        Column("diff", T.DIFF, "changes (held → rejected)"),
        Column("diff_truncated", T.BOOLEAN, "diff cut short"),
        Column("rejects", T.INTEGER, "rejects"),
        Column("minute", T.TIME, "minute"),
        Column("reason", T.TEXT, "reason"),
        Column("count", T.INTEGER, "count"),
        Column("bytes_total", T.INTEGER, "bytes"),
        Column("last_detail", T.TEXT, "last detail"),
        Column("hint", T.TEXT, "diagnosis", nullable=True),
        Column("handler", T.TEXT, "handler", nullable=True),
        Column("error", T.TEXT, "error", nullable=True),
        Column("refusal_detail", T.TEXT, "detail", nullable=True),
        Column("replayed_at", T.TIME, "replayed", nullable=True),
        Column("body_bytes", T.INTEGER, "body bytes", nullable=True),
        Column("replayable", T.BOOLEAN, "replayable"),
        Column("first_minute", T.TIME, "first minute"),
        Column("id", T.INTEGER, "id"),
        Column("kind", T.TEXT, "kind"),
        Column("state", T.STATE, "state"),
        Column("attempt", T.INTEGER, "attempt"),
        Column("max_attempts", T.INTEGER, "max attempts"),
        Column("run_at", T.TIME, "run at"),
        Column("lease_token", T.INTEGER, "lease token"),
        Column("lease_owner", T.TEXT, "worker", nullable=True),
        Column("lease_expires_at", T.TIME, "lease expires", nullable=True),
        Column("cancel_requested", T.BOOLEAN, "cancel requested"),
        Column("unrecoverable", T.BOOLEAN, "unrecoverable"),
        Column("terminal_reason", T.TEXT, "reason", nullable=True),
        Column("terminal_by", T.TEXT, "ended by", nullable=True),
        Column("created_at", T.TIME, "created"),
        Column("updated_at", T.TIME, "updated"),
        Column("finished_at", T.TIME, "finished", nullable=True),
        Column("resolved_at", T.TIME, "resolved", nullable=True),
        Column("resolved_by", T.TEXT, "resolved by", nullable=True),
        Column("resolved_reason", T.TEXT, "resolution", nullable=True),
        Column("accepted", T.INTEGER, "accepted"),
        Column("duplicates", T.INTEGER, "duplicates"),
        Column("rejected", T.INTEGER, "rejected"),
        Column("unmatched", T.INTEGER, "unmatched"),
        Column("superseded", T.INTEGER, "superseded"),
        Column("refused", T.INTEGER, "refused"),
        Column("duplicate_rate", T.NUMBER, "duplicate rate"),
        Column("reject_rate", T.NUMBER, "reject rate"),
    )
}


def _names(names: str) -> tuple[str, ...]:
    return tuple(names.split())


def _columns(names: str) -> tuple[Column, ...]:
    return tuple(FIELDS[name] for name in names.split())


DUPLICATES = ReportSpec(
    name="duplicates",
    title="Effects delivered more than once",
    description="Effects whose last delivery fell in [since, until) (default: the last 24 hours), "
    "with totals over the whole window by source and event type.",
    query="report_duplicates",
    filters=(_SOURCE, _TENANT, _EVENT_TYPE),
    sorts=_sorts(
        ("-last_seen", ("last_seen_at", "id"), "most recently delivered first"),
        ("last_seen", ("last_seen_at", "id"), "least recently delivered first"),
        ("-first_seen", ("first_seen_at", "id"), "most recently claimed first"),
        ("first_seen", ("first_seen_at", "id"), "claimed longest ago first"),
        ("-deliveries", ("delivery_count", "id"), "most deliveries first"),
    ),
    columns=_columns("tenant effect_key source event_type delivery_count first_seen_at last_seen_at"),
    table=_names("last_seen_at delivery_count source event_type tenant effect_key first_seen_at"),
    summary=Summary(
        "totals",
        "report_duplicate_totals",
        _columns("source event_type effects deliveries duplicate_deliveries"),
        "totals over the window",
    ),
)


def _with_diff(row: Row) -> Row:
    held = row.pop("held_payload")
    rejected = row.pop("rejected_payload")
    row["diff"], row["diff_truncated"] = payload_diff(held, rejected)
    return row


KEY_CONFLICTS = ReportSpec(
    name="key_conflicts",
    title="Deliveries rejected because another payload held their effect key",
    description="Each with both fingerprints, both events and a field-level diff of the payloads.",
    query="report_key_conflicts",
    filters=(_SOURCE, _TENANT, _EVENT_TYPE),
    sorts=_sorts(
        ("-received", ("r.received_at", "r.id"), "newest first"),
        ("received", ("r.received_at", "r.id"), "oldest first"),
    ),
    columns=_columns(
        "tenant effect_key source event_id event_type received_at held_event_id held_event_type "
        "held_fingerprint rejected_fingerprint diff diff_truncated"
    ),
    table=_names(
        "received_at source event_id event_type effect_key held_event_id held_fingerprint "
        "rejected_fingerprint diff"
    ),
    summary=Summary(
        "totals",
        "report_key_conflict_totals",
        _columns("source event_type rejects effects"),
        "totals over the window",
    ),
    shape=_with_diff,
)

AUTH_FAILURES = ReportSpec(
    name="auth_failures",
    title="Deliveries whose signature verification failed",
    description="Totals by (source, reason) and counts per minute, newest first. Only metadata is kept "
    "for these, never a body. The hint is a diagnosis made after the answer, sampled (a body re-encoded "
    "in transit); the counts reach the ledger within seconds of the answers.",
    query="report_auth_failures_per_minute",
    filters=(_SOURCE,),
    sorts=_sorts(("-minute", ("minute", "source", "reason"), "newest minute first")),
    columns=_columns("minute source reason count bytes_total last_detail hint last_seen_at"),
    table=_names("minute source reason count last_detail hint"),
    items_key="per_minute",
    summary=Summary(
        "by_reason",
        "report_auth_failures_by_reason",
        _columns("source reason count bytes_total first_minute last_seen_at"),
        "by reason",
    ),
)

JOBS = ReportSpec(
    name="jobs",
    title="Jobs by state, kind, source and age",
    description="Jobs created in [since, until), both open unless given: `until=1h` lists jobs older "
    "than an hour.",
    query="report_jobs",
    filters=(
        Filter("state", FilterType.STATES, "One state or several, comma-separated: " + ", ".join(JOB_STATES)),
        Filter("kind", FilterType.NAME, "Only this handler kind."),
        _SOURCE,
        _TENANT,
    ),
    sorts=_sorts(
        ("-created", ("j.created_at", "j.id"), "newest first"),
        ("created", ("j.created_at", "j.id"), "oldest first"),
    ),
    window=None,
    columns=_columns(
        "id tenant kind state effect_key source event_type attempt max_attempts run_at lease_token "
        "lease_owner lease_expires_at cancel_requested unrecoverable terminal_reason terminal_by "
        "created_at updated_at finished_at resolved_at resolved_by resolved_reason"
    ),
    table=_names(
        "id state kind source effect_key attempt created_at terminal_reason resolved_by resolved_reason"
    ),
)

DELIVERY_OUTCOMES = ReportSpec(
    name="delivery_outcomes",
    title="Deliveries by outcome per source",
    description="Deliveries received in [since, until) (default: the last 24 hours) per source: how many "
    "were accepted, duplicates, rejected (key conflicts), matched no handler or were superseded (older than "
    "the newest version claimed for their object, never run) or were refused (verified but could not become "
    "effects: kept, replayable), and the duplicate and "
    "reject rates (of all deliveries). A delivery asking for several effects counts once per effect.",
    query="report_delivery_outcomes",
    filters=(_SOURCE, _TENANT),
    sorts=_sorts(
        ("-deliveries", ("deliveries", "source"), "busiest source first"),
        ("source", ("source",), "by source name"),
    ),
    columns=_columns(
        "source deliveries accepted duplicates rejected unmatched superseded refused duplicate_rate reject_rate"
    ),
)

REFUSED_DELIVERIES = ReportSpec(
    name="refused_deliveries",
    title="Verified deliveries that could not become effects",
    description="Each event of a delivery whose signature was good but that was refused: a key, lock-key, "
    "tenant or require function raised, its tenant was missing or not allowed, its payload was past what the "
    "ledger stores, or Postgres refused a value. Kept with the raw body and the reason; `effectgate ledger "
    "replay --refused` claims them once the cause is fixed, and marks them replayed.",
    query="report_refused_deliveries",
    filters=(_SOURCE, _TENANT, _EVENT_TYPE, _EVENT_ID),
    sorts=_sorts(
        ("-received", ("d.received_at", "d.id"), "newest first"),
        ("received", ("d.received_at", "d.id"), "oldest first"),
    ),
    columns=_columns(
        "received_at source tenant event_id event_type reason handler error refusal_detail replayed_at "
        "body_bytes replayable"
    ),
    table=_names("received_at source event_id event_type reason handler error replayed_at"),
)

REPORTS: tuple[ReportSpec, ...] = (
    DUPLICATES,
    KEY_CONFLICTS,
    AUTH_FAILURES,
    REFUSED_DELIVERIES,
    JOBS,
    DELIVERY_OUTCOMES,
)
BY_NAME = by_name(REPORTS)
