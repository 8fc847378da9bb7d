"""Each process holds only its role's secrets, read from files: a real gateway starts without any
downstream API key, a real worker without any webhook secret, and a delivery still runs to its end."""

from __future__ import annotations

import httpx

from .conftest import SECRET, Stack, event, headers
from .processes import Process, free_port


def test_the_gateway_and_the_worker_each_start_with_only_their_own_secrets(stack: Stack) -> None:
    config = stack.tmp / "roles.toml"
    config.write_text(
        stack.config.read_text().replace(
            "[downstream.payments]\n", '[downstream.payments]\napi_key_env = "E2E_PAYMENTS_KEY"\n'
        )
    )
    base = {k: v for k, v in stack.env.items() if k != "E2E_STRIPE_SECRET"}
    # The gateway: its webhook secret from a file (as a mounted Docker/Kubernetes secret), and no
    # payments key anywhere.
    secret_file = stack.tmp / "stripe-secret"
    secret_file.write_text(SECRET + "\n")
    port = free_port()
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port)],
        {**base, "E2E_STRIPE_SECRET_FILE": str(secret_file)},
        stack.tmp / "roles-gateway.log",
    )
    stack.processes.append(gateway)
    gateway.wait_http(f"http://127.0.0.1:{port}/readyz")
    # The worker: its payments key from systemd's credentials directory, and no webhook secret.
    credentials = stack.tmp / "credentials"
    credentials.mkdir()
    (credentials / "E2E_PAYMENTS_KEY").write_text("sk_e2e_payments_key")
    worker = Process(
        ["worker", "--config", str(config), "--no-migrate"],
        {**base, "CREDENTIALS_DIRECTORY": str(credentials)},
        stack.tmp / "roles-worker.log",
    )
    stack.processes.append(worker)
    worker.wait_log("worker.started")

    body = event("7117", "evt_roles_7117")
    answer = httpx.post(
        f"http://127.0.0.1:{port}/webhooks/shop", content=body, headers=headers(body), timeout=30
    )
    assert answer.status_code == 202, answer.text
    stack.wait_state("order-paid:7117", "succeeded")
    # A forged delivery is still refused: the gateway verifies with the secret from the file.
    forged = httpx.post(
        f"http://127.0.0.1:{port}/webhooks/shop",
        content=body,
        headers={**headers(body), "stripe-signature": "t=1,v1=" + "0" * 64},
        timeout=30,
    )
    assert forged.status_code == 401
    for proc in (gateway, worker):
        assert "Traceback" not in proc.log()
        assert SECRET not in proc.log() and "sk_e2e_payments_key" not in proc.log()


def test_a_worker_without_its_downstream_key_names_it_and_exits_2(stack: Stack) -> None:
    config = stack.tmp / "needs-key.toml"
    config.write_text(
        stack.config.read_text().replace(
            "[downstream.payments]\n", '[downstream.payments]\napi_key_env = "E2E_PAYMENTS_KEY"\n'
        )
    )
    worker = Process(["worker", "--config", str(config), "--no-migrate"], stack.env, stack.tmp / "no-key.log")
    stack.processes.append(worker)
    assert worker.popen.wait(timeout=60) == 2
    assert "downstream.payments.api_key_env: environment variable E2E_PAYMENTS_KEY is not set" in worker.log()
