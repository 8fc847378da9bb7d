"""The worker's wake-up: a LISTEN connection of its own, outside the pool, re-opened when it drops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from effectgate.ledger import db, jobs

log = logging.getLogger("effectgate.worker")

# A lost LISTEN connection is re-opened after this, doubling up to the poll interval: a server restart
# should not cost a full poll interval of latency, a server that stays down should not be hammered.
LISTEN_RETRY_MIN = 0.05
LISTEN_APPLICATION_NAME = "effectgate-listen"


async def listen_for_jobs(
    url: str | None,
    *,
    wake: asyncio.Event,
    listening: asyncio.Event,
    stopping: asyncio.Event,
    max_delay: float,
    notified: Callable[[], None] | None = None,
) -> None:
    """LISTEN for new and re-queued jobs, setting ``wake`` on each notification; re-established whenever the
    connection drops, until ``stopping``. ``listening`` is set while subscribed. ``notified``, when given, is
    called with each wake-up, before ``wake`` is set: a worker counts them, to tell whether one arrived while
    a refill's fetch could not see its job (``Worker._refilled``)."""
    if url is None:
        return
    delay = LISTEN_RETRY_MIN
    while not stopping.is_set():
        try:
            conn = await db.connect(url, application_name=LISTEN_APPLICATION_NAME)
            async with conn:
                await jobs.listen(conn)
                delay = LISTEN_RETRY_MIN
                listening.set()
                _wake(wake, notified)  # anything notified while we were not listening
                async for _ in conn.notifies():
                    _wake(wake, notified)
        except Exception as exc:
            if stopping.is_set():
                return
            log.warning("worker.listen_lost", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            listening.clear()
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)


def _wake(wake: asyncio.Event, notified: Callable[[], None] | None) -> None:
    if notified is not None:
        notified()
    wake.set()
