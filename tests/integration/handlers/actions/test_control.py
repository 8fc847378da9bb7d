"""An operator's cancel of a pending job runs the kind's on_transition in the same transaction."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate.handlers.actions import control
from effectgate.handlers.event import Transition
from effectgate.ledger import db, jobs
from tests.integration.jobs_and_workers import claim, kind, registry

pytestmark = pytest.mark.anyio


async def _noop(ctx: Any, ev: Any) -> None:
    return None


async def test_cancelling_a_pending_job_mirrors_it_in_the_same_transaction(conn: db.Conn) -> None:
    await conn.execute("CREATE TEMP TABLE mirror (job_id bigint, state text, in_tx boolean)")

    async def on_transition(c: db.Conn, t: Transition) -> None:
        row = await (
            await c.execute("SELECT state::text AS s FROM jobs WHERE id = %s", (t.job_id,))
        ).fetchone()
        assert row is not None
        await c.execute(
            "INSERT INTO mirror VALUES (%s, %s, %s)", (t.job_id, t.state, row["s"] == "cancelled")
        )

    reg = registry(kind(_noop, on_transition=on_transition))
    job_id = await claim(conn)
    assert await control.cancel(conn, reg, job_id, by="operator:test") == "cancelled"
    mirrored = await (await conn.execute("SELECT * FROM mirror")).fetchall()
    assert mirrored == [{"job_id": job_id, "state": "cancelled", "in_tx": True}]


async def test_a_failing_hook_does_not_block_the_cancel(conn: db.Conn) -> None:
    async def broken(c: db.Conn, t: Transition) -> None:
        raise RuntimeError("mirror table is gone")

    reg = registry(kind(_noop, on_transition=broken))
    job_id = await claim(conn)
    assert await control.cancel(conn, reg, job_id, by="operator:test") == "cancelled"
    job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "cancelled"


async def test_a_running_job_is_flagged_and_its_hook_waits_for_the_worker(conn: db.Conn) -> None:
    calls: list[Transition] = []

    async def record(c: db.Conn, t: Transition) -> None:
        calls.append(t)

    reg = registry(kind(_noop, on_transition=record))
    job_id = await claim(conn)
    await jobs.fetch_and_lease(conn, owner="w", kinds={"k": 30}, limit=1)
    assert await control.cancel(conn, reg, job_id, by="operator:test") == "running"
    assert calls == []
    refused = await control.cancel(conn, reg, 999_999, by="operator:test")
    assert isinstance(refused, jobs.Refused) and refused.code == "not_found"
