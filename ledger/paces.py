"""A downstream's pace kept in the ledger, so every worker process takes its calls' turns from one schedule.

``LedgerTurns`` is the ``SharedTurns`` of ``handlers/downstream/pace.py`` over the ``downstream_paces`` table
(migration 0027): a turn is reserved by one upsert of the downstream's row, which the row's lock makes one at a
time across processes, and whose times are the database server's clock, so processes on hosts whose clocks
disagree still space their calls. A call that waited for its turn asks once more before it is sent, whether a
``429`` set a hold meanwhile. Each statement takes a pooled connection for itself alone, in autocommit: a
reservation holds the row's lock for the upsert, never across a wait.
"""

from __future__ import annotations

from . import db
from .queries import Q


class LedgerTurns:
    """The shared schedule of turns on ``pool``'s ledger. ``connect_wait`` bounds how long a statement waits for
    a pooled connection (a reservation also within its call's remaining wait)."""

    def __init__(self, pool: db.Pool, *, connect_wait: float = db.DEFAULT_POOL_TIMEOUT) -> None:
        self._pool = pool
        self._connect_wait = connect_wait

    async def take(self, name: str, interval: float, max_wait: float) -> tuple[bool, float]:
        """Reserve ``name``'s next turn: ``(True, seconds to wait)``, or ``(False, seconds away)`` when it is
        more than ``max_wait`` seconds off, nothing reserved."""
        args = {"name": name, "interval": float(interval), "max_wait": float(max_wait)}
        async with db.translate_errors(), self._pool.connection(self._wait(max_wait)) as conn:
            row = await (await conn.execute(Q["pace_turn_take"], args)).fetchone()
            if row is not None:
                return True, max(0.0, row["wait"])
            row = await (await conn.execute(Q["pace_turn_wait"], {"name": name})).fetchone()
        return False, row["wait"] if row is not None else 0.0

    async def hold(self, name: str, seconds: float) -> None:
        """No turn of ``name`` starts sooner than ``seconds`` from now; a longer hold is kept."""
        async with db.translate_errors(), self._pool.connection(self._connect_wait) as conn:
            await conn.execute(Q["pace_hold_set"], {"name": name, "seconds": float(seconds)})

    async def held(self, name: str) -> float:
        """Seconds left of ``name``'s hold (0: none)."""
        async with db.translate_errors(), self._pool.connection(self._connect_wait) as conn:
            row = await (await conn.execute(Q["pace_hold_left"], {"name": name})).fetchone()
        return row["held"] if row is not None else 0.0

    def _wait(self, max_wait: float) -> float:
        # psycopg_pool refuses a timeout of 0; a call with no wait left still gets its statement's connection.
        return max(0.05, min(self._connect_wait, max_wait))
