"""The operator's writes by id on the cluster: cancel, redrive and resolve find the job's tenant first, then send
one router statement to its node (deploy/README.md, "Past one Postgres").

Sent by id alone they were refused (`job_cancel`: "non-IMMUTABLE functions are not allowed in the RETURNING
clause") or went to every shard; an operator could not cancel a job on a distributed ledger.
"""

from __future__ import annotations

import re
import uuid

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, EffectRequest, claim_deliveries
from effectgate.ledger.jobs.admin import Refused
from effectgate.ledger.jobs.finishes import Finish, finish_many
from effectgate.ledger.jobs.resolutions import Resolved, resolve
from effectgate.ledger.vocabulary import JobState, RefusalCode
from tests.topologies import CITUS

from .ledger import delivery, explain

pytestmark = pytest.mark.anyio


async def claimed(conn: db.Conn, tenant: str, kind: str) -> int:
    key = f"{kind}-{uuid.uuid4().hex[:8]}"
    [[outcome]] = await claim_deliveries(
        conn, [(delivery(tenant, key), [EffectRequest(key, kind, 5, "redrive")])], topology=CITUS
    )
    assert isinstance(outcome, Accepted)
    return outcome.job_id


async def parked(conn: db.Conn, tenant: str, kind: str) -> int:
    job_id = await claimed(conn, tenant, kind)
    [lease] = await jobs.fetch_and_lease(conn, owner="op-test", kinds={kind: 30.0}, limit=1, topology=CITUS)
    assert lease.job_id == job_id
    done = Finish(job_id, lease.lease_token, JobState.PARKED, "op-test", reason="declined", tenant=tenant)
    assert (await finish_many(conn, [done], topology=CITUS))[0] is not None
    return job_id


async def state(conn: db.Conn, job_id: int) -> str:
    job = await jobs.get(conn, job_id)
    assert job is not None
    return job["state"]


async def test_cancel_a_pending_job_and_flag_a_running_one(conn: db.Conn) -> None:
    kind = "op-cancel"
    pending = await claimed(conn, "op-a", kind)
    assert await jobs.cancel(conn, pending, by="ops") == JobState.CANCELLED
    running = await claimed(conn, "op-b", kind)
    [lease] = await jobs.fetch_and_lease(conn, owner="w", kinds={kind: 30.0}, limit=1, topology=CITUS)
    assert lease.job_id == running
    assert await jobs.cancel(conn, running, by="ops") == JobState.RUNNING
    job = await jobs.get(conn, running)
    assert job is not None and job["cancel_requested"]
    refused = await jobs.cancel(conn, pending, by="ops")
    assert isinstance(refused, Refused) and refused.code == RefusalCode.NOT_CANCELLABLE
    missing = await jobs.cancel(conn, -1, by="ops")  # no job has a negative id
    assert isinstance(missing, Refused) and missing.code == RefusalCode.NOT_FOUND


async def test_a_redriven_job_wakes_the_coordinators_listeners(citus_url: str, conn: db.Conn) -> None:
    kind = "op-redrive"
    job_id = await parked(conn, "op-c", kind)
    listener = await db.connect(citus_url)
    async with listener:
        await listener.execute("LISTEN effectgate_jobs")
        assert await jobs.redrive(conn, job_id, by="test") is None
        # Everything heard within a second, not the first alone: the statement's own NOTIFY, run on the
        # coordinator as a subplan, once made every redrive heard twice.
        heard = [n.payload async for n in listener.notifies(timeout=1.0)]
    assert heard == [kind] and await state(conn, job_id) == JobState.PENDING
    again = await jobs.redrive(conn, job_id, by="test")
    assert isinstance(again, Refused) and again.code == RefusalCode.NOT_REDRIVABLE


async def test_resolve_a_parked_job_by_hand(conn: db.Conn) -> None:
    job_id = await parked(conn, "op-d", "op-resolve")
    answer = await resolve(conn, job_id, by="ops", reason="refunded by hand at the bank")
    assert isinstance(answer, Resolved) and await state(conn, job_id) == JobState.RESOLVED
    repeat = await resolve(conn, job_id, by="ops", reason="refunded by hand at the bank")
    assert isinstance(repeat, Resolved) and repeat.already


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("job_cancel", {"by": "ops", "reason": "r"}),
        ("job_redrive_if_allowed", {"force": False}),
        ("job_resolve_if_failed_or_parked", {"by": "ops", "reason": "r"}),
    ],
)
async def test_an_operators_write_for_one_tenant_is_a_router_plan(
    conn: db.Conn, name: str, extra: dict
) -> None:  # type: ignore[type-arg]
    text = await explain(conn, name, {"job_id": 1, "tenant": "acme", "now": None, **extra})
    assert re.findall(r"Task Count: \d+", text) == ["Task Count: 1"] and "Distributed Subplan" not in text, (
        text
    )
