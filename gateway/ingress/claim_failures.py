"""What a delivery whose claim failed is answered, and what is logged and recorded beside it.

Every answer here says nothing was claimed, so the provider's retry is safe: a 503 with ``Retry-After`` for a busy or unreachable ledger (``overloaded``, ``claim_timeout``, ``ledger_unavailable``,
``migrations_pending``), and a 500 ``ledger_error`` for anything else. A delivery Postgres refused
(``DeliveryRefused``) is not one of them: the pipeline keeps it as a refused delivery (``refusals``). The driver's words (which can name
hosts, indexes, error classes) go to the log, never to the sender.
"""

from __future__ import annotations

import logging

from effectgate.ledger import db
from effectgate.ledger.errors import (
    ClaimOverloaded,
    ClaimTimeout,
    LedgerError,
    LedgerUnavailable,
)
from effectgate.ledger.migrate import unapplied

from .. import metrics
from ..config import Source
from .answers import Answer, error_answer, retry_later

log = logging.getLogger("effectgate.gateway")


async def claim_failed(
    exc: LedgerError,
    *,
    pool: db.Pool,
    source: Source,
    request_id: str,
) -> Answer:
    """The answer to a delivery of ``source`` whose claim raised ``exc``; nothing of it was written."""
    name = source.name
    if isinstance(exc, ClaimOverloaded):
        # Refused before queueing: this answer holds nothing, and costs no database work.
        metrics.delivery(name, "overloaded")
        return retry_later("overloaded", str(exc))
    if isinstance(exc, ClaimTimeout):
        metrics.delivery(name, "claim_timeout")
        log.warning(
            "delivery.claim_timeout",
            extra={
                "source": name,
                "request_id": request_id,
                "reason": exc.reason,
                "sqlstate": _sqlstate(exc),
            },
        )
        return retry_later("claim_timeout", str(exc))
    if isinstance(exc, LedgerUnavailable):
        metrics.delivery(name, "ledger_unavailable")
        log.warning(
            "delivery.ledger_unavailable",
            extra={
                "source": name,
                "request_id": request_id,
                "sqlstate": _sqlstate(exc),
                "error": _cause(exc),
            },
        )
        return error_answer(
            503, "ledger_unavailable", "the ledger database is unavailable; nothing was claimed"
        )
    return await _ledger_error(pool, name, request_id, exc)


async def _ledger_error(pool: db.Pool, name: str, request_id: str, exc: LedgerError) -> Answer:
    # Rolled back: nothing was acknowledged, so the provider's retry is safe.
    pending = await _pending_migrations(pool, exc)
    if pending:
        # A schema behind this version (`serve --no-migrate` past a deploy that did not migrate): a 503 the
        # provider retries until someone migrates, and a code saying what to do, not a 500.
        metrics.delivery(name, "migrations_pending")
        log.error(
            "delivery.migrations_pending",
            extra={"source": name, "request_id": request_id, "pending": pending},
        )
        return error_answer(
            503,
            "migrations_pending",
            "the ledger's schema is behind this gateway (migrations pending); nothing was claimed",
        )
    log.error(
        "delivery.ledger_error",
        extra={"source": name, "request_id": request_id, "sqlstate": _sqlstate(exc), "error": _cause(exc)},
    )
    metrics.delivery(name, "ledger_error")
    return error_answer(500, "ledger_error", "the delivery could not be recorded; nothing was claimed")


# What a statement meets on a schema older than the code: a table, column, function, type or schema missing.
_SCHEMA_MISSING_STATES = frozenset({"42P01", "42703", "42883", "42704", "3F000"})


async def _pending_migrations(pool: db.Pool, exc: LedgerError) -> list[str]:
    """The migrations the ledger lacks when ``exc`` is a statement meeting a missing schema object, else
    none. Asked of the database only on that error, so a dropped table in a migrated ledger stays a 500."""
    if _sqlstate(exc) not in _SCHEMA_MISSING_STATES:
        return []
    try:
        async with db.connection(pool) as conn:
            return await unapplied(conn)
    except LedgerError:
        return []


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
