"""A step's write in two router statements (``topology.distributed``, the Citus path of ledger/jobs/steps.py) against the one
statement one node sends: the same rows, the same refusals, for every case the fence and the marker have.

The two paths are separate SQL texts, so this twin is what keeps them from drifting apart; the cluster tests
(tests/citus) check only that the two-statement path routes.
"""

from __future__ import annotations

from typing import Any

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.cluster.topology import SINGLE_NODE, Topology
from effectgate.ledger.errors import LeaseLost, StepAlreadyRecorded
from effectgate.ledger.jobs import steps
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.integration.jobs_and_workers import at, claim, lease_one
from tests.topologies import ROUTED_ON_ONE_NODE

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

TENANT = "default"  # jobs_and_workers.claim's


async def state(conn: db.Conn, job_id: int) -> dict[str, Any]:
    """What a step's write may change: the step rows (timestamps left out) and the job's progress mark."""
    rows = await (
        await conn.execute(
            "SELECT s.name, s.idempotency_key, s.status::text AS status, s.result, s.error, s.lease_token"
            " FROM steps s JOIN jobs j ON j.effect_id = s.effect_id WHERE j.id = %s ORDER BY s.name",
            (job_id,),
        )
    ).fetchall()
    job = await (
        await conn.execute("SELECT committed_since_release FROM jobs WHERE id = %s", (job_id,))
    ).fetchone()
    return {"steps": rows, "job": job}


async def scenario(conn: db.Conn, topology: Topology) -> list[Any]:
    """Every case in order, each answer (None or the refusal's class) and the state after it."""
    job_id = await claim(conn, now=at(0))
    first = await lease_one(conn, ttl=10, now=at(0))
    log: list[Any] = []

    async def attempt(write: Any) -> None:
        try:
            await write
            log.append(None)
        except (LeaseLost, StepAlreadyRecorded) as exc:
            log.append(type(exc).__name__)
        log.append(await state(conn, job_id))

    def mark(lease: jobs.Lease, name: str) -> Any:
        return steps.mark_started(
            conn,
            job_id=job_id,
            lease_token=lease.lease_token,
            tenant=TENANT,
            name=name,
            idempotency_key=f"key-{name}",
            topology=topology,
        )

    def record(lease: jobs.Lease, name: str, status: str, **answer: Any) -> Any:
        return steps.record(
            conn,
            job_id=job_id,
            lease_token=lease.lease_token,
            tenant=TENANT,
            name=name,
            idempotency_key=f"key-{name}",
            status=status,  # type: ignore[arg-type]
            topology=topology,
            **answer,
        )

    await attempt(mark(first, "charge"))  # a marker, not progress
    await attempt(record(first, "charge", "succeeded", result={"id": "ch_1"}))  # the outcome replaces it
    await attempt(record(first, "charge", "succeeded", result={"id": "ch_2"}))  # recorded already
    await attempt(mark(first, "charge"))  # a marker over an outcome: refused
    await attempt(mark(first, "ship"))
    await attempt(record(first, "refund", "failed", error={"type": "Declined", "message": "no"}))
    # The lease expires and another attempt takes the job: the old token writes nothing.
    await Reconciler().run_once(conn, now=at(11))
    second = await lease_one(conn, owner="w2", now=at(12))
    await attempt(record(first, "ship", "succeeded", result={"id": "sh_1"}))
    await attempt(mark(first, "label"))
    await attempt(mark(second, "ship"))  # the marker moves to this attempt
    await attempt(record(second, "ship", "succeeded", result={"id": "sh_2"}))
    # Tokens are random: each lease's is named by its order, so two runs compare.
    order = {first.lease_token: 1, second.lease_token: 2}
    for entry in log[1::2]:
        for step in entry["steps"]:
            step["lease_token"] = order.get(step["lease_token"], step["lease_token"])
    return log


async def test_two_router_statements_write_exactly_what_the_one_statement_writes(conn: db.Conn) -> None:
    async with conn.transaction(force_rollback=True):
        one = await scenario(conn, topology=SINGLE_NODE)
    async with conn.transaction(force_rollback=True):
        two = await scenario(conn, topology=ROUTED_ON_ONE_NODE)
    answers = one[0::2]
    assert answers == [None, None, "StepAlreadyRecorded", "StepAlreadyRecorded", None, None, "LeaseLost",
                       "LeaseLost", None, None]  # fmt: skip
    assert two == one
    assert [s["lease_token"] for s in one[-1]["steps"] if s["name"] == "ship"] == [2]


async def test_a_step_write_per_tenant_without_the_tenant_is_refused_before_the_database(
    conn: db.Conn,
) -> None:
    with pytest.raises(ValueError, match="tenant"):
        await steps.record(
            conn,
            job_id=1,
            lease_token=1,
            name="n",
            idempotency_key="k",
            status="succeeded",
            topology=ROUTED_ON_ONE_NODE,
        )
