"""The end-to-end stack: the gateway, workers and fake providers as real processes on loopback; and the wheel as a
user installs it (``installed``)."""

from __future__ import annotations

import json
import subprocess
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import stripe
from psycopg.rows import dict_row

from .installed_wheel import Installed, build_checkout
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

    def worker(self, name: str, *args: str, **env: str) -> Process:
        """Start ``effectgate worker`` with extra command-line ``args`` and ``env``; wait until it runs."""
        proc = Process(
            ["worker", "--config", str(self.config), "--no-migrate", *args],
            {**self.env, **env},
            self.tmp / f"{name}.log",
        )
        self.processes.append(proc)
        proc.wait_log("worker.started")
        return proc

    def deliver(self, body: bytes, source: str = "shop") -> httpx.Response:
        return httpx.post(
            f"{self.gateway_url}/webhooks/{source}", content=body, headers=headers(body), timeout=30
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


def event(
    order_id: str,
    event_id: str,
    type_: str = "payment_intent.succeeded",
    *,
    amount: int = 1000,
    intent: str | None = None,
    account: str | None = None,
) -> bytes:
    """A Stripe event for an order: a payment intent, or (``charge.*``) a charge of that intent, as
    Stripe sends both for one payment; ``account`` as Stripe Connect adds it for a connected account."""
    intent = intent or f"pi_{order_id}"
    obj: dict[str, Any] = {
        "id": intent,
        "object": "payment_intent",
        "amount": amount,
        "currency": "eur",
        "metadata": {"order_id": order_id},
    }
    if type_.startswith("charge."):
        obj = {**obj, "id": f"ch_{order_id}", "object": "charge", "payment_intent": intent}
    body: dict[str, Any] = {"id": event_id, "type": type_, "data": {"object": obj}}
    if account is not None:
        body["account"] = account
    return json.dumps(body).encode()


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

# A platform receiving Stripe Connect events for many connected accounts: one tenant per account.
[sources.connect]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]
tenant_from = "/account"
tenant_pattern = "acct_[a-z0-9]+"

# These tests race hundreds of identical deliveries from one address to test the ledger's duplicates; the
# penalty box would (rightly) box such a client, and tests/e2e/test_penalty_box.py attacks the box itself.
[gateway.penalty_box]
replays = 0

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


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel installed in a fresh virtual environment, once per session (per pytest-xdist worker)."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    # As a release builds it: the sdist, then the wheel from the unpacked sdist. A wheel built straight from
    # the checkout takes setuptools' build/lib as it finds it, and after a module moved that still held the
    # old module: the wheel carried both.
    build_checkout("--outdir", str(dist))
    (wheel,) = dist.glob("effectgate-*.whl")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # pytest beside the wheel, as a user's CI has it: the testing kit's plugin needs it, nothing else does.
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel), "pytest"],
        check=True,
        capture_output=True,
    )
    return Installed(wheel, python, env_dir / "bin" / "effectgate")
