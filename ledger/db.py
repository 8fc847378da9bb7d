"""Connections, transactions and the one place driver errors become ledger errors."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeAlias, TypeVar

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row

from . import timeline
from .errors import LedgerError, LedgerUnavailable
from .queries import Q

Conn: TypeAlias = psycopg.AsyncConnection[DictRow]
Pool: TypeAlias = psycopg_pool.AsyncConnectionPool[Conn]

DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10
DEFAULT_POOL_TIMEOUT = 5.0
# The Postgres schema every effectgate object lives in, so a ledger can share a database with an
# application's own `jobs` or `schema_migrations` (docs/adr/0019-own-schema.md).
DEFAULT_SCHEMA = "effectgate"
# Waits between start-up connection attempts: quick at first (a container still starting), then
# capped, so a database that comes back is found within a few seconds.
STARTUP_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
STARTUP_ATTEMPT_TIMEOUT = 10.0
# A server that answered but refused for one of these reasons may accept soon; any other answer
# (unknown database or role, bad password) will not change by waiting.
_TRANSIENT_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery",
    "not yet accepting connections",
    "too many clients",
    "remaining connection slots",
)

# Client-side bounds on every connection effectgate opens, each applied only where the URL does not set it
# (deploy/README.md, "Failover"). Without them a connection whose server vanished without a FIN (a primary
# host lost, a partition) waits for the kernel's defaults: two hours of idle before the first keepalive, and
# about 15 minutes of unacknowledged writes. With them a dead peer is found within ~25 s idle (10 s + 3 x 5 s)
# or 30 s with a write outstanding, and a host that does not answer a connect is passed over after 10 s
# (libpq tries the next host of a multi-host URL). Client-side libpq parameters: PgBouncer never sees them.
CONNECTION_DEFAULTS: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",  # milliseconds
    "connect_timeout": "10",
}

# The server-side bound on a client that is gone while it holds a transaction (and so its locks): a process
# SIGSTOPped, or cut off by a partition, mid-transaction. The client-side bounds above end only the client's
# side; without this the server keeps the session, its row locks and its transaction-scoped advisory locks
# until the client resumes, or for a cut peer until the kernel gives up (about 2 h 11 min at Linux defaults),
# and every other process skips the maintenance service it holds (deploy/README.md, "Frozen or cut-off
# processes"). 30 s: far above any pause the project makes inside a transaction (its transactions hold only
# round trips and Python between them, a claim batch's rounds or a finish batch's refill), and, like
# tcp_user_timeout, short enough that a rescue waits seconds, not hours. The same figure bounds the partition
# and retention keepers' session-level lock while held (maintenance.service.run_session_locked).
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT = 30.0
# The server's own TCP keepalives and user timeout on the session, the client-side figures mirrored, so the
# server also notices a cut peer that sits idle *outside* a transaction (a session-level lock, a LISTEN) in
# ~25 s, or ~30 s with data it could not deliver, instead of the kernel's two hours. Ignored (reads 0) on a
# Unix-domain socket, where there is no network to cut. Set with SET, as the rest: PgBouncer refuses "options".
SERVER_BOUNDS: dict[str, str] = {
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "user_timeout": "30000",  # milliseconds
}

# Waits between tries of a write whose database was lost (retry_while_unavailable): quick for a dropped
# connection the pool replaces at once, then every 2 s while a standby is promoted.
OUTAGE_RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0)

T = TypeVar("T")

log = logging.getLogger("effectgate.ledger")


class _NotWritable(psycopg.OperationalError):
    """The connection reached a server that cannot write now (a standby, or read-only by default)."""


def connection_defaults(url: str) -> dict[str, Any]:
    """The ``CONNECTION_DEFAULTS`` that ``url`` does not set itself, as connect keyword arguments: a
    setting in the URL always wins. A URL that is not a connection string gets none (the connect that
    follows says what is wrong with it)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {}
    return {name: value for name, value in CONNECTION_DEFAULTS.items() if name not in params}


