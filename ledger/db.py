"""Connections, transactions and the one place driver errors become ledger errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import psycopg
import psycopg_pool
from psycopg.rows import DictRow, dict_row

from .errors import LedgerError, LedgerUnavailable

Conn: TypeAlias = psycopg.AsyncConnection[DictRow]
Pool: TypeAlias = psycopg_pool.AsyncConnectionPool[Conn]

DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10
DEFAULT_POOL_TIMEOUT = 5.0


async def _configure(conn: Conn) -> None:
    # Every statement is its own transaction unless a caller opens one: no idle-in-transaction sessions
    # left behind by a forgotten commit.
    await conn.set_autocommit(True)


def make_pool(
    url: str,
    *,
    min_size: int = DEFAULT_POOL_MIN,
    max_size: int = DEFAULT_POOL_MAX,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    name: str = "effectgate",
) -> Pool:
    """A connection pool (not yet opened) whose connections return rows as dicts, in autocommit."""
    return psycopg_pool.AsyncConnectionPool(
        url,
        connection_class=psycopg.AsyncConnection[DictRow],
        kwargs={"row_factory": dict_row},
        configure=_configure,
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
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
        raise LedgerUnavailable(f"ledger database unavailable: {type(exc).__name__}") from exc
    except psycopg.Error as exc:
        raise LedgerError(f"ledger database error: {type(exc).__name__}: {exc}") from exc


@asynccontextmanager
async def connection(pool: Pool) -> AsyncIterator[Conn]:
    """A pooled connection, with driver errors translated."""
    async with translate_errors(), pool.connection() as conn:
        yield conn


async def connect(url: str, **kwargs: Any) -> Conn:
    """A single connection outside any pool (CLI commands, LISTEN), in autocommit, rows as dicts."""
    async with translate_errors():
        return await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row, **kwargs)
