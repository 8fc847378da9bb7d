"""Whom a failed statement's error belongs to, read from its SQLSTATE class: one row's values, the
connection or server, this session's lock or statement timeout, or anything else.

The claim batcher and the finish batches ask it what a failed batch means: a row's refusal is split off and the
rest written, while a lost connection took the whole transaction with it. Turning driver errors into ledger
errors is ``ledger.db.translate_errors``.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import psycopg
import psycopg_pool

ErrorKind: TypeAlias = Literal["connection", "row", "lock_timeout", "statement_timeout", "other"]

# SQLSTATE classes that say one row's values were refused, whatever the server's state: 22 data exception
# (a NUL, a bad encoding, a number out of range), 23 integrity constraint violation, 54 program limit exceeded
# (a value over a btree index row's 2,704 bytes: an over-long unsigned header as event type).
_ROW_CLASSES = frozenset({"22", "23", "54"})
# The session or the server cannot go on, or the transaction was rolled back for the database's own reasons:
# 08 connection exception, 40 transaction rollback (deadlock, serialisation), 53 insufficient resources, 57P01
# to 57P05 shutdown, crash, cannot connect now, database dropped, idle timeout, 58 system error, XX internal.
_CONNECTION_CLASSES = frozenset({"08", "40", "53", "58", "XX"})
LOCK_NOT_AVAILABLE = "55P03"
# The server ended the session for sitting idle inside a transaction (idle_in_transaction_timeout).
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
QUERY_CANCELED = "57014"


def error_kind(exc: BaseException) -> ErrorKind:
    """Whom a failed statement's error belongs to: ``row`` (one row's values: the others may be written
    without it), ``connection`` (the session or server: nothing of the transaction was written, and
    splitting it would not help), ``lock_timeout`` / ``statement_timeout`` (this session's limits), or
    ``other`` (anything else, a bug included)."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return "connection"
    if isinstance(exc, UnicodeError):
        return "row"  # the driver cannot encode a value for the server
    if not isinstance(exc, psycopg.Error):
        return "other"
    state = exc.sqlstate
    if state is None:
        # Refused by the driver before sending (a NUL in a text parameter), or the socket went away.
        if isinstance(exc, psycopg.DataError):
            return "row"
        return "connection" if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) else "other"
    if state == LOCK_NOT_AVAILABLE:
        return "lock_timeout"
    if state == QUERY_CANCELED:
        return "statement_timeout"
    if state == IDLE_IN_TRANSACTION_TIMEOUT:
        return "connection"
    if state[:2] in _ROW_CLASSES:
        return "row"
    if state[:2] in _CONNECTION_CLASSES or state.startswith("57P"):
        return "connection"
    return "other"
