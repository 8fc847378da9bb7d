"""The worker on a Citus cluster: a claimed job leased, run and finished, every fenced write routed by tenant.

Run by `make citus-check` against ``CITUS_URL`` (deploy/README.md, "Past one Postgres"). The worker is the
production one, in process, on a pool whose connections go to the coordinator; it finds the ledger
distributed (``topology``) and leases one tenant at a time. Citus refuses a multi-shard
``FOR UPDATE`` outright, so a worker that sent one would fail its fetch rather than pass.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from effectgate.handlers import EffectContext, EffectKind, Event, Registry
from effectgate.handlers.worker.runtime import Worker, WorkerConfig
from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, EffectRequest, claim_delivery
from effectgate.ledger.handle import Ledger
from effectgate.ledger.jobs import leases
from effectgate.ledger.maintenance.scheduler import ReconcilerConfig
from tests.topologies import CITUS

from .ledger import delivery, explain

pytestmark = pytest.mark.anyio

KIND = "ship-citus"
TENANTS = [f"w-tenant-{n}" for n in range(6)]


@pytest.fixture
async def pool(citus_url: str, citus_schema: str) -> AsyncIterator[db.Pool]:
    p = db.make_pool(citus_url, min_size=1, max_size=6, name="effectgate-citus", schema=citus_schema)
    await p.open(wait=True)
    try:
        yield p
    finally:
        await p.close()


async def claim(conn: db.Conn, tenant: str, key: str, kind: str = KIND) -> int:
    [outcome] = await claim_delivery(conn, delivery(tenant, key), [EffectRequest(key, kind, 5, "redrive")])
    assert isinstance(outcome, Accepted), outcome
    return outcome.job_id


async def test_a_claimed_job_is_leased_run_and_finished_by_a_worker(pool: db.Pool) -> None:
    calls: list[str] = []

    async def ship(ctx: EffectContext, ev: Event) -> None:
        async def call(key: str) -> dict[str, Any]:
            calls.append(key)
            return {"label": key}

        await ctx.step("label", call)
        await ctx.save_checkpoint({"labelled": True})

    registry = Registry()
    registry.register(EffectKind(name=KIND, source="stripe", events=("*",), fn=ship))
    async with pool.connection() as conn:
        job_ids = {await claim(conn, tenant, f"order-{tenant}") for tenant in TENANTS}
    # The worker alone: the maintenance services have tests of their own on the cluster (test_retention_on_citus,
    # test_fencing_on_citus).
    config = WorkerConfig(
        run_reconciler=False, poll_interval=0.05, backoff_base=0.0, reconciler=ReconcilerConfig()
    )
    worker = Worker(Ledger(pool), registry, config=config, owner="citus-worker")
    assert await worker.run_until_idle() == len(TENANTS)

    async with pool.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT j.id, j.state::text AS state, j.checkpoint, j.tenant,"
                " (SELECT count(*) FROM steps s WHERE s.effect_id = j.effect_id AND s.tenant = j.tenant) AS steps,"
                " (SELECT array_agg(a.outcome) FROM job_attempts a WHERE a.job_id = j.id AND a.tenant = j.tenant)"
                " AS outcomes FROM jobs j WHERE j.kind = %s",
                (KIND,),
            )
        ).fetchall()
    assert {r["id"] for r in rows} == job_ids
    for r in rows:
        assert r["state"] == "succeeded" and r["steps"] == 1 and r["outcomes"] == ["succeeded"], r
        assert r["checkpoint"] == {"labelled": True}
    assert len(calls) == len(set(calls)) == len(TENANTS)  # each step called once


FENCED = {"tenant": "acme", "now": None, "job_id": 1, "lease_token": 1}
ROUTER = {
    "lease_hold_if_leased": {},
    "checkpoint_save_if_leased": {"checkpoint": None},
    "job_retry_if_leased": {"delay": 1.0, "error": "{}"},
    "lease_extend_if_held": {"job_ids": [1], "lease_tokens": [1], "ttls": [30.0]},
    "lease_abandon_if_held": {"job_ids": [1], "lease_tokens": [1]},
    "job_attempt_open": {"attempt": 1, "owner": "w"},
    # A step's write on the cluster (ledger.jobs.steps, distributed): the fenced lock, then the upsert.
    "step_lease_progress_if_leased": {},
    "step_lease_lock_if_leased": {},
    "step_upsert_over_started": {
        "effect_id": 1,
        "name": "a",
        "idempotency_key": "k",
        "status": "succeeded",
        "result": None,
        "error": None,
        "found": None,
    },
    "steps_for_effect": {"effect_id": 1},
    "job_finish_if_leased": {
        "job_ids": [1],
        "tenants": ["acme"],
        "lease_tokens": [1],
        "states": ["succeeded"],
        "bys": ["w"],
        "reasons": [None],
        "errors": [None],
        "unrecoverables": [False],
    },
}
# One shard group each, but in steps: Citus plans a CTE that inserts from another, or one that calls pg_notify
# (which must run on the coordinator, where the workers LISTEN), as subplans, each a single task. The two step
# statements are what one node sends; on the cluster the worker sends the router pair above instead.
ROUTED_IN_STEPS = {
    "job_hand_back_if_leased": {"poison_threshold": 3, "by": "w"},
    "step_record_if_leased": {
        "name": "a",
        "idempotency_key": "k",
        "status": "succeeded",
        "result": None,
        "error": None,
        "found": None,
    },
    "step_start_if_leased": {"name": "a", "idempotency_key": "k"},
    # The maintenance services' statements for one tenant (ledger.rescuer, ledger.waker).
    "job_rescue_expired_batch": {"limit": 10, "poison_threshold": 3, "kinds": [], "poison_thresholds": []},
    "job_wake_stale_pending": {"limit": 10, "pending_ttl": 900.0, "kinds": [], "pending_ttls": []},
}
FETCH = {"hooked": [], "owner": "w", "kinds": ["charge"], "ttls": [30.0], "limit": 5, "scan_limit": 1000}


@pytest.mark.parametrize("name", sorted(ROUTER))
async def test_a_fenced_write_is_a_router_plan(conn: db.Conn, name: str) -> None:
    text = await explain(conn, name, {**FENCED, **ROUTER[name]})
    assert re.findall(r"Task Count: \d+", text) == ["Task Count: 1"] and "Distributed Subplan" not in text, (
        text
    )


@pytest.mark.parametrize("name", sorted(ROUTED_IN_STEPS))
async def test_a_worker_statement_for_one_tenant_touches_one_shard_group(conn: db.Conn, name: str) -> None:
    text = await explain(conn, name, {**FENCED, **ROUTED_IN_STEPS[name]})
    counts = re.findall(r"Task Count: (\d+)", text)
    print(name, "subplans:", text.count("Distributed Subplan"), "tasks:", counts)
    assert counts and set(counts) == {"1"}, text


async def test_the_fetch_for_one_tenant_is_one_router_task(conn: db.Conn) -> None:
    # What the worker sends on Citus: the fetch without its attempts CTE (the attempts are job_attempt_open,
    # above). The whole statement, with it, is planned as subplans.
    async with conn.transaction(force_rollback=True):
        routed = await (await conn.execute("EXPLAIN " + leases._ROUTED_FETCH, {**FENCED, **FETCH})).fetchall()
    text = "\n".join(next(iter(r.values())) for r in routed)
    assert re.findall(r"Task Count: \d+", text) == ["Task Count: 1"] and "Distributed Subplan" not in text, (
        text
    )
    whole = await explain(conn, "job_fetch_and_lease", {**FENCED, **FETCH})
    assert "Distributed Subplan" in whole  # why the attempts are cut out


async def test_statements_per_fetch_grow_with_the_tenants_leased_from(conn: db.Conn) -> None:
    """Leasing per tenant costs 2 + (tenants leased from) statements per fetch: measured, printed. The two are
    tenants_due's: the paused kinds and the node timeout on the coordinator, then the read over the shards."""
    for n in (1, 4, 16):
        kind = f"count-{n}"
        for t in range(n):
            await claim(conn, f"rt-{n}-{t}", f"rt-{n}-{t}", kind)
        sent = 0

        async def counting(*args: Any, execute: Any = conn.execute, **kwargs: Any) -> Any:
            nonlocal sent
            sent += 1
            return await execute(*args, **kwargs)

        conn.execute = counting  # type: ignore[method-assign]
        started = time.perf_counter()
        try:
            leases = await jobs.fetch_and_lease(conn, owner="w", kinds={kind: 30.0}, limit=n, topology=CITUS)
        finally:
            del conn.execute
        ms = (time.perf_counter() - started) * 1000
        print(f"tenants {n}: leased {len(leases)}, statements {sent}, {ms:.1f} ms")
        assert len(leases) == n and sent == 2 + n
        opened = await (
            await conn.execute(
                "SELECT count(*) AS n FROM job_attempts WHERE job_id = ANY(%s) AND worker = 'w'",
                ([lease.job_id for lease in leases],),
            )
        ).fetchone()
        assert opened is not None and opened["n"] == n  # each lease opened its attempt
