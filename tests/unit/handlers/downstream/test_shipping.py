"""ShippingClient against respx: request shape, idempotency keys, argument checks, answer classes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:9999/ship"
ADDRESS = {"name": "Ada Lovelace", "line1": "12 St James's Square", "city": "London", "country": "GB"}
ITEMS = [{"sku": "BOOK-1", "quantity": 2}]
SHIPMENT = {
    "id": "shp_1",
    "order_id": "ord_42",
    "tracking_number": "FK000000000042",
    "label_url": "http://127.0.0.1:9999/ship/v1/shipments/shp_1/label",
}


@pytest.fixture
async def shipping() -> AsyncIterator[ShippingClient]:
    async with httpx.AsyncClient() as http:
        yield ShippingClient(http, DownstreamConfig(BASE, "ship_key"))


async def ship(shipping: ShippingClient, key: str = "k") -> dict[str, Any]:
    return await shipping.create_shipment(
        order_id="ord_42", address=ADDRESS, items=ITEMS, idempotency_key=key
    )


async def test_create_shipment_sends_json_key_and_auth(shipping: ShippingClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post("/v1/shipments").respond(201, json=SHIPMENT)
        result = await shipping.create_shipment(
            order_id="ord_42",
            address=ADDRESS,
            items=ITEMS,
            idempotency_key="t1:ord_42:ship",
            service="express",
        )
    assert result == SHIPMENT
    request = route.calls.last.request
    assert request.url == "http://127.0.0.1:9999/ship/v1/shipments"
    assert request.headers["Idempotency-Key"] == "t1:ord_42:ship"
    assert request.headers["Authorization"] == "Bearer ship_key"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "order_id": "ord_42",
        "address": ADDRESS,
        "items": ITEMS,
        "service": "express",
    }


async def test_same_key_and_body_on_every_retry(shipping: ShippingClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post("/v1/shipments").mock(
            side_effect=[httpx.Response(500), httpx.ReadTimeout, httpx.Response(201, json=SHIPMENT)]
        )
        for _ in range(2):
            with pytest.raises(TransientError):
                await ship(shipping, "ship-key")
        assert await ship(shipping, "ship-key") == SHIPMENT
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == ["ship-key"] * 3
    assert len({call.request.content for call in route.calls}) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"order_id": ""}, "order_id"),
        ({"address": "12 St James's Square"}, "address"),
        ({"items": []}, "items"),
        ({"items": "BOOK-1"}, "items"),
        ({"items": ["BOOK-1"]}, "items"),
        ({"service": ""}, "service"),
    ],
)
async def test_arguments_are_validated_before_any_request(
    shipping: ShippingClient, kwargs: dict[str, Any], match: str
) -> None:
    arguments: dict[str, Any] = {"order_id": "ord_42", "address": ADDRESS, "items": ITEMS} | kwargs
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        route = router.route().respond(201, json=SHIPMENT)
        with pytest.raises(ValueError, match=match):
            await shipping.create_shipment(idempotency_key="k", **arguments)
    assert not route.called


@pytest.mark.parametrize(
    ("answer", "error", "code"),
    [
        (httpx.Response(409, json={"error": {"type": "idempotency_error"}}), TransientError, None),
        (httpx.Response(429, headers={"Retry-After": "3"}), TransientError, None),
        (httpx.Response(500), TransientError, None),
        (httpx.Response(503), TransientError, None),
        (httpx.ConnectError, TransientError, None),
        (httpx.ReadTimeout, TransientError, None),
        (httpx.RemoteProtocolError, TransientError, None),
        (httpx.Response(201, text="created"), TransientError, None),
        (
            httpx.Response(400, json={"error": {"type": "idempotency_error"}}),
            UnrecoverableError,
            "idempotency_error",
        ),
        (
            httpx.Response(
                422, json={"error": {"type": "invalid_request_error", "code": "address_undeliverable"}}
            ),
            TerminalError,
            "address_undeliverable",
        ),
        (
            httpx.Response(400, json={"error": "invalid_postcode", "message": "bad"}),
            TerminalError,
            "invalid_postcode",
        ),
        (httpx.Response(403, text="Forbidden"), TerminalError, "http_403"),
    ],
)
async def test_answers_map_to_outcomes(
    shipping: ShippingClient, answer: Any, error: type[Exception], code: str | None
) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post("/v1/shipments").mock(side_effect=[answer])
        with pytest.raises(error) as caught:
            await ship(shipping)
    assert type(caught.value) is error
    if isinstance(caught.value, TerminalError):
        assert caught.value.code == code
    if isinstance(answer, httpx.Response) and answer.status_code == 429:
        assert isinstance(caught.value, TransientError)
        assert caught.value.retry_after == 3.0
