"""Which answers are retried: one set, ``handlers.downstream.RETRY_STATUSES``, for every client that calls an API
with an idempotency key (payments, shipping, ``ctx.downstream``) and for a declared forward by default
(issue 52: two lists had drifted apart, 408/409/429/5xx against 408/425/429/5xx)."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from effectgate.gateway.config import parse
from effectgate.gateway.config.settings import SETTINGS, statuses_text
from effectgate.handlers.downstream import RETRY_STATUSES, DownstreamClient, DownstreamConfig
from effectgate.handlers.downstream.forward import ForwardTarget, post_signed
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.errors import TerminalError, TransientError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[4]
BASE = "https://api.example.test"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
#: Refusals no retry changes: the request was read and refused.
NOT_RETRIED = (400, 401, 403, 404, 405, 410, 422)

Call = Callable[[httpx.AsyncClient], Awaitable[Any]]
# Every client that classified answers by one of the two lists, each making its own request to BASE.
CLIENTS: dict[str, tuple[str, Call]] = {
    "payments": (
        "/v1/refunds",
        lambda http: PaymentsClient(http, DownstreamConfig(BASE, "sk_test")).create_refund(
            payment_intent="pi_1", idempotency_key="k"
        ),
    ),
    "shipping": (
        "/v1/shipments",
        lambda http: ShippingClient(http, DownstreamConfig(BASE, "ship_key")).create_shipment(
            order_id="o_1", address={"name": "A"}, items=[{"sku": "S", "quantity": 1}], idempotency_key="k"
        ),
    ),
    "ctx.downstream": (
        "/v1/labels",
        lambda http: DownstreamClient("carrier", http, DownstreamConfig(BASE, "ck")).request(
            "POST", "/v1/labels", json={}, idempotency_key="k"
        ),
    ),
    "forward": (
        "/hooks/order-paid",
        lambda http: post_signed(
            http, ForwardTarget(url=f"{BASE}/hooks/order-paid", secret=SECRET), "k", b"{}"
        ),
    ),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def outcome(http: httpx.AsyncClient, client: str, status: int) -> type[Exception]:
    path, call = CLIENTS[client]
    with respx.mock(base_url=BASE) as router:
        router.post(path).respond(status, json={"error": {"type": "api_error", "message": "no"}})
        with pytest.raises((TransientError, TerminalError)) as caught:
            await call(http)
    return type(caught.value)


def test_the_set_is_what_the_providers_document() -> None:
    # 409: Stripe's idempotency_key_in_use (the first request with the key still runs); 425: RFC 8470 5.2.
    assert frozenset({408, 409, 425, 429, *range(500, 600)}) == RETRY_STATUSES


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_every_listed_status_is_retried_by_every_client(http: httpx.AsyncClient, client: str) -> None:
    got = {status: await outcome(http, client, status) for status in sorted(RETRY_STATUSES)}
    assert {status: kind for status, kind in got.items() if kind is not TransientError} == {}


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_refusal_is_not_retried_by_any_client(http: httpx.AsyncClient, client: str) -> None:
    got = {status: await outcome(http, client, status) for status in NOT_RETRIED}
    assert {status: kind for status, kind in got.items() if kind is not TerminalError} == {}


def test_a_declared_forward_defaults_to_the_one_set_and_its_docs_name_it() -> None:
    config = parse(
        f"""
[sources.shop]
scheme = "standard-webhooks"
secrets = ["S1"]

[effects.order-paid]
source = "shop"
events = ["order.paid"]
key = "order-paid:{{/data/order_id}}"

[effects.order-paid.forward]
url = "{BASE}/hooks/order-paid"
secret_env = "ORDERS_SECRET"
""",
        env={"S1": "whsec_one", "ORDERS_SECRET": SECRET},
        role="worker",
    )
    (declared,) = config.effects
    assert declared.forward.retry_statuses is RETRY_STATUSES
    assert ForwardTarget(url=BASE).retry_statuses is RETRY_STATUSES
    (setting,) = (s for s in SETTINGS if s.path == "effects.*.forward.retry_statuses")
    assert setting.default_text == statuses_text(RETRY_STATUSES) == "408, 409, 425, 429 and 5xx"
    # The two hand-written answer tables say the same statuses.
    listed = "408, 409, 425, 429, 5xx"
    for page in ("docs/forwarding.md", "docs/downstream.md"):
        assert re.search(rf"^\| {listed}, ", (ROOT / page).read_text(encoding="utf-8"), re.MULTILINE), page


def test_no_other_module_writes_a_list_of_retried_statuses() -> None:
    # A second list is how the two drifted: a status set holding 429 beside 408 or a 5xx range, anywhere in the
    # clients' package or the configuration, other than RETRY_STATUSES itself.
    written = re.compile(r"[{(\[][^\n)}\]]*\b(?:408|425)\b[^\n)}\]]*\b429\b")
    found = sorted(
        str(path.relative_to(ROOT))
        for folder in ("handlers", "gateway")
        for path in (ROOT / folder).rglob("*.py")
        if written.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["handlers/downstream/answers.py"]
