"""Jobs and workers for the job, worker and reconciler tests: claim jobs the way the gateway does, read
them back, wait for their states, and build workers against a real pool. The clock is always a parameter: no
test sleeps out a lease TTL. The fixtures these go with are found by pytest, never imported: ``pool`` and
``module_db_url`` in tests/conftest.py, ``conn`` (rolled back in a module marked ``rolled_back``) in
tests/integration/conftest.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from effectgate.handlers.observe import WorkerObserver
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.handlers.worker.config import WorkerConfig
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger
from effectgate.ledger.jobs import steps
from effectgate.ledger.maintenance.scheduler import ReconcilerConfig

# A fixed clock for ledger-level tests; worker tests run on the database's own clock.
T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """``T0`` plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def later(seconds: float) -> datetime:
    """The real clock plus ``seconds``: a reconciler pass "after" leases taken on the real clock expired."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def claim(
    conn: db.Conn,
    key: str | None = None,
    *,
    kind: str = "k",
    tenant: str = "default",
    max_attempts: int = 3,
    orphan_policy: str = "redrive",
    payload: Any = None,
    now: datetime | None = None,
    lock_key: str | None = None,
) -> int:
    """Claim one effect as the gateway does and return its job id."""
    key = key or f"key-{uuid.uuid4().hex[:10]}"
    payload = payload if payload is not None else {"key": key}
    delivery = Delivery(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        source="test",
        event_id=f"evt-{key}",
        event_type="thing.happened",
        payload=payload,
        fingerprint=fingerprint(payload),
    )
    [outcome] = await claim_delivery(
        conn, delivery, [EffectRequest(key, kind, max_attempts, orphan_policy, lock_key)], now=now
    )
    assert isinstance(outcome, Accepted)
    return outcome.job_id


async def lease_one(
    conn: db.Conn, *, kind: str = "k", ttl: float = 30, owner: str = "w1", now: datetime | None = None
) -> jobs.Lease:
    """Lease exactly one due job of ``kind``."""
    [lease] = await jobs.fetch_and_lease(conn, owner=owner, kinds={kind: ttl}, limit=1, now=now)
    return lease


async def job(conn: db.Conn, job_id: int) -> dict[str, Any]:
    """The job row, as ``ledger.jobs.get`` returns it."""
    row = await jobs.get(conn, job_id)
    assert row is not None
    return row


async def scalar(conn: db.Conn, sql: str, *params: Any) -> Any:
    """The first column of the first row."""
    row = await (await conn.execute(sql, params)).fetchone()
    assert row is not None
    return next(iter(row.values()))


async def wait_for(predicate: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    """Poll ``predicate`` until true; fail the test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_state(conn: db.Conn, job_id: int, state: str, within: float = 5.0) -> dict[str, Any]:
    """Wait until the job reaches ``state``; returns the row."""

    async def reached() -> bool:
        return bool((await job(conn, job_id))["state"] == state)

    await wait_for(reached, within, f"job {job_id} to be {state}")
    return await job(conn, job_id)


async def run_job(pool: db.Pool, key: str, handler: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Claim one effect for ``handler``, run a worker until idle; the job's row and its recorded steps
    (name → the result of a succeeded step, the error record of a failed one)."""
    async with pool.connection() as conn:
        job_id = await claim(conn, key, max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        row = dict(await jobs.get(conn, job_id) or {})
        recorded = await steps.for_effect(conn, row["effect_id"])
    return row, {n: s.result if s.status == "succeeded" else s.error for n, s in recorded.items()}


def kind(fn: Any, name: str = "k", **settings: Any) -> EffectKind:
    """An effect kind for every event of source ``test``."""
    return EffectKind(name=name, source="test", events=("*",), fn=fn, **settings)


def registry(*kinds: EffectKind) -> Registry:
    """A registry of its own (never the process one), holding ``kinds``."""
    reg = Registry()
    for k in kinds:
        reg.register(k)
    return reg


def worker_config(**overrides: Any) -> WorkerConfig:
    """Test defaults: no backoff (the one testing switch), no background reconciler, short drain."""
    settings: dict[str, Any] = {
        "backoff_base": 0.0,
        "run_reconciler": False,
        "poll_interval": 0.05,
        "drain_timeout": 1.0,
        "reconciler": ReconcilerConfig(),
    }
    settings.update(overrides)
    return WorkerConfig(**settings)


def make_worker(
    pool: db.Pool,
    reg: Registry,
    *,
    url: str | None = None,
    observer: WorkerObserver | None = None,
    **config: Any,
) -> Worker:
    """A worker on ``pool`` running ``reg``'s kinds with test defaults."""
    return Worker(
        Ledger(pool),
        reg,
        url=url,
        config=worker_config(**config),
        owner=f"test-{uuid.uuid4().hex[:6]}",
        observer=observer,
    )


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[db.Conn]:
    """A connection of its own on ``url``, closed afterwards."""
    c = await db.connect(url)
    async with c:
        yield c
