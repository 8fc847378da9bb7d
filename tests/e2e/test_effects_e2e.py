"""Real processes over loopback HTTP: the gateway, workers and the fake payment/shipping providers.

Each test delivers Stripe-signed webhooks (signed by the ``stripe`` library) and counts the real
effects the fake providers performed — the number the whole design exists to keep at one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import stripe
from psycopg.rows import dict_row

from ledger import db, jobs

from .processes import Process, free_port, wait_until

SECRET = "whsec_e2e_secret"


@dataclass
class Stack:
    gateway_url: str
    fake_url: str
    db_url: str
    tmp: Path
    env: dict[str, str]
    config: Path
    processes: list[Process]

    def worker(self, name: str, **env: str) -> Process:
        proc = Process(
            ["worker", "--config", str(self.config), "--no-migrate"],
            {**self.env, **env},
            self.tmp / f"{name}.log",
        )
        self.processes.append(proc)
        proc.wait_log("worker.started")
        return proc

    def deliver(self, body: bytes) -> httpx.Response:
        return httpx.post(
            f"{self.gateway_url}/webhooks/shop", content=body, headers=headers(body), timeout=30
        )

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.fake_url}/_fake/stats", timeout=5).json()
        return data

    def faults(self, **spec: Any) -> None:
        httpx.post(f"{self.fake_url}/_fake/faults", json=spec, timeout=5).raise_for_status()

    def job(self, effect_key: str) -> dict[str, Any]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            row = conn.execute(
                "SELECT j.*, j.state::text AS state FROM jobs j JOIN effects e ON e.id = j.effect_id "
                "WHERE e.effect_key = %s",
                (effect_key,),
            ).fetchone()
        assert row is not None, f"no job for {effect_key}"
        return row

    def wait_state(self, effect_key: str, state: str, timeout: float = 30) -> dict[str, Any]:
        wait_until(lambda: self.job(effect_key)["state"] == state, timeout, f"{effect_key} to be {state}")
        return self.job(effect_key)


def event(order_id: str, event_id: str, type_: str = "payment_intent.succeeded") -> bytes:
    obj = {
        "id": f"pi_{order_id}",
        "object": "payment_intent",
        "amount": 1000,
        "metadata": {"order_id": order_id},
    }
    return json.dumps({"id": event_id, "type": type_, "data": {"object": obj}}).encode()


def headers(body: bytes) -> dict[str, str]:
    signature = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRET)
    return {"stripe-signature": signature, "content-type": "application/json"}


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    gateway_port, fake_port = free_port(), free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        f"""
[handlers]
modules = ["tests.e2e.e2e_handlers"]

[sources.shop]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]

[worker]
concurrency = 4
poll_interval = 0.5
backoff_base = 0.05
backoff_cap = 0.2

[reconciler]
tick = 0.5

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""
    )
    env = {"DATABASE_URL": db_url, "E2E_STRIPE_SECRET": SECRET, "EFFECTGATE_LOG_LEVEL": "INFO"}
    fake = Process(["fake-providers", "--port", str(fake_port)], env, tmp_path / "fake.log")
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(gateway_port)],
        env,
        tmp_path / "gateway.log",
    )
    s = Stack(
        f"http://127.0.0.1:{gateway_port}",
        f"http://127.0.0.1:{fake_port}",
        db_url,
        tmp_path,
        env,
        config,
        [fake, gateway],
    )
    try:
        fake.wait_http(f"{s.fake_url}/_fake/stats")
        gateway.wait_http(f"{s.gateway_url}/readyz")
        yield s
    finally:
        for proc in reversed(s.processes):
            proc.stop()


def test_the_same_delivery_twenty_times_at_once_runs_the_effect_once(stack: Stack) -> None:
    stack.worker("worker")
    body = event("1001", "evt_1001")

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{stack.gateway_url}/webhooks/shop"
            answers = await asyncio.gather(
                *(client.post(url, content=body, headers=headers(body)) for _ in range(20))
            )
            return [a.status_code for a in answers]

    assert sorted(asyncio.run(burst())) == [200] * 19 + [202]
    job = stack.wait_state("order-paid:1001", "succeeded")
    assert job["attempt"] == 1
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)


