"""The fake providers in-process (httpx.ASGITransport): Stripe's idempotency semantics, effects vs requests,
fault injection, and the real clients against it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from effectgate.gateway.fakes.providers import FaultConfig, create_app
from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError

pytestmark = pytest.mark.anyio

BASE = "http://fake.test"
CAPTURE = "/v1/payment_intents/{}/capture"
ADDRESS = {"name": "Ada", "line1": "1 Main St", "city": "Springfield", "country": "US"}
ITEMS = [{"sku": "SKU-1", "quantity": 1}]


@pytest.fixture
def app() -> Starlette:
    return create_app()


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        yield client


@pytest.fixture
def payments(http: httpx.AsyncClient) -> PaymentsClient:
    return PaymentsClient(http, DownstreamConfig(BASE, "sk_test_fake"))


@pytest.fixture
def shipping(http: httpx.AsyncClient) -> ShippingClient:
    return ShippingClient(http, DownstreamConfig(BASE, None))


async def stats(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/_fake/stats")
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


async def set_faults(http: httpx.AsyncClient, **faults: Any) -> None:
    response = await http.post("/_fake/faults", json=faults)
    assert response.status_code == 200, response.text


async def capture(http: httpx.AsyncClient, intent: str, key: str | None, **form: str) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await http.post(CAPTURE.format(intent), data=form, headers=headers)


# -- idempotency ----------------------------------------------------------------------------------


async def test_same_key_same_params_replays_byte_for_byte(http: httpx.AsyncClient) -> None:
    first = await capture(http, "pi_1", "k1", amount_to_capture="600")
    second = await capture(http, "pi_1", "k1", amount_to_capture="600")
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.json()["status"] == "succeeded"
    assert first.json()["amount_received"] == 600
    counts = await stats(http)
    assert (counts["requests"], counts["replays"], counts["captures"]) == (2, 1, 1)
    assert counts["captures_by_intent"] == {"pi_1": 1}
    assert counts["double_capture_attempts"] == 0


async def test_canonical_body_ignores_parameter_order(http: httpx.AsyncClient) -> None:
    await capture(http, "pi_1", "k-cap")
    headers = {"Idempotency-Key": "k-refund", "Content-Type": "application/x-www-form-urlencoded"}
    first = await http.post("/v1/refunds", content=b"payment_intent=pi_1&amount=100", headers=headers)
    second = await http.post("/v1/refunds", content=b"amount=100&payment_intent=pi_1", headers=headers)
    assert first.status_code == 200
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.content == second.content

    ship_headers = {"Idempotency-Key": "k-ship", "Content-Type": "application/json"}
    body = {"order_id": "o1", "address": ADDRESS, "items": ITEMS}
    one = await http.post("/v1/shipments", content=json.dumps(body), headers=ship_headers)
    reordered = dict(reversed(list(body.items())))
    two = await http.post("/v1/shipments", content=json.dumps(reordered, indent=2), headers=ship_headers)
    assert one.status_code == 201
    assert two.headers["Idempotent-Replayed"] == "true"
    assert one.content == two.content
    counts = await stats(http)
    assert (counts["refunds"], counts["shipments"], counts["replays"]) == (1, 1, 2)


@pytest.mark.parametrize(
    ("intent", "form"),
    [("pi_1", {"amount_to_capture": "500"}), ("pi_2", {})],
    ids=["other-body", "other-path"],
)
async def test_same_key_different_params_is_400(
    http: httpx.AsyncClient, intent: str, form: dict[str, str]
) -> None:
    assert (await capture(http, "pi_1", "k1")).status_code == 200
    response = await capture(http, intent, "k1", **form)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "idempotency_error"
    counts = await stats(http)
    assert (counts["captures"], counts["replays"]) == (1, 0)


async def test_key_reuse_surfaces_as_unrecoverable_in_the_client(payments: PaymentsClient) -> None:
    await payments.capture_payment_intent("pi_1", idempotency_key="k1", amount_to_capture=400)
    with pytest.raises(UnrecoverableError) as caught:
        await payments.capture_payment_intent("pi_1", idempotency_key="k1", amount_to_capture=500)
    assert caught.value.code == "idempotency_error"


async def test_in_flight_key_is_409_and_freed_when_abandoned(
    http: httpx.AsyncClient, payments: PaymentsClient
) -> None:
    await set_faults(http, mode="hang", hang_seconds=3600)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(capture, http, "pi_1", "k-busy")
        await anyio.wait_all_tasks_blocked()  # the first request holds the key and hangs
        busy = await capture(http, "pi_1", "k-busy")
        assert busy.status_code == 409
        assert busy.json() == {
            "error": {
                "type": "idempotency_error",
                "code": "idempotency_key_in_use",
                "message": busy.json()["error"]["message"],
            }
        }
        with pytest.raises(TransientError):
            await payments.capture_payment_intent("pi_1", idempotency_key="k-busy")
        tasks.cancel_scope.cancel()  # the client gives up on the hung request
    await set_faults(http, mode="none")
    # The abandoned request never performed its effect, so the same key now runs for real.
    result = await payments.capture_payment_intent("pi_1", idempotency_key="k-busy")
    assert result["status"] == "succeeded"
    counts = await stats(http)
    assert (counts["captures"], counts["replays"], counts["requests"]) == (1, 0, 4)


async def test_a_short_hang_then_answers(http: httpx.AsyncClient) -> None:
    await set_faults(http, mode="hang", hang_seconds=0.01)
    assert (await capture(http, "pi_1", "k")).status_code == 200
    assert (await capture(http, "pi_1", "k")).headers["Idempotent-Replayed"] == "true"


async def test_double_capture_with_a_new_key_is_refused_and_counted(
    http: httpx.AsyncClient, payments: PaymentsClient
) -> None:
    await payments.capture_payment_intent("pi_1", idempotency_key="k1")
    with pytest.raises(TerminalError) as caught:
        await payments.capture_payment_intent("pi_1", idempotency_key="k2")
    assert caught.value.code == "payment_intent_unexpected_state"
    # Stripe stores the error the endpoint produced: the same key replays it without a new attempt.
    replay = await capture(http, "pi_1", "k2")
    assert replay.status_code == 400
    assert replay.headers["Idempotent-Replayed"] == "true"
    counts = await stats(http)
    assert (counts["captures"], counts["double_capture_attempts"]) == (1, 1)


async def test_requests_without_key_are_allowed_and_counted(http: httpx.AsyncClient) -> None:
    assert (await capture(http, "pi_1", None)).status_code == 200
    assert (await capture(http, "pi_1", None)).status_code == 400  # nothing to replay: a real second try
    assert (await http.get("/v1/payment_intents/pi_1")).status_code == 200
    counts = await stats(http)
    assert (counts["requests_without_key"], counts["double_capture_attempts"], counts["requests"]) == (
        2,
        1,
        3,
    )


async def test_invalid_params_do_not_use_up_the_key(http: httpx.AsyncClient) -> None:
    bad = await capture(http, "pi_1", "k1", amount_to_capture="lots")
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "parameter_invalid_integer"
    good = await capture(http, "pi_1", "k1", amount_to_capture="300")
    assert good.status_code == 200
    assert "Idempotent-Replayed" not in good.headers


async def test_overlong_key_is_refused(http: httpx.AsyncClient) -> None:
    response = await capture(http, "pi_1", "k" * 256)
    assert response.json()["error"]["code"] == "idempotency_key_too_long"
    assert (await stats(http))["captures"] == 0


# -- races ----------------------------------------------------------------------------------------


async def test_concurrent_retries_with_one_key_capture_once(
    payments: PaymentsClient, http: httpx.AsyncClient
) -> None:
    results: list[dict[str, Any]] = []
    busy: list[TransientError] = []

    async def attempt() -> None:
        try:
            results.append(await payments.capture_payment_intent("pi_race", idempotency_key="one-key"))
        except TransientError as exc:
            busy.append(exc)

    async with anyio.create_task_group() as tasks:
        for _ in range(25):
            tasks.start_soon(attempt)
    assert len(results) + len(busy) == 25
    assert results and all(result == results[0] for result in results)
    counts = await stats(http)
    assert counts["captures"] == 1
    assert counts["double_capture_attempts"] == 0
    assert counts["replays"] == len(results) - 1


async def test_concurrent_captures_with_different_keys_are_counted_as_doubles(
    payments: PaymentsClient, http: httpx.AsyncClient
) -> None:
    outcomes: list[str] = []

    async def attempt(n: int) -> None:
        try:
            await payments.capture_payment_intent("pi_race", idempotency_key=f"key-{n}")
            outcomes.append("captured")
        except TerminalError as exc:
            outcomes.append(exc.code or "")

    async with anyio.create_task_group() as tasks:
        for n in range(10):
            tasks.start_soon(attempt, n)
    assert sorted(outcomes) == ["captured"] + ["payment_intent_unexpected_state"] * 9
    counts = await stats(http)
    assert (counts["captures"], counts["double_capture_attempts"]) == (1, 9)


# -- payments and shipping behaviour --------------------------------------------------------------


async def test_refunds(payments: PaymentsClient, http: httpx.AsyncClient) -> None:
    with pytest.raises(TerminalError) as missing:
        await payments.create_refund(payment_intent="pi_unknown", idempotency_key="r0")
    assert missing.value.code == "resource_missing"
    await capture(http, "pi_r", None)  # creates and captures; an uncaptured intent cannot be refunded
    await http.post(CAPTURE.format("pi_uncaptured"), data={"amount_to_capture": "x"})
    with pytest.raises(TerminalError) as uncaptured:
        await payments.create_refund(payment_intent="pi_uncaptured", idempotency_key="r1")
    assert uncaptured.value.code == "payment_intent_unexpected_state"

    refund = await payments.create_refund(
        payment_intent="pi_r", idempotency_key="r2", amount=400, reason="duplicate"
    )
    assert refund["id"].startswith("re_")
    assert (refund["amount"], refund["payment_intent"], refund["reason"]) == (400, "pi_r", "duplicate")
    with pytest.raises(TerminalError) as too_large:
        await payments.create_refund(payment_intent="pi_r", idempotency_key="r3", amount=601)
    assert too_large.value.code == "amount_too_large"
    rest = await payments.create_refund(payment_intent="pi_r", idempotency_key="r4")
    assert rest["amount"] == 600
    with pytest.raises(TerminalError) as refunded:
        await payments.create_refund(payment_intent="pi_r", idempotency_key="r5", amount=1)
    assert refunded.value.code == "charge_already_refunded"
    assert (await stats(http))["refunds"] == 2


async def test_capture_more_than_capturable_is_refused(http: httpx.AsyncClient) -> None:
    response = await capture(http, "pi_1", "k", amount_to_capture="1001")
    assert response.json()["error"]["code"] == "amount_too_large"


async def test_get_payment_intent(http: httpx.AsyncClient) -> None:
    missing = await http.get("/v1/payment_intents/pi_nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "resource_missing"
    await capture(http, "pi_1", "k")
    intent = (await http.get("/v1/payment_intents/pi_1", headers={"Idempotency-Key": "k"})).json()
    assert (intent["id"], intent["status"], intent["amount_received"]) == ("pi_1", "succeeded", 1000)


async def test_shipments(shipping: ShippingClient, http: httpx.AsyncClient) -> None:
    shipment = await shipping.create_shipment(
        order_id="ord_1", address=ADDRESS, items=ITEMS, idempotency_key="s1", service="express"
    )
    assert shipment["id"].startswith("shp_")
    assert shipment["tracking_number"]
    assert shipment["label_url"] == f"{BASE}/v1/shipments/{shipment['id']}/label"
    assert (shipment["order_id"], shipment["service"], shipment["items"]) == ("ord_1", "express", ITEMS)
    again = await shipping.create_shipment(
        order_id="ord_1", address=ADDRESS, items=ITEMS, idempotency_key="s1", service="express"
    )
    assert again == shipment
    assert (await http.get(f"/v1/shipments/{shipment['id']}")).json() == shipment
    label = await http.get(shipment["label_url"])
    assert label.headers["content-type"] == "application/pdf"
    assert (await http.get("/v1/shipments/shp_nope")).status_code == 404
    counts = await stats(http)
    assert (counts["shipments"], counts["replays"], counts["shipments_by_order"]) == (1, 1, {"ord_1": 1})


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"address": {}, "items": [{}]}', b'{"order_id": "o", "address": {}, "items": []}'],
)
async def test_invalid_shipments_are_400_and_free_the_key(http: httpx.AsyncClient, body: bytes) -> None:
    headers = {"Idempotency-Key": "s1", "Content-Type": "application/json"}
    response = await http.post("/v1/shipments", content=body, headers=headers)
    assert response.status_code == 400
    good = await http.post(
        "/v1/shipments", json={"order_id": "o", "address": {}, "items": [{}]}, headers=headers
    )
    assert good.status_code == 201


async def test_unknown_routes_answer_json(http: httpx.AsyncClient) -> None:
    missing = await http.get("/v1/nothing")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "resource_missing")
    assert (await http.get("/v1/transfers")).status_code == 405


# -- faults, stats and reset ----------------------------------------------------------------------


async def test_error_500_happens_before_the_effect_and_stores_nothing(http: httpx.AsyncClient) -> None:
    await set_faults(http, mode="error_500", rate=1.0)
    failed = await capture(http, "pi_1", "k1")
    assert failed.status_code == 500
    assert (await stats(http))["captures"] == 0
    await set_faults(http, mode="none")
    retried = await capture(http, "pi_1", "k1")
    assert retried.status_code == 200
    assert "Idempotent-Replayed" not in retried.headers
    assert (await stats(http))["captures"] == 1


async def test_faults_respect_paths_and_rate(http: httpx.AsyncClient) -> None:
    await set_faults(http, mode="error_500", paths=["/v1/shipments"])
    assert (await capture(http, "pi_1", "k1")).status_code == 200
    shipment = {"order_id": "o", "address": {}, "items": [{}]}
    assert (await http.post("/v1/shipments", json=shipment)).status_code == 500
    await set_faults(http, mode="error_500", rate=0.0)
    assert (await http.post("/v1/shipments", json=shipment)).status_code == 201
    assert (await stats(http))["requests"] == 3  # /_fake/ endpoints are not provider requests


async def test_seeded_rate_is_reproducible() -> None:
    async def pattern() -> list[int]:
        app = create_app(faults=FaultConfig(mode="error_500", rate=0.5, seed=42))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
            return [(await client.get("/v1/payment_intents/pi_x")).status_code for _ in range(40)]

    first, second = await pattern(), await pattern()
    assert first == second
    assert set(first) == {404, 500}


async def test_faults_endpoint_validates_and_reports(http: httpx.AsyncClient) -> None:
    for bad in ({"mode": "explode"}, {"mode": "hang", "rate": 2}, {"paths": "/v1"}, {"colour": "red"}, [1]):
        response = await http.post("/_fake/faults", json=bad)
        assert response.status_code == 400, bad
        assert response.json()["error"]["code"] == "invalid_faults"
    assert (await http.post("/_fake/faults", content=b"{")).status_code == 400
    await set_faults(http, mode="hang", rate=0.25, paths=["/v1/refunds"], seed=3, hang_seconds=2)
    assert (await http.get("/_fake/faults")).json() == {
        "mode": "hang",
        "rate": 0.25,
        "paths": ["/v1/refunds"],
        "seed": 3,
        "hang_seconds": 2,
    }


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "boom"}, {"rate": -0.1}, {"rate": True}, {"paths": "/v1"}, {"seed": "1"}, {"hang_seconds": -1}],
)
def test_fault_config_is_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FaultConfig(**kwargs)


async def test_reset_clears_everything(http: httpx.AsyncClient) -> None:
    await capture(http, "pi_1", "k1")
    await capture(http, "pi_1", "k2")
    await http.post("/v1/shipments", json={"order_id": "o", "address": {}, "items": [{}]})
    await set_faults(http, mode="error_500")
    assert (await http.post("/_fake/reset")).json() == {"reset": True}
    assert await stats(http) == {
        "requests": 0,
        "replays": 0,
        "captures": 0,
        "refunds": 0,
        "transfers": 0,
        "shipments": 0,
        "double_capture_attempts": 0,
        "requests_without_key": 0,
        "captures_by_intent": {},
        "shipments_by_order": {},
    }
    assert (await http.get("/_fake/faults")).json()["mode"] == "none"
    again = await capture(http, "pi_1", "k1")  # the intent and the key are gone: a fresh capture
    assert again.status_code == 200
    assert "Idempotent-Replayed" not in again.headers


async def test_state_is_per_app_instance() -> None:
    one, two = create_app(), create_app()
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=one), base_url=BASE) as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=two), base_url=BASE) as b,
    ):
        await capture(a, "pi_1", "k1")
        assert (await stats(a))["captures"] == 1
        assert (await stats(b))["captures"] == 0


async def test_drop_after_effect_performs_stores_and_truncates() -> None:
    """At the ASGI level: the effect is done and stored, and the response announces more than it sends.

    (That a real server turns this into an httpx TransportError is checked end to end in
    tests/e2e/test_fake_providers_process.py.)"""
    app = create_app(faults=FaultConfig(mode="drop_after_effect"))
    sent: list[Message] = []
    path = CAPTURE.format("pi_drop")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"fake.test"), (b"idempotency-key", b"k-drop")],
        "client": ("127.0.0.1", 50000),
        "server": ("fake.test", 80),
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, body = sent
    declared = int(dict(start["headers"])[b"content-length"])
    assert start["status"] == 200
    assert body["more_body"] is True
    assert len(body["body"]) < declared

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        await set_faults(http, mode="none")
        replay = await capture(http, "pi_drop", "k-drop")
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json()["status"] == "succeeded"
        assert (await stats(http))["captures"] == 1


async def test_requests_are_recorded_with_the_headers_tests_assert_on_until_reset(
    http: httpx.AsyncClient,
) -> None:
    await http.post(
        CAPTURE.format("pi_rec"),
        headers={"Idempotency-Key": "k-rec", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    )
    await http.get("/v1/payment_intents/pi_rec", headers={"Authorization": "Bearer sk_secret"})
    recorded = (await http.get("/_fake/requests")).json()
    # Each with its arrival time, in order.
    arrivals = [request.pop("at") for request in recorded]
    assert all(isinstance(at, float) for at in arrivals) and arrivals == sorted(arrivals)
    assert recorded == [
        {
            "method": "POST",
            "path": "/v1/payment_intents/pi_rec/capture",
            "headers": {"idempotency-key": "k-rec", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        },
        # Only the listed headers: an API key sent to the fake is never echoed back.
        {"method": "GET", "path": "/v1/payment_intents/pi_rec", "headers": {}},
    ]
    await http.post("/_fake/reset")
    assert (await http.get("/_fake/requests")).json() == []
