"""Reading operator parameters from text (a query string, a flag, a form): times, page sizes, ids, names,
job states and cursors, each turned into the typed value the ledger takes.

A bad value raises ``BadParameter`` whose ``code`` names it (``invalid_since``, ``invalid_limit``…), so
every face answers the same mistake with the same code. Times are ISO 8601 or a duration back from now
(``24h``, ``30m``, ``7d``). A cursor is an opaque, URL-safe encoding of the keyset position a report
page ended at, tagged with its report and sort order.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from effectgate.ledger.errors import InvalidParameter
from effectgate.ledger.jobs import filters
from effectgate.ledger.reports import JOB_STATES
from effectgate.ledger.reports.spec import MAX_LIMIT, MAX_NAME_LENGTH, ColumnType

MAX_CURSOR_LENGTH = 1000


class BadParameter(ValueError):
    """A parameter given as text is invalid; ``code`` names it (``invalid_<parameter>``)."""

    def __init__(self, parameter: str, detail: str, *, code: str | None = None) -> None:
        super().__init__(f"{parameter}: {detail}")
        self.parameter = parameter
        self.code = code or f"invalid_{parameter}"
        self.detail = detail


# What every face answers with a 400 / exit 2 / "Bad filter" page: a bad text, or a typed value the
# ledger refused (an effect key held by several tenants, a chart window too long).
PARAMETER_ERRORS = (BadParameter, InvalidParameter)

_DURATION = re.compile(r"(\d{1,6})([smhdw])", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WHOLE_NUMBER = re.compile(r"\d{1,18}", re.ASCII)
TIME_HELP = "an ISO 8601 time (UTC if it names no zone) or a duration back from now: 30m, 24h, 7d, 2w"


def parse_time(value: str | None, parameter: str, *, now: datetime) -> datetime | None:
    """An ISO 8601 time (UTC if it names no zone) or a duration back from ``now`` (``24h``), or ``None``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadParameter(parameter, "expected a duration such as 24h, 30m, 7d or an ISO 8601 time")
    text = value.strip()
    try:
        match = _DURATION.fullmatch(text)
        if match:
            return now - timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
        parsed = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        raise BadParameter(
            parameter, f"expected a duration such as 24h, 30m, 7d or an ISO 8601 time, got {text!r}"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_window(
    since: str | None, until: str | None, *, now: datetime, default: timedelta | None
) -> tuple[datetime | None, datetime | None]:
    """[since, until): with a ``default`` length, ``until`` defaults to now and ``since`` to ``default``
    before it; without one, an end not given stays open (``None``)."""
    end = parse_time(until, "until", now=now)
    start = parse_time(since, "since", now=now)
    if default is not None:
        end = end or now
        start = start or end - default
    if start is not None and end is not None and start >= end:
        raise BadParameter("until", f"must be after since ({start.isoformat()}), got {end.isoformat()}")
    return start, end


def parse_limit(value: str | None, default: int) -> int:
    """A page size in 1..``MAX_LIMIT`` (``default`` when absent)."""
    if value is None:
        return default
    if not isinstance(value, str) or not _WHOLE_NUMBER.fullmatch(value.strip()):
        raise BadParameter("limit", f"expected a whole number 1..{MAX_LIMIT}, got {value!r}")
    number = int(value)
    if not 1 <= number <= MAX_LIMIT:
        raise BadParameter("limit", f"must be 1..{MAX_LIMIT}, got {number}")
    return number


#: The parameters of a bulk action's job filter, as the API's query, the dashboard's form and the CLI's flags name them.
JOB_FILTER_PARAMETERS = ("state", "kind", "source", "since", "limit")
BULK_LIMIT_MAX = 100_000


def parse_bulk_limit(value: str | None) -> int:
    """How many jobs a bulk action (or a replay) takes at most: 1..100,000, ``DEFAULT_LIMIT`` when absent."""
    if value is None:
        return filters.DEFAULT_LIMIT
    if not (_WHOLE_NUMBER.fullmatch(value.strip()) and 1 <= int(value) <= BULK_LIMIT_MAX):
        raise BadParameter("limit", f"expected a whole number from 1 to {BULK_LIMIT_MAX}, got {value!r}")
    return int(value)


def parse_job_filter(values: Mapping[str, str | None], *, now: datetime) -> filters.JobFilter:
    """The job filter of a bulk action (redrive, cancel), read the same way by every face.

    An empty text counts as absent (a form sends its blank fields). A filter that would match every job is
    refused with ``filter_required``: a bulk action names what it takes.
    """

    def value(name: str) -> str | None:
        text = values.get(name)
        return text if text else None

    where = filters.JobFilter(
        states=parse_states(value("state")),
        kind=parse_name(value("kind"), "kind"),
        source=parse_name(value("source"), "source"),
        since=parse_time(value("since"), "since", now=now),
        limit=parse_bulk_limit(value("limit")),
    )
    if where.empty:
        raise BadParameter(
            "filter", "a bulk action needs at least one of state, kind, source, since", code="filter_required"
        )
    return where


def parse_id(value: str, parameter: str) -> int:
    """A positive row id, such as a job id."""
    if not isinstance(value, str) or not _WHOLE_NUMBER.fullmatch(value.strip()):
        raise BadParameter(parameter, f"expected a positive whole number, got {value!r}")
    number = int(value)
    if not 1 <= number < 2**63:
        raise BadParameter(parameter, f"expected a positive whole number, got {value!r}")
    return number


def parse_name(value: str | None, parameter: str, *, max_length: int = MAX_NAME_LENGTH) -> str | None:
    """A source, tenant, event type, kind or key: printable text of 1..``max_length`` characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_length or not value.isprintable():
        raise BadParameter(parameter, f"expected printable text of 1..{max_length} characters, got {value!r}")
    return value


def parse_states(value: str | None, parameter: str = "state") -> tuple[str, ...] | None:
    """Job states as comma-separated text (``failed,parked``): validated, sorted, without repeats."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else []
    states = [s.strip() for s in items]
    if not states or any(s not in JOB_STATES for s in states):
        raise BadParameter(parameter, f"expected one or more of {', '.join(JOB_STATES)}, got {value!r}")
    return tuple(sorted(set(states)))


def parse_flag(value: str | None, parameter: str) -> bool:
    """``true``/``1`` or ``false``/``0`` (absent is false)."""
    if value is None or value in ("false", "0"):
        return False
    if value in ("true", "1"):
        return True
    raise BadParameter(parameter, f"expected true or false, got {value!r}")


# -- cursors ---------------------------------------------------------------------------------------


def encode_cursor(tag: str, values: Sequence[Any]) -> str:
    """A keyset position as an opaque, URL-safe cursor tagged with its report and order."""
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


# How a cursor value of each column type is read back; a type with no reader cannot be a sort column.
CURSOR_READERS: dict[ColumnType, Callable[[Any], Any]] = {
    ColumnType.TIME: _timestamp,
    ColumnType.INTEGER: _integer,
    ColumnType.TEXT: _text,
}


def decode_cursor(cursor: str | None, tag: str, kinds: Sequence[ColumnType]) -> tuple[Any, ...] | None:
    """The keyset position in ``cursor``, typed as ``kinds``; ``None`` without a cursor."""
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
            raise BadParameter(
                "cursor", "this cursor belongs to another report or sort order; start again without it"
            )
        return tuple(CURSOR_READERS[kind](value) for kind, value in zip(kinds, data[1:], strict=True))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        if isinstance(exc, BadParameter):
            raise
        raise BadParameter(
            "cursor", "not a cursor this report returned; pass next_cursor unchanged"
        ) from None
