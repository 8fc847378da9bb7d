"""The Node.js receiver of ``tests/node_receiver`` as a process: installed once with ``npm ci`` into
``build/node_receiver`` (the only network use, to the registry), then run on a free loopback port."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from effectgate.handlers.idempotency import idempotency_key

from .conftest import SECRET, headers
from .processes import ROOT, STARTUP_SECONDS, Process, free_port, wait_until

SOURCE = ROOT / "tests" / "node_receiver"
BUILD = ROOT / "build" / "node_receiver"
FILES = ("package.json", "package-lock.json", "server.js")


def install() -> Path:
    """``npm ci`` into the build directory, again only when the lock file changed."""
    BUILD.mkdir(parents=True, exist_ok=True)
    lock = (SOURCE / "package-lock.json").read_bytes()
    stamp = BUILD / ".installed-lock"
    # Two test runs on one checkout must not install over each other.
    with (BUILD / ".install-lock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        for name in FILES:
            shutil.copyfile(SOURCE / name, BUILD / name)
        if not stamp.exists() or stamp.read_bytes() != lock:
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=BUILD,
                check=True,
                timeout=300,
            )
            stamp.write_bytes(lock)
    return BUILD


class NodeService:
    """``node server.js`` with its output in a log file."""

    def __init__(self, port: int, secret: str, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            ["node", "server.js"],
            cwd=install(),
            env={"PATH": _path(), "PORT": str(port), "WEBHOOK_SECRET": secret},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"node exited: {self.log_path.read_text()}")
            try:
                return httpx.get(f"{self.url}/stats", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, STARTUP_SECONDS, "the node service")

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.url}/stats", timeout=5).json()
        return data

    def release(self) -> None:
        httpx.post(f"{self.url}/release", timeout=5).raise_for_status()

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(timeout=10)
        self._log.close()


def _path() -> str:
    return os.environ.get("PATH", "/usr/bin:/bin")


def order_event(order: str, event_id: str, amount: int = 1000) -> bytes:
    """A Stripe-signed-style event the declared effect ``order-paid`` keys by order."""
    return json.dumps(
        {
            "id": event_id,
            "type": "checkout.session.completed",
            "data": {"object": {"amount_total": amount, "metadata": {"order_id": order}}},
        }
    ).encode()


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
        body = order_event(order, event_id, amount)
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


@contextmanager
def forwarding_stack(db_url: str, tmp_path: Path, *, lease_ttl: float = 1.5) -> Iterator[Forwarding]:
    """The gateway (no forward secret), the Node service, and a configuration with the declared effect
    ``order-paid``; workers are started by the test (``Forwarding.worker``)."""
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
lease_ttl = {lease_ttl}

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
