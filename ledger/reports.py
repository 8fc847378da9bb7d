"""Read-only views of the ledger for operators: the one code path the CLI, the HTTP API and the dashboard read.

Reports: ``duplicates``, ``key_conflicts`` (with a field-level diff of the held and rejected payloads),
``auth_failures``, ``effect_view`` (an effect's lineage from delivery to outcome), ``jobs`` and ``job_view``;
``activity`` (the dashboard's series over time) and ``job_gauges`` (what ``/metrics`` reads).

Every filter arrives as text (from a flag or a query string) or as a typed value, and is validated here:
a bad one raises ``InvalidParameter`` whose ``code`` names it (``invalid_since``, ``invalid_limit``…), so
every face answers the same mistake with the same code. Times are ISO 8601 or a duration back from now
(``24h``, ``30m``, ``7d``). Pages are keyset-paginated on (sort column, id) with an opaque cursor, so a
page costs the same at any depth and rows inserted meanwhile neither repeat nor vanish.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

from . import jobs as ledger_jobs
from .db import Conn
from .errors import LedgerError
from .queries import Q
from .vocabulary import JobState

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DEFAULT_WINDOW = timedelta(hours=24)
MAX_NAME_LENGTH = 200
MAX_KEY_LENGTH = 1000
MAX_CURSOR_LENGTH = 1000
# A diff of two large payloads is cut here: the first differences say what went wrong, the hundredth does not.
MAX_DIFF_ENTRIES = 100

DUPLICATE_SORTS: dict[str, tuple[LiteralString, str]] = {
    "-last_seen": ("report_duplicates_last_seen_desc", "last_seen_at"),
    "last_seen": ("report_duplicates_last_seen_asc", "last_seen_at"),
    "-first_seen": ("report_duplicates_first_seen_desc", "first_seen_at"),
    "first_seen": ("report_duplicates_first_seen_asc", "first_seen_at"),
    "-deliveries": ("report_duplicates_deliveries_desc", "delivery_count"),
}
CONFLICT_SORTS: dict[str, tuple[LiteralString, str]] = {
    "-received": ("report_key_conflicts_desc", "received_at"),
    "received": ("report_key_conflicts_asc", "received_at"),
}
JOB_SORTS: dict[str, tuple[LiteralString, str]] = {
    "-created": ("report_jobs_desc", "created_at"),
    "created": ("report_jobs_asc", "created_at"),
}
JOB_STATES = tuple(JobState)


class InvalidParameter(LedgerError):
    """A report filter or parameter is invalid; ``code`` names it (``invalid_<parameter>``)."""

    def __init__(self, parameter: str, detail: str, *, code: str | None = None) -> None:
        super().__init__(f"{parameter}: {detail}")
        self.parameter = parameter
        self.code = code or f"invalid_{parameter}"
        self.detail = detail


# -- parameters ------------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d{1,6})([smhdw])", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WHOLE_NUMBER = re.compile(r"\d{1,18}", re.ASCII)


def parse_time(value: str | datetime | None, parameter: str, *, now: datetime) -> datetime | None:
    """An ISO 8601 time (UTC if it names no zone) or a duration back from ``now`` (``24h``), or ``None``."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameter(parameter, "expected a duration such as 24h, 30m, 7d or an ISO 8601 time")
    text = value.strip()
    try:
        match = _DURATION.fullmatch(text)
        if match:
            return now - timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
        parsed = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise InvalidParameter(
            parameter, f"expected a duration such as 24h, 30m, 7d or an ISO 8601 time, got {text!r}"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_limit(value: int | str | None) -> int:
    """A page size in 1..``MAX_LIMIT`` (``DEFAULT_LIMIT`` when absent)."""
    if value is None:
        return DEFAULT_LIMIT
    if isinstance(value, str):
        if not _WHOLE_NUMBER.fullmatch(value.strip()):
            raise InvalidParameter("limit", f"expected a whole number 1..{MAX_LIMIT}, got {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise InvalidParameter("limit", f"must be 1..{MAX_LIMIT}, got {value!r}")
    return value


def parse_id(value: int | str, parameter: str) -> int:
    """A positive row id, such as a job id."""
    if isinstance(value, str):
        if not _WHOLE_NUMBER.fullmatch(value.strip()):
            raise InvalidParameter(parameter, f"expected a positive whole number, got {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        raise InvalidParameter(parameter, f"expected a positive whole number, got {value!r}")
    return value


def parse_name(value: str | None, parameter: str, *, max_length: int = MAX_NAME_LENGTH) -> str | None:
    """A source, tenant, event type or kind to filter on: printable text of at most 200 characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_length or not value.isprintable():
        raise InvalidParameter(
            parameter, f"expected printable text of 1..{max_length} characters, got {value!r}"
        )
    return value


def parse_states(value: str | Sequence[str] | None) -> list[str] | None:
    """Job states to filter on, as a list or comma-separated text (``failed,parked``)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    states = [s.strip() for s in items if isinstance(s, str)]
    if not states or len(states) != len(items) or any(s not in JOB_STATES for s in states):
        raise InvalidParameter("state", f"expected one or more of {', '.join(JOB_STATES)}, got {value!r}")
    return sorted(set(states))


def _sort(value: str | None, sorts: dict[str, tuple[LiteralString, str]], default: str) -> str:
    sort = default if value is None else value
    if sort not in sorts:
        raise InvalidParameter("sort", f"expected one of {', '.join(sorts)}, got {value!r}")
    return sort


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open time range [since, until)."""

    since: datetime
    until: datetime


def parse_window(
    since: str | datetime | None, until: str | datetime | None, *, now: datetime, default: timedelta
) -> Window:
    """[since, until): ``until`` defaults to now and ``since`` to ``default`` before it."""
    end = parse_time(until, "until", now=now) or now
    start = parse_time(since, "since", now=now) or end - default
    if start >= end:
        raise InvalidParameter("until", f"must be after since ({start.isoformat()}), got {end.isoformat()}")
    return Window(start, end)


def _optional_window(
    since: str | datetime | None, until: str | datetime | None, *, now: datetime
) -> tuple[datetime | None, datetime | None]:
    start = parse_time(since, "since", now=now)
    end = parse_time(until, "until", now=now)
    if start is not None and end is not None and start >= end:
        raise InvalidParameter("until", f"must be after since ({start.isoformat()}), got {end.isoformat()}")
    return start, end


# -- cursors ---------------------------------------------------------------------------------------


def _encode_cursor(tag: str, *values: Any) -> str:
    encoded = [v.isoformat() if isinstance(v, datetime) else v for v in values]
    raw = json.dumps([tag, *encoded], separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _timestamp(value: Any) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError("cursor time without a zone")
    return parsed


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("not an integer")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not text")
    return value


def _decode_cursor(cursor: str | None, tag: str, *kinds: Callable[[Any], Any]) -> list[Any] | None:
    if cursor is None:
        return None
    # A cursor is a position, not a credential: tampering with one can only move within what the same
    # filters would show anyway, so it is encoded, not signed.
    try:
        if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_LENGTH:
            raise ValueError("length")
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(data, list) or len(data) != len(kinds) + 1 or not isinstance(data[0], str):
            raise ValueError("shape")
        if data[0] != tag:
            raise InvalidParameter(
                "cursor", "this cursor belongs to another report or sort order; start again without it"
            )
        return [kind(value) for kind, value in zip(kinds, data[1:], strict=True)]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidParameter(
            "cursor", "not a cursor this report returned; pass next_cursor unchanged"
        ) from None


def _page(rows: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], bool]:
    # One row more than asked tells whether there is a next page without a count.
    return rows[:limit], len(rows) > limit


async def _fetch(conn: Conn, name: LiteralString, params: dict[str, Any]) -> list[dict[str, Any]]:
    # Unprepared on purpose: an unnamed statement is planned with its actual parameter values, so the
    # optional filters fold away and the index of the filter in use is chosen. A prepared statement could
    # switch to a generic plan that reads every row.
    return await (await conn.execute(Q[name], params, prepare=False)).fetchall()


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


# -- duplicates ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DuplicatesReport:
    """Effects delivered more than once whose last delivery fell in the window, one page of them, and
    totals over the whole window by source and event type."""

    since: datetime
    until: datetime
    sort: str
    items: list[dict[str, Any]]
    next_cursor: str | None
    totals: list[dict[str, Any]]


async def duplicates(
    conn: Conn,
    *,
    source: str | None = None,
    tenant: str | None = None,
    event_type: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    sort: str | None = None,
    limit: int | str | None = None,
    cursor: str | None = None,
    now: datetime | None = None,
) -> DuplicatesReport:
    """Duplicated effects last delivered in [since, until) (default: the last 24 hours).

    Sorts: ``-last_seen`` (default), ``last_seen``, ``-first_seen``, ``first_seen``, ``-deliveries``.
    """
    window = parse_window(since, until, now=_now(now), default=DEFAULT_WINDOW)
    filters = {
        "since": window.since,
        "until": window.until,
        "source": parse_name(source, "source"),
        "tenant": parse_name(tenant, "tenant"),
        "event_type": parse_name(event_type, "event_type"),
    }
    order = _sort(sort, DUPLICATE_SORTS, "-last_seen")
    query, column = DUPLICATE_SORTS[order]
    size = parse_limit(limit)
    tag = f"duplicates:{order}"
    position = _decode_cursor(cursor, tag, _integer if column == "delivery_count" else _timestamp, _integer)
    after_value, after_id = position if position else (None, None)
    rows = await _fetch(
        conn,
        query,
        {
            **filters,
            "after_ts": None if column == "delivery_count" else after_value,
            "after_n": after_value if column == "delivery_count" else None,
            "after_id": after_id,
            "limit": size + 1,
        },
    )
    items, more = _page(rows, size)
    next_cursor = _encode_cursor(tag, items[-1][column], items[-1]["id"]) if more else None
    totals = await _fetch(conn, "report_duplicate_totals", filters)
    for item in items:
        del item["id"]
    return DuplicatesReport(window.since, window.until, order, items, next_cursor, totals)


# -- rejects: key conflicts and authentication failures ---------------------------------------------


def payload_diff(held: Any, rejected: Any) -> tuple[list[dict[str, Any]], bool]:
    """The field-level differences between two JSON values, and whether the list was cut short.

    Each entry has a JSON Pointer ``path`` (RFC 6901), a ``change`` of ``changed``, ``added`` (only in the
    rejected payload) or ``removed`` (only in the held one), and the ``held`` and/or ``rejected`` value.
    Values of different JSON types differ even where Python would call them equal (``1`` and ``true``).
    """
    entries: list[dict[str, Any]] = []
    truncated = _diff(held, rejected, "", entries)
    return entries, truncated


def _diff(held: Any, rejected: Any, path: str, out: list[dict[str, Any]]) -> bool:
    if isinstance(held, dict) and isinstance(rejected, dict):
        for key in sorted(held.keys() | rejected.keys()):
            child = path + "/" + str(key).replace("~", "~0").replace("/", "~1")
            if key not in rejected:
                entry = {"path": child, "change": "removed", "held": held[key]}
            elif key not in held:
                entry = {"path": child, "change": "added", "rejected": rejected[key]}
            else:
                if _diff(held[key], rejected[key], child, out):
                    return True
                continue
            if len(out) >= MAX_DIFF_ENTRIES:
                return True
            out.append(entry)
        return False
    if isinstance(held, list) and isinstance(rejected, list):
        for i in range(max(len(held), len(rejected))):
            child = f"{path}/{i}"
            if i >= len(rejected):
                entry = {"path": child, "change": "removed", "held": held[i]}
            elif i >= len(held):
                entry = {"path": child, "change": "added", "rejected": rejected[i]}
            else:
                if _diff(held[i], rejected[i], child, out):
                    return True
                continue
            if len(out) >= MAX_DIFF_ENTRIES:
                return True
            out.append(entry)
        return False
    if type(held) is type(rejected) and held == rejected:
        return False
    if len(out) >= MAX_DIFF_ENTRIES:
        return True
    out.append({"path": path, "change": "changed", "held": held, "rejected": rejected})
    return False


def _with_diff(row: dict[str, Any]) -> dict[str, Any]:
    held = row.pop("held_payload")
    rejected = row.pop("rejected_payload")
    row["diff"], row["diff_truncated"] = payload_diff(held, rejected)
    return row


@dataclass(frozen=True, slots=True)
class ConflictsReport:
    """Deliveries rejected in the window because a different payload held their effect key: one page,
    each with both fingerprints, both events and a field diff, and totals by source and event type."""

    since: datetime
    until: datetime
    sort: str
    items: list[dict[str, Any]]
    next_cursor: str | None
    totals: list[dict[str, Any]]


async def key_conflicts(
    conn: Conn,
    *,
    source: str | None = None,
    tenant: str | None = None,
    event_type: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    sort: str | None = None,
    limit: int | str | None = None,
    cursor: str | None = None,
    now: datetime | None = None,
) -> ConflictsReport:
    """Key conflicts received in [since, until) (default: the last 24 hours); sorts ``-received``, ``received``."""
    window = parse_window(since, until, now=_now(now), default=DEFAULT_WINDOW)
    filters = {
        "since": window.since,
        "until": window.until,
        "source": parse_name(source, "source"),
        "tenant": parse_name(tenant, "tenant"),
        "event_type": parse_name(event_type, "event_type"),
    }
    order = _sort(sort, CONFLICT_SORTS, "-received")
    query, column = CONFLICT_SORTS[order]
    size = parse_limit(limit)
    tag = f"conflicts:{order}"
    position = _decode_cursor(cursor, tag, _timestamp, _integer)
    after_ts, after_id = position if position else (None, None)
    rows = await _fetch(
        conn, query, {**filters, "after_ts": after_ts, "after_id": after_id, "limit": size + 1}
    )
    items, more = _page(rows, size)
    next_cursor = _encode_cursor(tag, items[-1][column], items[-1]["id"]) if more else None
    totals = await _fetch(conn, "report_key_conflict_totals", filters)
    for item in items:
        del item["id"]
        _with_diff(item)
    return ConflictsReport(window.since, window.until, order, items, next_cursor, totals)


@dataclass(frozen=True, slots=True)
class AuthFailuresReport:
    """Deliveries whose signature check failed in the window: totals by (source, reason) and one page of
    per-minute counts, newest minute first. Only metadata is kept for these, never a body."""

    since: datetime
    until: datetime
    by_reason: list[dict[str, Any]]
    per_minute: list[dict[str, Any]]
    next_cursor: str | None


async def auth_failures(
    conn: Conn,
    *,
    source: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    limit: int | str | None = None,
    cursor: str | None = None,
    now: datetime | None = None,
) -> AuthFailuresReport:
    """Authentication failures in [since, until) (default: the last 24 hours), by reason and per minute."""
    window = parse_window(since, until, now=_now(now), default=DEFAULT_WINDOW)
    filters = {"since": window.since, "until": window.until, "source": parse_name(source, "source")}
    size = parse_limit(limit)
    position = _decode_cursor(cursor, "auth", _timestamp, _text, _text)
    after = position if position else [None, None, None]
    rows = await _fetch(
        conn,
        "report_auth_failures_per_minute",
        {
            **filters,
            "after_minute": after[0],
            "after_source": after[1],
            "after_reason": after[2],
            "limit": size + 1,
        },
    )
    items, more = _page(rows, size)
    last = items[-1] if items else {}
    next_cursor = _encode_cursor("auth", last["minute"], last["source"], last["reason"]) if more else None
    by_reason = await _fetch(conn, "report_auth_failures_by_reason", filters)
    return AuthFailuresReport(window.since, window.until, by_reason, items, next_cursor)


# -- effect lineage --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EffectView:
    """One effect from delivery to outcome: the claim, every delivery that asked for it (accepted or
    duplicate), every reject of its key (with a diff against the held payload), its job with each attempt
    (worker, lease token, start, end, error), and each recorded step with the idempotency key sent
    downstream and the answer that came back. ``job`` is ``None`` only if no job was ever created."""

    effect: dict[str, Any]
    job: ledger_jobs.JobRow | None
    deliveries: list[dict[str, Any]]
    rejects: list[dict[str, Any]]
    attempts: list[ledger_jobs.AttemptRow]
    steps: list[dict[str, Any]]


async def effect_view(conn: Conn, effect_key: str, *, tenant: str | None = None) -> EffectView | None:
    """The lineage of one effect, or ``None`` when no such effect was ever claimed.

    Without a tenant, the key is looked up in every tenant; a key held by several raises
    ``InvalidParameter`` with code ``tenant_required``.
    """
    key = parse_name(effect_key, "key", max_length=MAX_KEY_LENGTH)
    if key is None:
        raise InvalidParameter("key", "an effect key is required")
    holder = parse_name(tenant, "tenant")
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
    job = await ledger_jobs.get(conn, job_id) if job_id is not None else None
    params = {"effect_id": effect["id"]}
    deliveries = await _fetch(conn, "effect_deliveries", params)
    rejects = await _fetch(conn, "effect_rejects_for_effect", params)
    for reject in rejects:
        reject["diff"], reject["diff_truncated"] = payload_diff(
            effect["payload"], reject.pop("rejected_payload")
        )
    attempts = await ledger_jobs.attempts(conn, job_id) if job_id is not None else []
    steps = await _fetch(conn, "steps_for_effect", params)
    return EffectView(effect, job, deliveries, rejects, attempts, steps)


# -- jobs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobsReport:
    """One page of jobs with their effect's key, source and event type, and the cursor of the next."""

    since: datetime | None
    until: datetime | None
    sort: str
    items: list[dict[str, Any]]
    next_cursor: str | None


async def jobs(
    conn: Conn,
    *,
    state: str | Sequence[str] | None = None,
    kind: str | None = None,
    source: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    sort: str | None = None,
    limit: int | str | None = None,
    cursor: str | None = None,
    now: datetime | None = None,
    tenant: str | None = None,
) -> JobsReport:
    """Jobs by state (one or several), kind, source and tenant, created in [since, until) — both open when absent,
    so ``until="1h"`` lists jobs older than an hour. Sorts ``-created`` (default) and ``created``."""
    start, end = _optional_window(since, until, now=_now(now))
    order = _sort(sort, JOB_SORTS, "-created")
    query, column = JOB_SORTS[order]
    size = parse_limit(limit)
    tag = f"jobs:{order}"
    position = _decode_cursor(cursor, tag, _timestamp, _integer)
    after_ts, after_id = position if position else (None, None)
    rows = await _fetch(
        conn,
        query,
        {
            "since": start,
            "until": end,
            "states": parse_states(state),
            "kind": parse_name(kind, "kind"),
            "source": parse_name(source, "source"),
            "tenant": parse_name(tenant, "tenant"),
            "after_ts": after_ts,
            "after_id": after_id,
            "limit": size + 1,
        },
    )
    items, more = _page(rows, size)
    next_cursor = _encode_cursor(tag, items[-1][column], items[-1]["id"]) if more else None
    return JobsReport(start, end, order, items, next_cursor)


@dataclass(frozen=True, slots=True)
class JobView:
    """One job with its effect's key, each attempt and each recorded step."""

    job: ledger_jobs.JobRow
    attempts: list[ledger_jobs.AttemptRow]
    steps: list[dict[str, Any]]


async def job_view(conn: Conn, job_id: int | str) -> JobView | None:
    """One job, or ``None`` when there is no such job."""
    job = await ledger_jobs.get(conn, parse_id(job_id, "job_id"))
    if job is None:
        return None
    attempts = await ledger_jobs.attempts(conn, job["id"])
    steps = await _fetch(conn, "steps_for_effect", {"effect_id": job["effect_id"]})
    return JobView(job, attempts, steps)


# -- gauges for /metrics ---------------------------------------------------------------------------


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


# -- activity over time ----------------------------------------------------------------------------

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
    source: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    now: datetime | None = None,
) -> Activity:
    """What arrived twice or was turned away, over time (default: the last 24 hours, hourly)."""
    window = parse_window(since, until, now=_now(now), default=DEFAULT_WINDOW)
    span = window.until - window.since
    bucket = timedelta(hours=1) if span <= timedelta(days=3) else timedelta(days=1)
    if span / bucket > MAX_BUCKETS:
        raise InvalidParameter("since", f"the window is too long for a chart: at most {MAX_BUCKETS} days")
    rows = await _fetch(
        conn,
        "report_activity",
        {
            "bucket": bucket,
            "since": window.since,
            "until": window.until,
            "source": parse_name(source, "source"),
        },
    )
    return Activity(window.since, window.until, bucket, rows)
