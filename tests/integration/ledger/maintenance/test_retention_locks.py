"""Retention holds no row lock for longer than one batch: each batch commits on its own, so a late retry of a
key whose row an earlier batch purged is claimed at once while retention is still busy with later batches.
Raced for real: a later batch is held up on a row lock another connection holds, and the claim runs then."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, Duplicate
from effectgate.ledger.maintenance import retention
from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper
from tests.integration import jobs_and_workers as jf
from tests.integration.ledger.maintenance.retention_rows import day, deliver, effect, finished

pytestmark = pytest.mark.anyio

KEYS = [f"order-{n:02}" for n in range(12)]
BATCH = 4  # three batches; the second holds KEYS[4:8]


async def waiting_on_a_lock(conn: db.Conn, pid: int) -> bool:
    row = await (
        await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    ).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"


@pytest.mark.parametrize("phase", ["payloads", "tombstones"])
async def test_a_key_an_earlier_batch_handled_is_claimed_while_a_later_batch_is_still_running(
    db_url: str, phase: str
) -> None:
    async with jf.connected(db_url) as conn:
        for n, key in enumerate(KEYS):
            await finished(conn, key, day(0) + timedelta(minutes=n))  # batches go oldest first
        if phase == "payloads":
            config, when = RetentionConfig(payloads=1 * DAY, batch=BATCH), day(2)
        else:
            await RetentionKeeper(RetentionConfig(payloads=1 * DAY)).run_once(conn, now=day(2))
            config, when = RetentionConfig(payloads=1 * DAY, tombstones=3 * DAY, batch=BATCH), day(5)
        held = await effect(conn, KEYS[5])
        assert held is not None
    async with (
        jf.connected(db_url) as blocker,
        jf.connected(db_url) as keeper_conn,
        jf.connected(db_url) as claimer,
        jf.connected(db_url) as watch,
    ):
        # The second batch purges (or deletes) KEYS[5]'s recorded step, and has to wait for this lock.
        await blocker.execute("BEGIN")
        await blocker.execute("SELECT 1 FROM steps WHERE effect_id = %s FOR UPDATE", (held["id"],))
        keeper = asyncio.create_task(RetentionKeeper(config).run_once(keeper_conn, now=when))
        try:
            pid = keeper_conn.info.backend_pid
            await jf.wait_for(lambda: waiting_on_a_lock(watch, pid), 20, "retention's second batch to wait")
            # The first batch is committed: its rows are free. With the pass in one transaction, this claim
            # waited for the pass to end (here: for ever) and lock_timeout refuses it instead.
            await claimer.execute("SET lock_timeout = '5s'")
            late = await deliver(claimer, KEYS[1], when + timedelta(hours=1))
            if phase == "payloads":
                assert isinstance(late, Duplicate) and late.delivery_count == 2
                purged = await effect(watch, KEYS[1])
                assert purged is not None and purged["payload"] is None
            else:
                assert isinstance(late, Accepted)  # the tombstone went with the first batch: the key is new
            # What the committed batch purged is counted already, before the pass ends.
            what = "effects.payload" if phase == "payloads" else "effects"
            assert (await retention.purge_totals(watch)).get(what) == BATCH
        finally:
            await blocker.execute("ROLLBACK")
            result = await keeper
    assert result.purged[what] == len(KEYS)