async def _check_writable(conn: Conn) -> None:
    # Run by the pool before it hands out a connection: a connection whose server died (a failover, a
    # restart, pg_terminate_backend) fails here, not in the caller's statement, and the pool opens another;
    # one that reached a standby (a multi-host URL without target_session_attrs=read-write, or a primary
    # demoted under us) is refused the same way. One round trip, as psycopg_pool's own check_connection.
    cur = await conn.execute(Q["session_writable_check"], prepare=False)
    row = await cur.fetchone()
    if row is not None:
        timeline.WATCH.observe(row["timeline"])
    if not (row and row["writable"]):
        # Closed, not just refused: the pool puts a refused connection that still works back in the pool
        # (it discards only broken ones), and would hand it out again.
        await conn.close()
        raise _NotWritable("the server is read-only (a standby, or default_transaction_read_only)")


def check_schema_name(name: str) -> str:
    """``name`` if Postgres can use it as effectgate's schema, else ``ValueError`` saying why."""
    if not name or name != name.strip():
        raise ValueError(f"expected a schema name without surrounding spaces, got {name!r}")
    if len(name.encode("utf-8")) > 63:
        raise ValueError(f"a Postgres name has at most 63 bytes, got {name!r}")
    if name.lower().startswith("pg_") or "\0" in name:
        raise ValueError(f"names starting with pg_ are reserved by Postgres, got {name!r}")
    return name


async def use_schema(conn: Conn, schema: str) -> None:
    """Point ``conn``'s ``search_path`` at ``schema`` alone, for the life of the session: every
    effectgate statement is written unqualified and finds its tables, types and functions there, and no
    application table in ``public`` is ever in reach. ``pg_catalog`` is searched first regardless."""
    await conn.execute(Q["session_schema_set"], {"schema": schema})


async def _configure(
    conn: Conn,
    *,
    schema: str,
    lock_timeout: float | None,
    statement_timeout: float | None,
    idle_in_transaction_timeout: float | None,
) -> None:
    # Every statement is its own transaction unless a caller opens one: no idle-in-transaction sessions
    # left behind by a forgotten commit.
    await conn.set_autocommit(True)
    # Once per new connection with SET (session mode keeps it; the libpq "options" parameter is refused
    # by PgBouncer at connect), not per checkout.
    await use_schema(conn, schema)
    await conn.execute(
        Q["session_server_bounds_set"],
        {"idle_in_transaction": _millis(idle_in_transaction_timeout), **SERVER_BOUNDS},
    )
    if lock_timeout is not None or statement_timeout is not None:
        # Once per connection (not SET LOCAL per transaction: a round trip per batch), and with SET rather
        # than the libpq "options" parameter, which PgBouncer refuses at connect.
        await conn.execute(
            Q["session_timeouts_set"],
            {"lock_timeout": _millis(lock_timeout), "statement_timeout": _millis(statement_timeout)},
        )


def _millis(seconds: float | None) -> str:
    # 0 is Postgres's "no limit"; a setting of at least 1 ms, as the server counts in whole milliseconds.
    return "0" if seconds is None else str(max(1, round(seconds * 1000)))


