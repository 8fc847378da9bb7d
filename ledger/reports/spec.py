"""The shape an operator report is declared in, once, and the one code path that runs any of them.

A ``ReportSpec`` names a report's SQL block, its filters (each with a type), its sort orders (each an
allow-listed list of keyset columns) and its columns (each with a type and a title). The ledger runs a
spec with typed values (``ReportQuery``: datetimes, ints, tuples of states); the gateway derives every
face from the same spec: query-string and flag parsing with their error codes, the OpenAPI parameters and
schemas, the CLI flags and tables, the dashboard's filter forms and tables.

The SQL block holds the whole query with two holes, ``{after}`` (a boolean: the keyset condition, or
``TRUE`` on the first page) and ``{order}`` (the ORDER BY list). Both are composed here with
``psycopg.sql`` from the columns of a ``Sort`` the spec declares, never from input, so one block serves
every sort order of its report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, LiteralString

from psycopg import sql

from ..db import Conn
from ..errors import InvalidParameter
from ..queries import Q

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_NAME_LENGTH = 200

Row = dict[str, Any]


class ColumnType(StrEnum):
    """What a column holds, for the faces to render and describe it."""

    TEXT = "text"
    INTEGER = "integer"
    NUMBER = "number"
    TIME = "time"
    BOOLEAN = "boolean"
    JSON = "json"
    STATE = "state"  # a job state
    DIFF = "diff"  # a list of payload differences (see payload_diffs.payload_diff)


@dataclass(frozen=True, slots=True)
class Column:
    """One field of a report's rows: its name in the row and the document, its type and a short title."""

    name: str
    type: ColumnType
    title: str
    nullable: bool = False


class FilterType(StrEnum):
    """The typed value a filter takes."""

    NAME = "name"  # str: printable text of 1..MAX_NAME_LENGTH characters
    STATES = "states"  # tuple[str, ...]: job states, sorted and without repeats


@dataclass(frozen=True, slots=True)
class Filter:
    """An optional filter; its SQL block reads ``%(name)s`` (``NULL`` when not given)."""

    name: str
    type: FilterType
    help: str


@dataclass(frozen=True, slots=True)
class Sort:
    """A sort order: keyset columns (the last one unique, the tie-break), all ascending or all descending.

    A column is an output field, or ``alias.field`` where the block needs the table's column to keep
    its index usable; the row's field is the part after the dot.
    """

    name: str
    columns: tuple[LiteralString, ...]
    descending: bool
    help: str

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(c.rpartition(".")[2] for c in self.columns)


@dataclass(frozen=True, slots=True)
class Summary:
    """Rows over the whole window (not paged), under ``key`` in the document."""

    key: str
    query: LiteralString
    columns: tuple[Column, ...]
    title: str


@dataclass(frozen=True, slots=True)
class ReportSpec:
    """Everything there is to know about one operator report, declared once.

    ``window`` is the default length of [since, until) ending now; ``None`` leaves both ends open.
    ``sorts[0]`` is the default order; every sort column must be a column or a key. ``table`` names the
    columns a table shows (default: all).
    ``shape`` turns a raw row into its columns (for fields computed in Python, such as a diff).
    """

    name: str
    title: str
    description: str
    query: LiteralString
    columns: tuple[Column, ...]
    sorts: tuple[Sort, ...]
    filters: tuple[Filter, ...] = ()
    window: timedelta | None = timedelta(hours=24)
    items_key: str = "items"
    summary: Summary | None = None
    table: tuple[str, ...] = ()
    shape: Callable[[Row], Row] | None = field(default=None, compare=False)
    # Columns the rows carry for paging only (the tie-break), never shown.
    keys: tuple[Column, ...] = (Column("id", ColumnType.INTEGER, "id"),)

    def sort(self, name: str | None) -> Sort:
        """The sort called ``name`` (the default for ``None``)."""
        if name is None:
            return self.sorts[0]
        for sort in self.sorts:
            if sort.name == name:
                return sort
        raise InvalidParameter(
            "sort", f"expected one of {', '.join(s.name for s in self.sorts)}, got {name!r}"
        )

    def column(self, name: str) -> Column:
        """A column of the rows (shown or a key) by name."""
        for column in (*self.columns, *self.keys):
            if column.name == name:
                return column
        raise KeyError(f"{self.name} has no column {name!r}")

    @property
    def table_columns(self) -> tuple[Column, ...]:
        if not self.table:
            return self.columns
        return tuple(self.column(name) for name in self.table)


