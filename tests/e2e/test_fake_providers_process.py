"""The fake providers as a real uvicorn process on loopback, driven by the real clients.

These are the faults that only a real server can produce: a connection cut after the effect (which httpx must
see as a TransportError) and a hung request the client abandons (which must free its idempotency key).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.errors import TransientError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def fake_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("fake_providers") / "server.log"
    code = f"from effectgate.gateway.fakes.providers import serve; serve('127.0.0.1', {port})"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"fake providers exited with {process.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/_fake/stats", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"fake providers did not answer within {STARTUP_SECONDS}s:\n{log_path.read_text()}"
                )
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
async def http(fake_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fake_url) as client:
        assert (await client.post("/_fake/reset")).status_code == 200
        yield client
        await client.post("/_fake/reset")


async def stats(http: httpx.AsyncClient) -> dict[str, Any]:
    result: dict[str, Any] = (await http.get("/_fake/stats")).json()
    return result


async def set_faults(http: httpx.AsyncClient, **faults: Any) -> None:
    response = await http.post("/_fake/faults", json=faults)
    assert response.status_code == 200, response.text


async def test_dropped_connection_after_capture_is_transient_and_replays(
    http: httpx.AsyncClient, fake_url: str
) -> None:
    payments = PaymentsClient(http, DownstreamConfig(fake_url, "sk_test_e2e"))
    await set_faults(http, mode="drop_after_effect", rate=1.0)
    with pytest.raises(TransientError) as caught:
        await payments.capture_payment_intent("pi_e2e", idempotency_key="t1:order-paid:1:capture")
    assert isinstance(caught.value.__cause__, httpx.TransportError)
    assert (await stats(http))["captures"] == 1  # the effect happened although the answer was lost

    await set_faults(http, mode="none")
    result = await payments.capture_payment_intent("pi_e2e", idempotency_key="t1:order-paid:1:capture")
    assert (result["id"], result["status"], result["amount_received"]) == ("pi_e2e", "succeeded", 1000)
    counts = await stats(http)
    assert (counts["captures"], counts["replays"], counts["double_capture_attempts"]) == (1, 1, 0)
    assert counts["captures_by_intent"] == {"pi_e2e": 1}


async def test_dropped_connection_is_an_httpx_remote_protocol_error(http: httpx.AsyncClient) -> None:
    await set_faults(http, mode="drop_after_effect", paths=["/v1/shipments"])
    body = {"order_id": "ord_drop", "address": {"city": "Paris"}, "items": [{"sku": "A"}]}
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/v1/shipments", json=body, headers={"Idempotency-Key": "ship-drop"})
    await set_faults(http, mode="none")
    replay = await http.post("/v1/shipments", json=body, headers={"Idempotency-Key": "ship-drop"})
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    counts = await stats(http)
    assert (counts["shipments"], counts["shipments_by_order"]) == (1, {"ord_drop": 1})


async def test_shipping_client_against_the_real_server(http: httpx.AsyncClient, fake_url: str) -> None:
    shipping = ShippingClient(http, DownstreamConfig(fake_url, None))
    await set_faults(http, mode="error_500", paths=["/v1/shipments"])
    arguments: dict[str, Any] = {
        "order_id": "ord_7",
        "address": {"city": "Oslo"},
        "items": [{"sku": "B", "quantity": 3}],
        "idempotency_key": "t1:ord_7:ship",
    }
    with pytest.raises(TransientError):
        await shipping.create_shipment(**arguments)
    await set_faults(http, mode="none")
    shipment = await shipping.create_shipment(**arguments)
    assert shipment["label_url"] == f"{fake_url}/v1/shipments/{shipment['id']}/label"
    assert (await http.get(shipment["label_url"])).status_code == 200
    assert await shipping.create_shipment(**arguments) == shipment
    counts = await stats(http)
    assert (counts["shipments"], counts["replays"]) == (1, 1)


async def test_abandoned_hung_request_frees_its_key(http: httpx.AsyncClient, fake_url: str) -> None:
    impatient = PaymentsClient(
        http, DownstreamConfig(fake_url, "sk_test_e2e", timeout=0.3, connect_timeout=1.0)
    )
    await set_faults(http, mode="hang", hang_seconds=3600)
    with pytest.raises(TransientError) as caught:
        await impatient.capture_payment_intent("pi_hang", idempotency_key="k-hang")
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)
    await set_faults(http, mode="none")

    # The server notices the disconnect asynchronously; until then the key is in flight (409, transient),
    # which is exactly what the job runtime's retry would meet.
    with anyio.fail_after(10):
        while True:
            try:
                result = await impatient.capture_payment_intent("pi_hang", idempotency_key="k-hang")
                break
            except TransientError:
                await anyio.sleep(0.05)
    assert result["status"] == "succeeded"
    counts = await stats(http)
    assert (counts["captures"], counts["replays"], counts["double_capture_attempts"]) == (1, 0, 0)


def test_one_command_serves_every_fake_each_under_its_prefix(fake_url: str) -> None:
    # `effectgate fake-providers --port N`: Stripe's at the root, the others at the base URL docs/provider_sdks.md
    # gives for each, each with its own state and controls.
    from effectgate.gateway.fakes.providers import MOUNTS

    for prefix in MOUNTS.values():
        assert httpx.post(f"{fake_url}{prefix}/_fake/reset", timeout=5).status_code == 200, prefix
        answer = httpx.get(f"{fake_url}{prefix}/_fake/stats", timeout=5)
        assert answer.status_code == 200, prefix
    # An unauthenticated EasyPost request is EasyPost's 401, not the root app's 404: the mount routes it.
    assert httpx.get(f"{fake_url}/easypost/v2/shipments/shp_1", timeout=5).status_code == 401
    assert httpx.get(f"{fake_url}/v2/shipments/shp_1", timeout=5).status_code == 404
