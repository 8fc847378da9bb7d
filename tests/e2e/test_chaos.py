"""Chaos: many orders, duplicate and conflicting deliveries, downstream faults and SIGKILLed workers.

Whatever happens in between, each order is captured once and shipped once. The suite runs a short
version; `make chaos` runs a long one (CHAOS_ORDERS, CHAOS_KILLS, CHAOS_SEED).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.ledger import db, jobs

from .conftest import Stack, event, headers
from .node_service import Forwarding, forwarding_stack, key_of, order_event
from .processes import Process, wait_until

ORDERS = int(os.environ.get("CHAOS_ORDERS", "12"))
KILLS = int(os.environ.get("CHAOS_KILLS", "2"))
SEED = int(os.environ.get("CHAOS_SEED", str(random.randrange(1 << 30))))
MODES = ["none", "error_500", "drop_after_effect"]


def jobs_by_state(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT state::text AS state, count(*) AS n FROM jobs GROUP BY 1").fetchall()
    return {r["state"]: r["n"] for r in rows}


def redrive_parked(stack: Stack) -> int:
    """What an operator does with a job the chaos got parked as poison: redrive it."""
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        parked = [r["id"] for r in conn.execute("SELECT id FROM jobs WHERE state = 'parked'").fetchall()]

    async def redrive() -> int:
        conn = await db.connect(stack.db_url)
        async with conn:
            return sum([await jobs.redrive(conn, job_id, by="test") is None for job_id in parked])

    return asyncio.run(redrive()) if parked else 0


@pytest.mark.chaos
def test_orders_survive_faults_duplicates_and_killed_workers(stack: Stack) -> None:
    rng = random.Random(SEED)
    print(f"chaos seed {SEED}, {ORDERS} orders, {KILLS} kills")
    worker_env = {"E2E_LEASE_TTL": "1.5", "E2E_MAX_ATTEMPTS": "100"}
    workers: list[Process] = [stack.worker(f"w{i}", **worker_env) for i in range(2)]
    stop = threading.Event()

    def flip_faults() -> None:
        while not stop.is_set():
            mode = rng.choice(MODES)
            stack.faults(mode=mode, rate=0.3, seed=rng.randrange(1 << 30))
            stop.wait(0.3)

    flipper = threading.Thread(target=flip_faults, daemon=True)
    flipper.start()

    async def deliver_all() -> list[int]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
            url = f"{stack.gateway_url}/webhooks/shop"
            posts = []
            for n in range(ORDERS):
                body = event(str(10_000 + n), f"evt_{n}")
                posts += [client.post(url, content=body, headers=headers(body)) for _ in range(3)]
                if n % 4 == 0:  # the same order with another amount: a key conflict
                    other = event(str(10_000 + n), f"evt_ch_{n}", "charge.succeeded", amount=999)
                    posts.append(client.post(url, content=other, headers=headers(other)))
            rng.shuffle(posts)
            return [r.status_code for r in await asyncio.gather(*posts)]

    try:
        codes = asyncio.run(deliver_all())
        assert codes.count(202) == ORDERS, codes
        for k in range(KILLS):
            time.sleep(rng.uniform(0.2, 1.0))
            victim = workers.pop(rng.randrange(len(workers)))
            victim.popen.kill()
            victim.popen.wait()
            workers.append(stack.worker(f"w-after-kill-{k}", **worker_env))
    finally:
        stop.set()
        flipper.join()
    stack.faults(mode="none")

    def all_done() -> bool:
        redrive_parked(stack)
        return jobs_by_state(stack.db_url) == {"succeeded": ORDERS}

    wait_until(all_done, 120, f"all {ORDERS} orders to succeed (seed {SEED})")
    stats = stack.stats()
    assert stats["double_capture_attempts"] == 0, stats
    assert stats["captures"] == ORDERS and stats["shipments"] == ORDERS, stats
    assert set(stats["captures_by_intent"].values()) == {1}
    assert set(stats["shipments_by_order"].values()) == {1}


@pytest.fixture
def forwarding(db_url: str, tmp_path: Path) -> Iterator[Forwarding]:
    with forwarding_stack(db_url, tmp_path) as stack:
        yield stack


@pytest.mark.chaos
def test_declared_effects_act_once_per_key_through_faults_duplicates_and_killed_workers(
    forwarding: Forwarding,
) -> None:
    """The same chaos for a declared HTTP effect and a Node.js service that acts once per Idempotency-Key:
    orders whose first answer is a 500, or is lost after the service acted, duplicates, conflicts, and
    workers SIGKILLed mid-run. Every order ends succeeded, and the service acted on each key exactly once."""
    f = forwarding
    rng = random.Random(SEED)
    print(f"declared chaos seed {SEED}, {ORDERS} orders, {KILLS} kills")
    workers: list[Process] = [f.worker(f"w{i}") for i in range(2)]
    orders = [f"o{n}-{rng.choice(['plain', 'flaky', 'drop'])}" for n in range(ORDERS)]

    async def deliver_all() -> list[int]:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
            url = f"{f.gateway_url}/webhooks/shop"
            posts = []
            for n, order in enumerate(orders):
                body = order_event(order, f"evt_{n}")
                posts += [client.post(url, content=body, headers=headers(body)) for _ in range(3)]
                if n % 4 == 0:  # the same order with another amount: a key conflict
                    other = order_event(order, f"evt_other_{n}", amount=999)
                    posts.append(client.post(url, content=other, headers=headers(other)))
            rng.shuffle(posts)
            return [r.status_code for r in await asyncio.gather(*posts)]

    codes = asyncio.run(deliver_all())
    assert codes.count(202) == ORDERS, codes
    for k in range(KILLS):
        time.sleep(rng.uniform(0.2, 1.0))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.popen.kill()
        victim.popen.wait()
        workers.append(f.worker(f"w-after-kill-{k}"))

    def all_done() -> bool:
        with psycopg.connect(f.db_url, row_factory=dict_row) as conn:
            parked = conn.execute("SELECT count(*) AS n FROM jobs WHERE state = 'parked'").fetchone()
        assert parked is not None and parked["n"] == 0  # orphan_policy = "redrive": nothing waits for a human
        return jobs_by_state(f.db_url) == {"succeeded": ORDERS}

    wait_until(all_done, 120, f"all {ORDERS} declared effects to succeed (seed {SEED})")
    stats = f.node.stats()
    assert stats["rejected_signatures"] == 0
    assert stats["acted"] == {key_of(order): 1 for order in orders}, stats
    assert set(stats["seen"]) == {key_of(order) for order in orders}
