"""Recorded steps: a downstream call's outcome, written once per (effect, step name), fenced."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..errors import LeaseLost, StepAlreadyRecorded
from ..queries import Q
from ..storable import storable_error
from ..vocabulary import StepStatus


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """What a step recorded: its idempotency key and its result or error."""

    name: str
    idempotency_key: str
    status: StepStatus
    result: Any
    error: Any
    job_id: int
    lease_token: int
    recorded_at: datetime
    # The outcome was found by the step's find= (an earlier attempt's call had reached the API), not called.
    found: bool = False


async def for_effect(conn: Conn, effect_id: int, *, tenant: str | None = None) -> dict[str, RecordedStep]:
    """Every step an effect has recorded, by name; ``tenant`` (the effect's, where known) routes it on Citus."""
    rows = await (
        await conn.execute(Q["steps_for_effect"], {"effect_id": effect_id, "tenant": tenant})
    ).fetchall()
    return {r["name"]: RecordedStep(**{**r, "status": StepStatus(r["status"])}) for r in rows}


async def record(
    conn: Conn,
    *,
    job_id: int,
    lease_token: int,
    name: str,
    idempotency_key: str,
    tenant: str | None = None,
    status: StepStatus,
    result: Any = None,
    error: Any = None,
    found: bool = False,
    now: datetime | None = None,
    topology: Topology = SINGLE_NODE,
) -> None:
    """Record a step's outcome under the current lease. Raises ``LeaseLost`` or ``StepAlreadyRecorded``.
    ``found``: the outcome is what the step's ``find`` returned, not an answer to a call made now.

    Where ``topology.distributed`` (a ledger distributed by tenant; ``tenant`` required): two router
    statements in one transaction on the tenant's node instead of one statement Citus would plan as
    subplans."""
    if topology.distributed:
        await _write_routed(
            conn,
            "step_lease_progress_if_leased",
            job_id=job_id,
            lease_token=lease_token,
            tenant=tenant,
            name=name,
            idempotency_key=idempotency_key,
            status=status,
            result=Jsonb(result) if result is not None else None,
            error=Jsonb(storable_error(error)) if error is not None else None,
            found=found,
            now=now,
        )
        return
    row = await (
        await conn.execute(
            Q["step_record_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                # The job's tenant, where known: Citus routes the write to its shard (jobs.save_checkpoint).
                "tenant": tenant,
                "name": name,
                "idempotency_key": idempotency_key,
                "status": status,
                "result": Jsonb(result) if result is not None else None,
                "error": Jsonb(storable_error(error)) if error is not None else None,
                "found": found,
                "now": now,
            },
        )
    ).fetchone()
    assert row is not None
    if not row["leased"]:
        raise LeaseLost(job_id, lease_token)
    if not row["recorded"]:
        raise StepAlreadyRecorded(f"step {name!r} of job {job_id} is already recorded")


async def mark_started(
    conn: Conn,
    *,
    job_id: int,
    lease_token: int,
    name: str,
    idempotency_key: str,
    tenant: str | None = None,
    now: datetime | None = None,
    topology: Topology = SINGLE_NODE,
) -> None:
    """Commit a ``started`` marker for a step about to call downstream, under the current lease.

    Raises ``LeaseLost`` if the token no longer holds, ``StepAlreadyRecorded`` if the step has an outcome.
    ``topology``: as ``record``.
    """
    if topology.distributed:
        await _write_routed(
            conn,
            "step_lease_lock_if_leased",
            job_id=job_id,
            lease_token=lease_token,
            tenant=tenant,
            name=name,
            idempotency_key=idempotency_key,
            status=StepStatus.STARTED,
            result=None,
            error=None,
            found=False,
            now=now,
        )
        return
    row = await (
        await conn.execute(
            Q["step_start_if_leased"],
            {
                "job_id": job_id,
                "lease_token": lease_token,
                # The job's tenant, where known: Citus routes the write to its shard (jobs.save_checkpoint).
                "tenant": tenant,
                "name": name,
                "idempotency_key": idempotency_key,
                "now": now,
            },
        )
    ).fetchone()
    assert row is not None
    if not row["leased"]:
        raise LeaseLost(job_id, lease_token)
    if not row["marked"]:
        raise StepAlreadyRecorded(f"step {name!r} of job {job_id} is already recorded")


async def _write_routed(
    conn: Conn,
    lock_query: str,
    *,
    job_id: int,
    lease_token: int,
    tenant: str | None,
    name: str,
    idempotency_key: str,
    status: StepStatus,
    result: Jsonb | None,
    error: Jsonb | None,
    found: bool,
    now: datetime | None,
) -> None:
    """A step's write on Citus: the fenced lock of the job row (``lock_query``), then the step's upsert over a
    ``started`` marker, in one transaction (or a savepoint of the caller's), each a router statement."""
    if tenant is None:
        raise ValueError("a step's write per tenant needs the job's tenant")
    params = {"job_id": job_id, "lease_token": lease_token, "tenant": tenant, "now": now}
    async with conn.transaction():
        held = await (await conn.execute(Q[lock_query], params)).fetchone()
        if held is None:
            raise LeaseLost(job_id, lease_token)
        written = await (
            await conn.execute(
                Q["step_upsert_over_started"],
                {
                    **params,
                    "effect_id": held["effect_id"],
                    "name": name,
                    "idempotency_key": idempotency_key,
                    "status": status,
                    "result": result,
                    "error": error,
                    "found": found,
                },
            )
        ).fetchone()
    if written is None:
        raise StepAlreadyRecorded(f"step {name!r} of job {job_id} is already recorded")
