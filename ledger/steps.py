"""Recorded steps: a downstream call's outcome, written once per (effect, step name), fenced."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from .db import Conn
from .errors import LeaseLost, StepAlreadyRecorded
from .queries import Q
from .storable import storable_error
from .vocabulary import StepStatus


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


async def for_effect(conn: Conn, effect_id: int) -> dict[str, RecordedStep]:
    """Every step an effect has recorded, by name."""
    rows = await (await conn.execute(Q["steps_for_effect"], {"effect_id": effect_id})).fetchall()
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
    now: datetime | None = None,
) -> None:
    """Record a step's outcome under the current lease. Raises ``LeaseLost`` or ``StepAlreadyRecorded``."""
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
) -> None:
    """Commit a ``started`` marker for a step about to call downstream, under the current lease.

    Raises ``LeaseLost`` if the token no longer holds, ``StepAlreadyRecorded`` if the step has an outcome.
    """
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
