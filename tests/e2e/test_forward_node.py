"""Declared HTTP effects against a real service in another language (issue 22): serve + worker + a Node.js
service that verifies each request with the ``standardwebhooks`` npm package and acts once per
Idempotency-Key. Deliveries, a duplicate, a conflict, a 500 then a 200, a terminal 422, and a worker
SIGKILLed while the service holds its answer: the service sees the same key again and acted once."""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.handlers.idempotency import idempotency_key

from .conftest import SECRET, headers
from .node_service import NodeService
from .processes import Process, free_port, wait_until

FORWARD_SECRET = "whsec_" + base64.b64encode(b"node-receiver-test-key-32-bytes!").decode()


@dataclass
class Forwarding:
    gateway_url: str
    db_url: str
    config: Path
    env: dict[str, str]
    tmp: Path
    node: NodeService
    processes: list[Process]

    def worker(self, name: str) -> Process:
        proc = Process(
            ["worker", "--config", str(self.config), "--no-migrate"], self.env, self.tmp / f"{name}.log"
        )
        self.processes.append(proc)
        proc.wait_log("worker.started")
        return proc

    def deliver(self, order: str, event_id: str, amount: int = 1000) -> httpx.Response:
        body = json.dumps(
            {
                "id": event_id,
                "type": "checkout.session.completed",
                "data": {"object": {"amount_total": amount, "metadata": {"order_id": order}}},
            }
        ).encode()
        return httpx.post(
            f"{self.gateway_url}/webhooks/shop", content=body, headers=headers(body), timeout=30
        )

    def job(self, order: str) -> dict[str, object]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            row = conn.execute(
                "SELECT j.state::text AS state, j.attempt, s.status AS step, s.result, s.error "
                "FROM jobs j JOIN effects e ON e.id = j.effect_id "
                "LEFT JOIN steps s ON s.effect_id = e.id AND s.name = 'forward' WHERE e.effect_key = %s",
                (f"order-paid:{order}",),
            ).fetchone()
        assert row is not None, order
        return row

    def wait_state(self, order: str, state: str) -> dict[str, object]:
        wait_until(lambda: self.job(order)["state"] == state, 60, f"order {order} to be {state}")
        return self.job(order)


def key_of(order: str) -> str:
    return idempotency_key("default", f"order-paid:{order}", "forward")


@pytest.fixture
def forwarding(db_url: str, tmp_path: Path) -> Iterator[Forwarding]:
    gateway_port, node_port = free_port(), free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        f"""
[sources.shop]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]
on_conflict = 409

[worker]
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[maintenance]
tick = 0.2

[effects.order-paid]
source = "shop"
events = ["checkout.session.completed"]
key = "order-paid:{{/data/object/metadata/order_id}}"
orphan_policy = "redrive"
lease_ttl = 1.5

[effects.order-paid.forward]
url = "http://127.0.0.1:{node_port}/hooks/order-paid"
timeout = 30
secret_env = "ORDER_SERVICE_SECRET"
"""
    )
    env = {
        "DATABASE_URL": db_url,
        "E2E_STRIPE_SECRET": SECRET,
        "ORDER_SERVICE_SECRET": FORWARD_SECRET,
        "EFFECTGATE_LOG_LEVEL": "INFO",
    }
    node = NodeService(node_port, FORWARD_SECRET, tmp_path / "node.log")
    # The gateway has no forward secret: it computes keys and claims, it never forwards.
    gateway_env = {k: v for k, v in env.items() if k != "ORDER_SERVICE_SECRET"}
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(gateway_port)],
        gateway_env,
        tmp_path / "gateway.log",
    )
    f = Forwarding(f"http://127.0.0.1:{gateway_port}", db_url, config, env, tmp_path, node, [gateway])
    try:
        node.wait_ready()
        gateway.wait_http(f"{f.gateway_url}/readyz")
        yield f
    finally:
        for proc in reversed(f.processes):
            proc.stop()
        node.stop()


def test_a_node_service_acts_once_per_effect_through_retries_refusals_and_a_sigkill(
    forwarding: Forwarding,
) -> None:
    f = forwarding
    worker = f.worker("worker-1")

    # A delivery, its duplicate, and a different payload under the same key.
    assert f.deliver("o_1", "evt_1").status_code == 202
    assert f.deliver("o_1", "evt_1").status_code == 200
    conflict = f.deliver("o_1", "evt_1b", amount=999)
    assert (conflict.status_code, conflict.json()["error"]) == (409, "key_conflict")
    done = f.wait_state("o_1", "succeeded")
    assert done["step"] == "succeeded"
    assert done["result"]["status"] == 200 and done["result"]["body"]["order"] == "o_1"  # type: ignore[index]

    # A 500, then a 200 on the retry: the same Idempotency-Key both times, acted once.
    assert f.deliver("o_flaky", "evt_2").status_code == 202
    assert f.wait_state("o_flaky", "succeeded")["attempt"] == 2

    # A 422 is terminal: failed after one attempt, the answer recorded with the step.
    assert f.deliver("o_reject", "evt_3").status_code == 202
    rejected = f.wait_state("o_reject", "failed")
    assert (rejected["attempt"], rejected["step"]) == (1, "failed")
    assert rejected["error"]["code"] == "http_422"  # type: ignore[index]
    assert "order_unknown" in rejected["error"]["message"]  # type: ignore[index]

    # The service acts and holds its answer; the worker is killed before hearing it.
    assert f.deliver("o_hold", "evt_4").status_code == 202
    wait_until(lambda: key_of("o_hold") in f.node.stats()["held"], 60, "the service to hold its answer")
    worker.popen.send_signal(signal.SIGKILL)
    worker.popen.wait()
    f.node.release()  # to a dead connection: the answer is lost with the worker
    f.worker("worker-2")
    f.wait_state("o_hold", "succeeded")

    stats = f.node.stats()
    assert stats["rejected_signatures"] == 0
    assert stats["seen"] == {
        key_of("o_1"): 1,
        key_of("o_flaky"): 2,
        key_of("o_reject"): 1,
        key_of("o_hold"): 2,
    }
    assert stats["acted"] == {key_of("o_1"): 1, key_of("o_flaky"): 1, key_of("o_hold"): 1}
