"""The shape every maintenance service has, and the loop that ticks them.

A service (River's ``job_rescuer.go`` is the model) is one concern: a frozen config dataclass whose
``DEFAULT_*`` constants are validated at construction, ``run_once(conn, *, now=None) -> Result`` that does
one bounded pass and returns counts, and tests that call ``run_once`` directly with ``now=`` moved instead
of sleeping. The services: ``rescuer.LeaseRescuer`` (expired leases), ``waker.PendingWaker`` (due jobs
nobody woke), ``retention.RetentionKeeper`` (windows, tombstones), ``sweeps.SweepRunner`` (the registry's
sweeps). ``reconciler.Reconciler`` is the scheduler that runs them in order, each in its own transaction
under its own advisory lock, so however many processes tick, one runs each service at a time; a
process that dies holds nothing, and one frozen or cut off holds a lock no longer than its session's
``idle_in_transaction_session_timeout`` (``ledger.db.DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT``).

``maintain_forever`` is the loop both the gateway and the worker run (through
``effectgate.handlers.worker.maintenance``): neither imports the other to get it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from .. import db
from ..db import Conn
from ..queries import Q

log = logging.getLogger("effectgate.maintenance")


class Result(Protocol):
    """What every service's ``run_once`` returns: counts, and whether anything worth logging happened."""

    @property
    def changed(self) -> bool: ...


R = TypeVar("R")


def lock_id(namespace: str, name: str) -> int:
    """A stable advisory lock id for ``name`` (signed 64-bit), the same across processes and versions."""
    digest = hashlib.sha256(f"{namespace}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def run_locked(conn: Conn, lock: int, work: Callable[[], Awaitable[R]]) -> tuple[bool, R | None]:
    """Run ``work`` in a transaction of its own if this connection gets ``lock``; ``(False, None)`` if
    another process holds it. The lock is transaction-scoped: it is released when ``work`` commits."""
    async with conn.transaction():
        row = await (await conn.execute(Q["maintenance_lock_try"], {"lock_id": lock})).fetchone()
        if row is None or not row["owned"]:
            return False, None
        return True, await work()


async def run_session_locked(
    conn: Conn, lock: int, work: Callable[[], Awaitable[R]]
) -> tuple[bool, R | None]:
    """Like ``run_locked``, for work that commits several transactions of its own: the lock is held by the
    session and released when ``work`` returns (or the connection ends, if the process dies).

    While it is held the session's ``idle_session_timeout`` is its ``idle_in_transaction_session_timeout``:
    a process frozen or cut off between two of ``work``'s transactions is ended by the server within that
    bound, as one frozen inside a transaction is, instead of holding the keeper's lock until it resumes."""
    row = await (await conn.execute(Q["maintenance_session_lock_try"], {"lock_id": lock})).fetchone()
    if row is None or not row["owned"]:
        return False, None
    try:
        return True, await work()
    finally:
        await conn.execute(
            Q["maintenance_session_unlock"],
            {"lock_id": lock, "idle_session_timeout": row["idle_session_timeout"]},
        )


async def maintain_forever(
    pool: db.Pool,
    run_once: Callable[[Conn], Awaitable[R]],
    *,
    tick: float,
    stopping: asyncio.Event,
    on_result: Callable[[R], None] | None = None,
) -> None:
    """Call ``run_once`` on a pooled connection every ``tick`` seconds until ``stopping`` is set.

    A pass that throws is logged and the loop carries on: maintenance that stops after one database blip
    would leave expired leases and growing tables behind. ``on_result`` (metrics, logging of non-zero
    results) hears of every pass that completed.
    """
    while not stopping.is_set():
        try:
            async with db.connection(pool) as conn:
                result = await run_once(conn)
            if on_result is not None:
                on_result(result)
        except Exception as exc:
            log.error("maintenance.failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), tick)