def make_pool(
    url: str,
    *,
    min_size: int = DEFAULT_POOL_MIN,
    max_size: int = DEFAULT_POOL_MAX,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    name: str = "effectgate",
    lock_timeout: float | None = None,
    statement_timeout: float | None = None,
    schema: str = DEFAULT_SCHEMA,
    idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
) -> Pool:
    """A connection pool (not yet opened) whose connections return rows as dicts, in autocommit.

    ``lock_timeout`` and ``statement_timeout`` (seconds; None: the server's own) are set on every
    connection of the pool: give them to a pool of its own, such as the gateway's claim pool, not to one
    whose reports or maintenance may rightly run longer. Every connection's ``search_path`` is
    ``schema`` (``use_schema``). ``idle_in_transaction_timeout`` (seconds; None: no limit) is how long the
    server lets a session sit idle inside a transaction before it ends it, and its locks with it: the bound on
    a frozen or cut-off process (``DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT``); the server's TCP keepalives are
    set too (``SERVER_BOUNDS``).

    Each connection is checked before it is handed out (``_check_writable``): a dead one, or one on a
    server that cannot write, is discarded and another opened, so a failover or a restarted server costs
    no caller an error. Keepalives and a TCP user timeout bound how long a vanished server goes unnoticed
    (``CONNECTION_DEFAULTS``, where ``url`` does not set them).
    """
    return psycopg_pool.AsyncConnectionPool(
        url,
        connection_class=psycopg.AsyncConnection[DictRow],
        kwargs={"row_factory": dict_row, **connection_defaults(url)},
        check=_check_writable,
        configure=partial(
            _configure,
            schema=schema,
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            idle_in_transaction_timeout=idle_in_transaction_timeout,
        ),
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        name=name,
        open=False,
    )


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Turn a lost or unreachable database into ``LedgerUnavailable``, any other driver error into
    ``LedgerError``; the project's own errors pass unchanged."""
    try:
        yield
    except (
        psycopg.OperationalError,
        psycopg.errors.IdleInTransactionSessionTimeout,
        psycopg_pool.PoolTimeout,
        psycopg_pool.PoolClosed,
    ) as exc:
        # 25P03 is an InternalError to psycopg, but it is the server ending the session (this process sat
        # frozen inside a transaction past idle_in_transaction_timeout): the connection is gone, as for any
        # other lost connection, and a write that is safe to retry is retried on another.
        raise LedgerUnavailable(f"ledger database unavailable: {type(exc).__name__}") from exc
    except psycopg.Error as exc:
        raise LedgerError(f"ledger database error: {type(exc).__name__}: {exc}") from exc


@asynccontextmanager
async def connection(pool: Pool) -> AsyncIterator[Conn]:
    """A pooled connection, with driver errors translated."""
    async with translate_errors(), pool.connection() as conn:
        yield conn


async def retry_while_unavailable(
    op: Callable[[], Awaitable[T]],
    *,
    within: float,
    on_retry: Callable[[LedgerUnavailable, float], None] | None = None,
) -> T:
    """``await op()``, again after a growing wait (``OUTAGE_RETRY_DELAYS``) each time it raises
    ``LedgerUnavailable`` — the database lost or unreachable: a failover, a restart — for up to ``within``
    seconds; then the last ``LedgerUnavailable`` is raised. ``on_retry(error, delay)`` hears of each retry.

    Only for a write that is safe to send twice: one that committed before its answer was lost must
    change nothing the second time, or say so (a fenced write whose lease the first try ended raises
    ``LeaseLost``)."""
    deadline = time.monotonic() + within
    attempt = 0
    while True:
        try:
            return await op()
        except LedgerUnavailable as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            delay = min(OUTAGE_RETRY_DELAYS[min(attempt, len(OUTAGE_RETRY_DELAYS) - 1)], remaining)
            attempt += 1
            if on_retry is not None:
                on_retry(exc, delay)
            await asyncio.sleep(delay)


def describe(url: str) -> str:
    """Where ``url`` points, for a message: host, port, database and user — never the password.

    Raises ``ValueError`` when ``url`` is not a connection string at all.
    """
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"not a valid PostgreSQL connection URL: {str(exc).strip()}") from None
    host = params.get("host") or params.get("hostaddr") or "the default local socket"
    if str(host).startswith("/"):
        host = f"socket directory {host}"
    port = params.get("port") or "5432"
    user = params.get("user") or "(the login name)"
    database = params.get("dbname") or user
    return f"host {host}, port {port}, database {database!r}, user {user!r}"


def _reason(exc: psycopg.Error, url: str) -> str:
    """The driver's own words for a failed connection, on one line and without the password."""
    text = str(exc).strip()
    for prefix in ("connection failed: ", "connection is bad: "):
        text = text.removeprefix(prefix)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    # libpq says where it tried ('connection to server at "h", port p failed: …'); the description
    # already says so, the reason is what follows.
    if " failed: " in first:
        first = first.split(" failed: ", 1)[1]
    first = first.removeprefix("FATAL:").strip()
    hint = " ".join(lines[1:])
    reason = f"{first} ({hint[0].lower() + hint[1:]})" if hint else first
    try:
        password = conninfo_to_dict(url).get("password")
    except psycopg.ProgrammingError:
        password = None
    if password:
        reason = reason.replace(str(password), "***")
    return reason


