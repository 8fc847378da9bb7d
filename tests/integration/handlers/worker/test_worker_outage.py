"""A worker whose database goes away mid-job (a failover, a restart) keeps the outcome and writes it once the
database is back: the job ends as it would have, the downstream is called once, nothing is parked.

The outage is real: the test's database stops accepting connections and every session on it is terminated,
from another database, while the handler is inside its step; it comes back once the worker has said it is
waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from effectgate.handlers import EffectContext, Event
from effectgate.ledger import db
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry, wait_state

pytestmark = pytest.mark.anyio


# The database comes back after this many retries of the write: more than the few tries (1.75 s) a lost
# connection used to get before the outcome was left to lease expiry, and its orphan policy.
RETRIES_BEFORE_RETURN = 6


class Heard(logging.Handler):
    """Sets ``event`` once a record with message ``needle`` has been logged ``times`` times."""

    def __init__(self, needle: str, times: int) -> None:
        super().__init__()
        self.needle = needle
        self.times = times
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.needle:
            self.times -= 1
            if self.times <= 0:
                self.event.set()


async def _outage(server_url: str, name: str, *, allow: bool) -> None:
    admin = await psycopg.AsyncConnection.connect(server_url, autocommit=True)
    async with admin:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')  # type: ignore[arg-type]
        if not allow:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )


@pytest.mark.parametrize(
    ("where", "waiting"),
    [("step", "worker.write_retry"), ("finish", "worker.transition_retry")],
)
async def test_a_job_whose_database_went_away_mid_slice_succeeds_once_it_is_back_with_one_call(
    db_url: str, pg_server_url: str, where: str, waiting: str
) -> None:
    # A short wait for a connection, so each try during the outage gives up soon and the test is quick.
    pool = db.make_pool(db_url, min_size=1, max_size=4, timeout=0.5)
    await pool.open(wait=True)
    name = str(conninfo_to_dict(db_url)["dbname"])
    calls: Counter[str] = Counter()

    async def charge(idempotency_key: str) -> dict[str, Any]:
        calls[idempotency_key] += 1
        if where == "step":
            # The call reached the downstream; its record cannot be written now.
            await _outage(pg_server_url, name, allow=False)
        return {"charged": idempotency_key}

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await ctx.step("charge", charge)
        if where == "finish":
            await _outage(pg_server_url, name, allow=False)

    async with pool.connection() as conn:
        # orphan_policy park: were the outage taken for an orphan, the job would end parked.
        job_id = await claim(conn, max_attempts=1, orphan_policy="park")
    heard = Heard(waiting, RETRIES_BEFORE_RETURN)
    logger = logging.getLogger("effectgate.worker")
    logger.addHandler(heard)
    worker = make_worker(pool, registry(kind(handler, lease_ttl=120.0, orphan_policy="park")))
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(heard.event.wait(), 120)
        await _outage(pg_server_url, name, allow=True)
        conn = await db.connect(db_url)
        async with conn:
            row = await wait_state(conn, job_id, "succeeded", within=120)
            states = await (
                await conn.execute("SELECT state::text AS state, count(*) AS n FROM jobs GROUP BY 1")
            ).fetchall()
            steps = await (await conn.execute("SELECT name, status::text AS status FROM steps")).fetchall()
    finally:
        logger.removeHandler(heard)
        await _outage(pg_server_url, name, allow=True)
        worker.stop()
        await asyncio.wait_for(running, 60)
        await pool.close()
    assert row["attempt"] == 1  # not retried: the outcome waited for the database
    assert list(calls.values()) == [1]
    assert states == [{"state": "succeeded", "n": 1}]
    assert steps == [{"name": "charge", "status": "succeeded"}]
