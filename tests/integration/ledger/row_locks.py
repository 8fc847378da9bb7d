"""A claim caught in flight: another session holds a claim row locked, and the claim statement waiting for it is
found in pg_stat_activity. Postgres's state is polled with a one-minute guard against a hang, never a timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from effectgate.ledger import db


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait for a condition Postgres will reach (it is Postgres's state, so polled); the deadline of a minute
    guards against a hang, it is not a timing."""
    deadline = time.monotonic() + 60
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition was never reached")
        await asyncio.sleep(0.01)


async def waiting_on_a_lock(admin: db.Conn) -> int:
    """The pid of a claim statement of this database waiting for a lock, once there is one (a claim's, not a
    maintenance pass's that may also wait on the held row)."""
    pids: list[int] = []

    async def found() -> bool:
        rows = await (
            await admin.execute(
                # The claim statement's head: pg_stat_activity keeps only its first track_activity_query_size
                # bytes (1 kB by default), which the claim's INSERT INTO effects now lies beyond.
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query LIKE 'WITH input AS (%%unnest(%%'"
            )
        ).fetchall()
        pids[:] = [r["pid"] for r in rows]
        return bool(pids)

    await until(found)
    return pids[0]


async def hold_row_lock(db_url: str, key: str) -> db.Conn:
    """Another session holding the claim row of ``key`` locked (as a long maintenance pass would)."""
    holder = await db.connect(db_url)
    await holder.set_autocommit(False)
    await holder.execute("SELECT 1 FROM effects WHERE effect_key = %s FOR UPDATE", [key])
    return holder