def _may_come_up(exc: psycopg.Error) -> bool:
    # A server that answered with FATAL is up; it refused us. Anything else (refused, timed out, no
    # route, name not resolved, socket missing) is a database that may not be up yet.
    text = str(exc)
    if "FATAL" not in text:
        return True
    return any(refusal in text for refusal in _TRANSIENT_REFUSALS)


async def connect(
    url: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    lock_timeout: float | None = None,
    statement_timeout: float | None = None,
    idle_in_transaction_timeout: float | None = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
    **kwargs: Any,
) -> Conn:
    """A single connection outside any pool (CLI commands, LISTEN, readiness), in autocommit, rows as
    dicts, its ``search_path`` set to ``schema`` (``use_schema``), and ``lock_timeout``,
    ``statement_timeout`` and the server-side bounds (``idle_in_transaction_timeout``, ``SERVER_BOUNDS``)
    set as ``make_pool`` sets them on a pool's connections.

    A failure to connect is ``LedgerUnavailable`` whose message names host, port, database, user and
    the reason, never the password (it is for operators: the HTTP face never shows it).
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row, **{**connection_defaults(url), **kwargs}
        )
    except psycopg.Error as exc:
        try:
            where = describe(url)
        except ValueError as bad:
            raise LedgerError(f"DATABASE_URL: {bad}") from exc
        raise LedgerUnavailable(f"cannot connect to Postgres at {where}: {_reason(exc, url)}") from exc
    try:
        async with translate_errors():
            await _configure(
                conn,
                schema=schema,
                lock_timeout=lock_timeout,
                statement_timeout=statement_timeout,
                idle_in_transaction_timeout=idle_in_transaction_timeout,
            )
    except BaseException:
        await conn.close()
        raise
    return conn


async def wait_until_reachable(url: str, wait: float) -> None:
    """Connect to ``url`` once, retrying with backoff for up to ``wait`` seconds while the server
    cannot be reached (down, starting, refusing for now); each failed try is logged with its reason.

    Raises ``LedgerUnavailable`` when the time is up, or at once when the server answered with a refusal
    waiting will not change (unknown database or role, bad password); ``LedgerError`` when ``url`` is
    not a connection URL. Each message says where it tried and why it failed.
    """
    try:
        where = describe(url)
    except ValueError as exc:
        raise LedgerError(f"DATABASE_URL: {exc}") from None
    deadline = time.monotonic() + wait
    attempt = 0
    error: Exception
    while True:
        attempt += 1
        limit = max(1.0, min(STARTUP_ATTEMPT_TIMEOUT, deadline - time.monotonic()))
        try:
            async with asyncio.timeout(limit):
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True, **connection_defaults(url))
        except TimeoutError as exc:
            reason, error = f"no answer within {limit:g}s", exc
        except psycopg.Error as exc:
            reason, error = _reason(exc, url), exc
            if not _may_come_up(exc):
                raise LedgerUnavailable(f"cannot connect to Postgres at {where}: {reason}") from exc
        else:
            await conn.close()
            if attempt > 1:
                log.info("database.reachable", extra={"attempt": attempt, "where": where})
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
            raise LedgerUnavailable(
                f"cannot connect to Postgres at {where}: {reason}; gave up after {tries} in {wait:g}s "
                "(to wait longer, set [database] startup_wait, --startup-wait or EFFECTGATE_DATABASE__STARTUP_WAIT)"
            ) from error
        delay = min(STARTUP_RETRY_DELAYS[min(attempt, len(STARTUP_RETRY_DELAYS)) - 1], remaining)
        log.warning(
            "database.unreachable",
            extra={"attempt": attempt, "where": where, "reason": reason, "retry_in": round(delay, 2)},
        )
        await asyncio.sleep(delay)