FilterValue = str | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """Typed arguments of a report: the window, the filters that are set, the order, the page."""

    since: datetime | None = None
    until: datetime | None = None
    filters: Mapping[str, FilterValue] = field(default_factory=dict)
    sort: str | None = None
    limit: int = DEFAULT_LIMIT
    after: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a report: its rows, where the next page starts (``None`` when this is the last), and
    the summary rows over the whole window."""

    spec: ReportSpec
    since: datetime | None
    until: datetime | None
    sort: Sort
    items: list[Row]
    next_after: tuple[Any, ...] | None
    summary: list[Row]


def compose(spec: ReportSpec, sort: Sort, after: tuple[Any, ...] | None) -> sql.Composed:
    """The report's block with its ORDER BY and keyset condition filled in from ``sort``'s columns."""
    columns = [sql.Identifier(*c.split(".")) for c in sort.columns]
    direction = sql.SQL(" DESC" if sort.descending else "")
    order = sql.SQL(", ").join(sql.Composed([c, direction]) for c in columns)
    if after is None:
        keyset: sql.Composable = sql.SQL("TRUE")
    else:
        keyset = sql.SQL("({}) {} ({})").format(
            sql.SQL(", ").join(columns),
            sql.SQL("<" if sort.descending else ">"),
            sql.SQL(", ").join(sql.Placeholder(f"after_{i}") for i in range(len(columns))),
        )
    return sql.SQL(Q[spec.query]).format(after=keyset, order=order)


def _check(spec: ReportSpec, query: ReportQuery, sort: Sort) -> None:
    # The gateway validates text before it gets here; these guard a Python caller's typed values.
    known = {f.name: f for f in spec.filters}
    for name, value in query.filters.items():
        if name not in known:
            raise InvalidParameter(name, f"not a filter of the {spec.name} report", code="unknown_parameter")
        wanted = str if known[name].type is FilterType.NAME else tuple
        if not isinstance(value, wanted):
            raise InvalidParameter(name, f"expected {wanted.__name__}, got {type(value).__name__}")
    if isinstance(query.limit, bool) or not 1 <= query.limit <= MAX_LIMIT:
        raise InvalidParameter("limit", f"must be 1..{MAX_LIMIT}, got {query.limit!r}")
    if query.after is not None and len(query.after) != len(sort.columns):
        raise InvalidParameter("cursor", f"a position in this order has {len(sort.columns)} values")
    if query.since is not None and query.until is not None and query.since >= query.until:
        raise InvalidParameter(
            "until", f"must be after since ({query.since.isoformat()}), got {query.until.isoformat()}"
        )


async def fetch(conn: Conn, query: LiteralString | sql.Composed, params: Mapping[str, Any]) -> list[Row]:
    """Rows of a report query, run unprepared."""
    # Unprepared on purpose: an unnamed statement is planned with its actual parameter values, so the
    # optional filters fold away and the index of the filter in use is chosen. A prepared statement could
    # switch to a generic plan that reads every row.
    return await (await conn.execute(query, params, prepare=False)).fetchall()


async def run(conn: Conn, spec: ReportSpec, query: ReportQuery) -> Page:
    """One page of ``spec`` for the typed ``query``, and its summary over the whole window."""
    sort = spec.sort(query.sort)
    _check(spec, query, sort)
    params: dict[str, Any] = {}
    for f in spec.filters:
        value = query.filters.get(f.name)
        # psycopg sends a list as an array; a tuple is not adapted.
        params[f.name] = list(value) if isinstance(value, tuple) else value
    params["since"], params["until"] = query.since, query.until
    window = dict(params)
    params["limit"] = query.limit + 1
    for i, value in enumerate(query.after or ()):
        params[f"after_{i}"] = value
    rows = await fetch(conn, compose(spec, sort, query.after), params)
    # One row more than asked tells whether there is a next page without a count.
    items = rows[: query.limit]
    next_after = tuple(items[-1][f] for f in sort.fields) if len(rows) > query.limit else None
    if spec.shape is not None:
        items = [spec.shape(row) for row in items]
    summary = await fetch(conn, Q[spec.summary.query], window) if spec.summary else []
    return Page(spec, query.since, query.until, sort, items, next_after, summary)


def by_name(specs: Sequence[ReportSpec]) -> dict[str, ReportSpec]:
    """Specs keyed by name; a name given twice is an error."""
    named: dict[str, ReportSpec] = {}
    for spec in specs:
        if spec.name in named:
            raise ValueError(f"report {spec.name!r} is declared twice")
        named[spec.name] = spec
    return named
