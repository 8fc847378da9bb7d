"""``ctx.downstream(NAME)``: one client per ``[downstream.NAME]``, sending the step's key in the API's own
header and classifying answers through the same code as the payment and shipping clients (issue 19)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import pytest
import respx

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig, clients
from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError
from effectgate.ledger.jobs.leases import Lease

pytestmark = pytest.mark.anyio

BASE = "https://carrier.example.test/api"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def basic(user_password: str) -> str:
    return "Basic " + base64.b64encode(user_password.encode()).decode()


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, {"authorization": "Bearer ck_1", "idempotency-key": "step-key"}),
        ({"auth_scheme": "basic"}, {"authorization": basic("ck_1:"), "idempotency-key": "step-key"}),
        (
            {"auth_scheme": "X-Shopify-Access-Token", "idempotency_header": "PayPal-Request-Id"},
            {"x-shopify-access-token": "ck_1", "paypal-request-id": "step-key"},
        ),
        ({"idempotency_header": None}, {"authorization": "Bearer ck_1"}),
    ],
)
async def test_the_key_and_credentials_travel_in_the_configured_headers(
    http: httpx.AsyncClient, settings: dict[str, Any], expected: dict[str, str]
) -> None:
    client = DownstreamClient("carrier", http, DownstreamConfig(BASE, "ck_1", **settings))
    with respx.mock() as router:
        route = router.post(f"{BASE}/v1/labels").mock(return_value=httpx.Response(201, json={"id": "lbl_1"}))
        assert await client.request("post", "/v1/labels", json={"to": "DE"}, idempotency_key="step-key") == {
            "id": "lbl_1"
        }
    request = route.calls.last.request
    sent = {
        k: v
        for k, v in request.headers.items()
        if k in ("authorization", "idempotency-key", "x-shopify-access-token", "paypal-request-id")
    }
    assert sent == expected
    assert request.headers["accept"] == "application/json"
    assert request.content == b'{"to":"DE"}'


async def test_basic_auth_takes_user_and_password_when_the_key_holds_a_colon(http: httpx.AsyncClient) -> None:
    client = DownstreamClient(
        "paypal", http, DownstreamConfig(BASE, "client-id:client-secret", auth_scheme="basic")
    )
    with respx.mock() as router:
        route = router.get(f"{BASE}/v1/orders").mock(return_value=httpx.Response(200, json={"orders": []}))
        await client.request("GET", "/v1/orders", params={"reference": "k 1"})
    request = route.calls.last.request
    assert request.headers["authorization"] == basic("client-id:client-secret")
    assert request.url.params["reference"] == "k 1"
    # No key given, none sent, and no body on a GET.
    assert "idempotency-key" not in request.headers and request.content == b""


@pytest.mark.parametrize(
    ("answer", "error", "code"),
    [
        (
            httpx.Response(
                409, json={"error": {"type": "idempotency_error", "code": "idempotency_key_in_use"}}
            ),
            TransientError,
            None,
        ),
        (httpx.Response(429, headers={"Retry-After": "7"}), TransientError, None),
        (httpx.Response(503), TransientError, None),
        (httpx.ConnectError, TransientError, None),
        (httpx.Response(200, json=["a", "list"]), TransientError, None),
        (
            httpx.Response(422, json={"error": {"type": "idempotency_error"}}),
            UnrecoverableError,
            "idempotency_error",
        ),
        (
            httpx.Response(402, json={"error": {"type": "card_error", "code": "card_declined"}}),
            TerminalError,
            "card_declined",
        ),
        (httpx.Response(404, text="no"), TerminalError, "http_404"),
    ],
)
async def test_answers_are_classified_as_the_built_in_clients_classify_them(
    http: httpx.AsyncClient, answer: Any, error: type[Exception], code: str | None
) -> None:
    calls: list[tuple[str, int | str]] = []
    client = DownstreamClient(
        "carrier",
        http,
        DownstreamConfig(BASE, "ck_secret"),
        on_call=lambda s, st, _seconds: calls.append((s, st)),
    )
    with respx.mock() as router:
        router.post(f"{BASE}/v1/labels").mock(side_effect=[answer])
        with pytest.raises(error) as caught:
            await client.request("POST", "/v1/labels", json={}, idempotency_key="k")
    assert type(caught.value) is error
    if code is not None:
        assert cast(TerminalError, caught.value).code == code
    if isinstance(answer, httpx.Response) and answer.status_code == 429:
        assert cast(TransientError, caught.value).retry_after == 7
    assert "ck_secret" not in str(caught.value)
    # Counted under the downstream's own name.
    assert [service for service, _ in calls] == ["carrier"]


@pytest.mark.parametrize(
    ("method", "path", "key", "match"),
    [
        ("PO ST", "/v1/x", None, "method"),
        ("POST", "v1/x", None, "path must start with '/'"),
        ("POST", "/v1/x", "", "idempotency_key"),
        ("POST", "/v1/x", "k" * 256, "longer than 255"),
        ("POST", "/v1/x", "kéy", "printable ASCII"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_is_sent(
    http: httpx.AsyncClient, method: str, path: str, key: str | None, match: str
) -> None:
    client = DownstreamClient("carrier", http, DownstreamConfig(BASE, None))
    with respx.mock() as router, pytest.raises(ValueError, match=match):
        await client.request(method, path, idempotency_key=key)
    assert not router.calls


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"auth_scheme": "oauth 2"}, "auth_scheme"),
        ({"auth_scheme": ""}, "auth_scheme"),
        ({"idempotency_header": ""}, "idempotency_header"),
        ({"idempotency_header": "Idem:Key"}, "idempotency_header"),
    ],
)
def test_the_auth_scheme_and_idempotency_header_are_validated(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DownstreamConfig(BASE, "k", **settings)


def context(services: Services) -> EffectContext:
    lease = Lease(
        job_id=1,
        effect_id=1,
        kind="k",
        tenant="default",
        attempt=1,
        max_attempts=3,
        lease_token=1,
        checkpoint=None,
        cancel_requested=False,
        effect_key="order:1",
        source="shop",
        event_id="evt_1",
        event_type="x",
        payload={},
        has_steps=False,
    )
    return EffectContext(
        pool=cast(Any, None),
        lease=lease,
        event=Event("shop", "evt_1", "x", {}),
        recorded={},
        services=services,
        slice_budget=60.0,
    )


async def test_ctx_downstream_gives_the_named_client_and_names_the_configured_ones_otherwise(
    http: httpx.AsyncClient,
) -> None:
    configured = clients(
        http, [("carrier", DownstreamConfig(BASE, None)), ("payments", DownstreamConfig(BASE, None))]
    )
    ctx = context(Services(http=http, downstreams=configured))
    assert ctx.downstream("carrier") is configured["carrier"] and ctx.downstream("carrier").name == "carrier"
    with pytest.raises(
        TerminalError,
        match=r"no downstream 'shiping': configure \[downstream\.shiping\] \(configured: carrier, payments\)",
    ) as caught:
        ctx.downstream("shiping")
    assert caught.value.code == "unknown_downstream"
    with pytest.raises(TerminalError, match=r"configured: none"):
        context(Services()).downstream("carrier")
