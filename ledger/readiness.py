"""Readiness asked on one connection of its own, reconnected by the probe that finds it gone.

A pool was the wrong tool here: after an outage it reconnects on a growing backoff, so readiness lagged the
database by up to half a minute while requests on the other pools were answered again, and every replica
left the load balancer together. A probe that finds its connection gone connects again at once.
"""

from __future__ import annotations

import asyncio

from . import db
from .errors import LedgerError, LedgerUnavailable
from .migrate import unapplied
from .queries import Q

# Shown in pg_stat_activity, so an operator tells the probe's one connection from the pools'.
APPLICATION_NAME = "effectgate-readyz"


class ReadinessProbe:
    """Whether the ledger answers and which migrations it lacks, asked on one dedicated connection.

    ``check()`` returns the unapplied migrations (``migrate.unapplied``) or raises ``LedgerError`` /
    ``LedgerUnavailable`` (or ``TimeoutError`` past ``timeout`` seconds, which bounds the whole check,
    connecting included). A connection found broken is closed and a new one made within the same check, so
    the first check after the database is back answers. Concurrent checks share the one in flight: at most
    one connection attempt and one check run at a time, however many probes arrive. Once a connection has found
    the ledger migrated, each later check on it is one ``SELECT 1`` (migrations are not undone under a running
    ledger); a new connection — after an outage, or a failover to another server — asks about migrations again.
    """

    def __init__(self, url: str, *, schema: str = db.DEFAULT_SCHEMA, timeout: float) -> None:
        self.url = url
        self.schema = schema
        self.timeout = timeout
        self._conn: db.Conn | None = None
        self._in_flight: asyncio.Future[list[str]] | None = None
        self._closed = False
        # This connection found every migration applied: later checks on it only ask whether it answers.
        self._migrated = False

    async def check(self) -> list[str]:
        """The migrations the ledger lacks (empty when ready); raises when it cannot be asked."""
        if self._closed:
            raise LedgerUnavailable("the readiness probe is closed")
        if self._in_flight is None:
            self._in_flight = asyncio.ensure_future(self._check())
            self._in_flight.add_done_callback(self._finished)
        # Shielded: a probe whose client went away must not cancel the check the others wait on.
        return await asyncio.shield(self._in_flight)

    def _finished(self, done: asyncio.Future[list[str]]) -> None:
        if self._in_flight is done:
            self._in_flight = None
        # Retrieved here so a check whose every waiter was cancelled logs no "never retrieved" error.
        if not done.cancelled():
            done.exception()

    async def _check(self) -> list[str]:
        async with asyncio.timeout(self.timeout):
            try:
                if self._conn is not None and not self._conn.closed:
                    try:
                        async with db.translate_errors():
                            return await self._ask(self._conn)
                    except LedgerUnavailable:
                        # Kept from before an outage, its socket is dead though nothing said so until now: a
                        # new connection answers this probe, rather than a 503 and a wait for the next probe.
                        await self._discard()
                self._conn = await db.connect(
                    self.url,
                    schema=self.schema,
                    statement_timeout=self.timeout,
                    application_name=APPLICATION_NAME,
                )
                async with db.translate_errors():
                    return await self._ask(self._conn)
            except LedgerError as exc:
                if isinstance(exc, LedgerUnavailable) or self._conn is None or self._conn.broken:
                    await self._discard()
                raise
            except BaseException:
                # Past the timeout (or cancelled) mid-statement, the session's state is unknown.
                await self._discard()
                raise

    async def _ask(self, conn: db.Conn) -> list[str]:
        if self._migrated:
            await conn.execute(Q["readiness_ping"])
            return []
        pending = await unapplied(conn)
        self._migrated = not pending
        return pending

    async def _discard(self) -> None:
        self._migrated = False
        conn, self._conn = self._conn, None
        if conn is not None:
            # Closing a dead socket does not wait on the server.
            await conn.close()

    async def close(self) -> None:
        """Wait for a check in flight, then close the connection; later checks raise ``LedgerUnavailable``."""
        self._closed = True
        if self._in_flight is not None:
            await asyncio.gather(self._in_flight, return_exceptions=True)
        await self._discard()