def test_a_different_event_reusing_the_order_key_is_rejected_and_never_captures(stack: Stack) -> None:
    stack.worker("worker")
    assert stack.deliver(event("2002", "evt_pi_2002")).status_code == 202
    stack.wait_state("order-paid:2002", "succeeded")
    conflict = stack.deliver(event("2002", "evt_ch_2002", "charge.succeeded"))
    assert conflict.status_code == 409
    assert conflict.json()["effects"][0]["outcome"] == "rejected"
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"]) == (1, 1)


def test_a_worker_killed_between_capture_and_its_record_captures_once(stack: Stack) -> None:
    marker = stack.tmp / "crashed"
    doomed = stack.worker("doomed", E2E_CRASH_MARKER=str(marker), E2E_LEASE_TTL="1.5")
    assert stack.deliver(event("3003", "evt_3003")).status_code == 202
    wait_until(lambda: doomed.popen.poll() is not None, 30, "the worker to SIGKILL itself")
    assert doomed.popen.returncode == -9 and marker.exists()
    assert stack.stats()["captures"] == 1
    assert stack.job("order-paid:3003")["state"] == "running"  # the lease is held by a dead process

    # A second worker's reconciler sees the lease expire, redrives the job, and the capture step —
    # never recorded — is called again with the same idempotency key: the provider replays it.
    stack.worker("rescuer", E2E_LEASE_TTL="1.5")
    job = stack.wait_state("order-paid:3003", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)
    assert stats["replays"] >= 1
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        attempts = conn.execute(
            "SELECT outcome FROM job_attempts WHERE job_id = %s ORDER BY lease_token", (job["id"],)
        ).fetchall()
        steps = conn.execute("SELECT name, idempotency_key FROM steps ORDER BY name").fetchall()
    assert [a["outcome"] for a in attempts] == ["lease_expired", "succeeded"]
    assert [s["name"] for s in steps] == ["capture", "ship"]


def test_a_connection_dropped_after_the_capture_still_captures_once(stack: Stack) -> None:
    stack.faults(mode="drop_after_effect", rate=1.0, paths=["/v1/payment_intents"])
    stack.worker("worker")
    assert stack.deliver(event("4004", "evt_4004")).status_code == 202
    wait_until(lambda: stack.stats()["captures"] == 1, 30, "the first capture")
    wait_until(lambda: stack.job("order-paid:4004")["attempt"] >= 2, 30, "a retry after the dropped answer")
    stack.faults(mode="none")
    stack.wait_state("order-paid:4004", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)


def test_two_hundred_duplicates_and_fifty_racing_redrives_capture_and_ship_once(stack: Stack) -> None:
    # Shipping fails until the job gives up; the capture step is recorded by then.
    stack.faults(mode="error_500", rate=1.0, paths=["/v1/shipments"])
    stack.worker("worker", E2E_MAX_ATTEMPTS="2")
    body = event("5005", "evt_5005")

    async def duplicates() -> list[int]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as client:
            url = f"{stack.gateway_url}/webhooks/shop"
            answers = await asyncio.gather(
                *(client.post(url, content=body, headers=headers(body)) for _ in range(200))
            )
            return [a.status_code for a in answers]

    codes = asyncio.run(duplicates())
    assert codes.count(202) == 1 and codes.count(200) == 199
    failed = stack.wait_state("order-paid:5005", "failed")
    stack.faults(mode="none")

    async def redrives() -> list[Any]:
        conns = [await db.connect(stack.db_url) for _ in range(50)]
        try:
            return await asyncio.gather(*(jobs.redrive(c, failed["id"]) for c in conns))
        finally:
            for c in conns:
                await c.close()

    results = asyncio.run(redrives())
    assert results.count(None) == 1, results
    assert {r.code for r in results if r is not None} == {"not_redrivable"}
    stack.wait_state("order-paid:5005", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)
