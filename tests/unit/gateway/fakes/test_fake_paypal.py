"""The fake PayPal API in-process (httpx.ASGITransport): PayPal's documented shapes for OAuth, events and
the verify API, and its refusals, so the integration tests' confirmations are checked against them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from effectgate.gateway.fakes.paypal import FakePayPal, SentTransmission, create_app

pytestmark = pytest.mark.anyio

EVENT = {"id": "WH-1", "event_type": "PAYMENT.CAPTURE.COMPLETED", "resource": {"id": "C-1"}}
SENT = SentTransmission("SHA256withRSA", "https://x/cert", "t-1", "c2ln", "2026-12-01T14:00:00Z", "WH1")


@pytest.fixture
async def paypal() -> AsyncIterator[tuple[FakePayPal, httpx.AsyncClient]]:
    fake = FakePayPal("id", "secret")
    fake.sent(EVENT, SENT)
    transport = httpx.ASGITransport(app=create_app(fake))
    async with httpx.AsyncClient(transport=transport, base_url="https://api-m.fake") as client:
        yield fake, client


async def token(client: httpx.AsyncClient, secret: str = "secret") -> httpx.Response:
    return await client.post(
        "/v1/oauth2/token", data={"grant_type": "client_credentials"}, auth=("id", secret)
    )


async def test_oauth_client_credentials(paypal: tuple[FakePayPal, httpx.AsyncClient]) -> None:
    _, client = paypal
    ok = await token(client)
    assert ok.status_code == 200
    assert ok.json()["token_type"] == "Bearer" and ok.json()["expires_in"] == 32400
    wrong = await token(client, "nope")
    assert (wrong.status_code, wrong.json()["error"]) == (401, "invalid_client")


async def test_events_and_verification_need_a_token_and_answer_in_paypals_shapes(
    paypal: tuple[FakePayPal, httpx.AsyncClient],
) -> None:
    fake, client = paypal
    assert (await client.get("/v1/notifications/webhooks-events/WH-1")).json()[
        "name"
    ] == "AUTHENTICATION_FAILURE"
    auth = {"Authorization": f"Bearer {(await token(client)).json()['access_token']}"}
    assert (await client.get("/v1/notifications/webhooks-events/WH-1", headers=auth)).json() == EVENT
    missing = await client.get("/v1/notifications/webhooks-events/WH-2", headers=auth)
    assert (missing.status_code, missing.json()["name"]) == (404, "INVALID_RESOURCE_ID")
    request = {
        "auth_algo": SENT.auth_algo,
        "cert_url": SENT.cert_url,
        "transmission_id": SENT.transmission_id,
        "transmission_sig": SENT.transmission_sig,
        "transmission_time": SENT.transmission_time,
        "webhook_id": SENT.webhook_id,
        "webhook_event": EVENT,
    }
    verify = "/v1/notifications/verify-webhook-signature"
    assert (await client.post(verify, json=request, headers=auth)).json() == {
        "verification_status": "SUCCESS"
    }
    other = {**request, "webhook_event": {**EVENT, "resource": {"id": "C-2"}}}
    assert (await client.post(verify, json=other, headers=auth)).json() == {"verification_status": "FAILURE"}
    incomplete = {k: v for k, v in request.items() if k != "webhook_id"}
    invalid = await client.post(verify, json=incomplete, headers=auth)
    assert (invalid.status_code, invalid.json()["name"]) == (400, "VALIDATION_ERROR")
    fake.failing = True
    down = await client.get("/v1/notifications/webhooks-events/WH-1", headers=auth)
    assert (down.status_code, down.json()["name"]) == (500, "INTERNAL_SERVICE_ERROR")
    assert fake.calls == {"oauth2/token": 1, "webhooks-events": 4, "verify-webhook-signature": 3}
