"""The worker's wake-up: a LISTEN connection of its own, outside the pool, re-opened when it drops."""

from __future__ import annotations

import asyncio
import logging

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
) -> None:
    """LISTEN for new and re-queued jobs, setting ``wake`` on each notification; re-established whenever the
    connection drops, until ``stopping``. ``listening`` is set while subscribed."""
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
                wake.set()  # anything notified while we were not listening
                async for _ in conn.notifies():
                    wake.set()
        except Exception as exc:
            if stopping.is_set():
                return
            log.warning("worker.listen_lost", extra={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            listening.clear()
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)
