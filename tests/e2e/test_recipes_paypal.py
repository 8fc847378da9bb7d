"""The PayPal Checkout recipe (tests/e2e/recipe_handlers.py, docs/provider_sdks.md "Recipes") through a real
gateway and worker, against the fake PayPal Orders API and the fake shipping API of `effectgate
fake-providers`.

PayPal's sequence with `intent: CAPTURE` (https://developer.paypal.com/docs/api/orders/v2/#orders_capture):
the buyer approves the order (`CHECKOUT.ORDER.APPROVED`), the merchant captures it, and PayPal reports the
money taken (`PAYMENT.CAPTURE.COMPLETED`, https://developer.paypal.com/api/rest/webhooks/event-names/). A
declined instrument fails the capture with `INSTRUMENT_DECLINED` and the buyer approves the same order again
(https://developer.paypal.com/docs/checkout/standard/customize/handle-funding-failures/). PayPal redelivers an
event it did not see acknowledged and does not promise an order (https://developer.paypal.com/api/rest/webhooks/).
PayPal has no library that signs webhooks: each delivery is signed here as PayPal signs it (SHA256withRSA over
transmission id, time, webhook id and the body's CRC32) with a certificate of the tests' own CA, which the
gateway fetches over loopback HTTPS, as in test_schemes_e2e.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.gateway.signatures.paypal_pki import Pki, iso

from .processes import free_port
from .recipe_stack import JobStates, recipe_stack
from .schemes_cert_server import serve_certificates

WEBHOOK_ID = "8PT597110X687430LKGRECIPE"
CERT_PATH = "/v1/notifications/certs/CERT-360caa42-fca2a594-recipes"


@dataclass
class Shop(JobStates):
    gateway: str
    fake: str
    db_url: str
    pki: Pki
    cert_url: str

    def send(self, *events: dict[str, Any]) -> list[str]:
        """Post the events all at once, each in a transmission of its own; each one's outcomes."""

        def post(numbered: tuple[int, dict[str, Any]]) -> str:
            n, event = numbered
            body = json.dumps(event).encode()
            headers = self.pki.headers(
                body,
                webhook_id=WEBHOOK_ID,
                time=iso(time.time()),
                transmission_id=f"t-{n}-{time.time_ns()}",
                url=self.cert_url,
            )
            answer = httpx.post(f"{self.gateway}/webhooks/paypal", content=body, headers=headers, timeout=30)
            assert answer.status_code in (200, 202), answer.text
            return ",".join(e["outcome"] for e in answer.json()["effects"]) or "none"

        with ThreadPoolExecutor(max_workers=len(events)) as pool:
            return list(pool.map(post, enumerate(events)))

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = httpx.get(f"{self.fake}/paypal-adyen/_fake/stats", timeout=10).json()
        return result

    def shipments(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(f"{self.fake}/_fake/stats", timeout=10).json()[
            "shipments_by_order"
        ]
        return result

    def fake_order(self, order: str, action: str) -> None:
        done = httpx.post(f"{self.fake}/paypal-adyen/_fake/orders/{order}/{action}", timeout=10)
        assert done.status_code == 200, done.text


@pytest.fixture
def shop(db_url: str, tmp_path: Path) -> Iterator[Shop]:
    pki = Pki.around(time.time())
    ca_file = pki.write_root(tmp_path)
    tls_chain, tls_key = pki.tls_server("127.0.0.1")
    with serve_certificates({CERT_PATH: pki.chain_pem}, tls_chain, tls_key, tmp_path) as certs:
        gateway_port, fake_port = free_port(), free_port()
        config = tmp_path / "effectgate.toml"
        config.write_text(
            f"""
[handlers]
modules = ["tests.e2e.recipe_handlers"]
skip_sources = ["adyen", "shopify"]

[sources.paypal]
scheme = "paypal"
secrets = ["RECIPES_PAYPAL_WEBHOOK_ID"]
options = {{ cert_url_bases = ["{certs.base_url}/v1/notifications/certs/"], ca_bundle = "{ca_file}", fetch_ca_bundle = "{ca_file}", confirm = "off" }}

[gateway.penalty_box]
replays = 0

[worker]
concurrency = 4
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[downstream.paypal]
base_url = "http://127.0.0.1:{fake_port}/paypal-adyen"
api_key_env = "RECIPES_PAYPAL_ACCESS_TOKEN"
idempotency_header = "PayPal-Request-Id"
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""
        )
        env = {
            "DATABASE_URL": db_url,
            "RECIPES_PAYPAL_WEBHOOK_ID": WEBHOOK_ID,
            "RECIPES_PAYPAL_ACCESS_TOKEN": "A21AA_recipes",
        }
        with recipe_stack(config, env, tmp_path, gateway_port, fake_port):
            yield Shop(
                f"http://127.0.0.1:{gateway_port}",
                f"http://127.0.0.1:{fake_port}",
                db_url,
                pki,
                certs.base_url + CERT_PATH,
            )


def approved(event_id: str, order: str, shop_order: str) -> dict[str, Any]:
    """`CHECKOUT.ORDER.APPROVED` as PayPal sends it: the order approved, nothing taken yet."""
    return {
        "id": event_id,
        "event_version": "1.0",
        "create_time": "2026-12-06T08:00:00.000Z",
        "resource_type": "checkout-order",
        "resource_version": "2.0",
        "event_type": "CHECKOUT.ORDER.APPROVED",
        "summary": "An order has been approved by buyer",
        "resource": {
            "id": order,
            "intent": "CAPTURE",
            "status": "APPROVED",
            "purchase_units": [
                {
                    "reference_id": "default",
                    "custom_id": shop_order,
                    "amount": {"currency_code": "USD", "value": "42.00"},
                }
            ],
        },
    }


def completed(event_id: str, order: str, shop_order: str, capture: str) -> dict[str, Any]:
    """`PAYMENT.CAPTURE.COMPLETED`: the capture, carrying the shop's `custom_id` and the PayPal order."""
    return {
        "id": event_id,
        "event_version": "1.0",
        "create_time": "2026-12-06T08:00:05.000Z",
        "resource_type": "capture",
        "resource_version": "2.0",
        "event_type": "PAYMENT.CAPTURE.COMPLETED",
        "summary": "Payment completed for $ 42.0 USD",
        "resource": {
            "id": capture,
            "status": "COMPLETED",
            "amount": {"currency_code": "USD", "value": "42.00"},
            "final_capture": True,
            "custom_id": shop_order,
            "supplementary_data": {"related_ids": {"order_id": order}},
        },
    }


def test_an_approval_sent_many_times_captures_once_and_the_completed_capture_ships_once(shop: Shop) -> None:
    """`CHECKOUT.ORDER.APPROVED` delivered four times at once captures the PayPal order once
    (https://developer.paypal.com/docs/api/orders/v2/#orders_capture); `PAYMENT.CAPTURE.COMPLETED`, its
    copies and late copies of the approval, all at once, ship the order once
    (https://developer.paypal.com/api/rest/webhooks/event-names/)."""
    order, shop_order = "5O190127TN364715T", "order-7007"
    approval = approved("WH-APPROVED-7007", order, shop_order)
    assert sorted(shop.send(*[approval] * 4)) == ["accepted", "duplicate", "duplicate", "duplicate"]
    key = f"paypal:paypal-capture:{order}:WH-APPROVED-7007"
    shop.wait_state(key, "succeeded")
    assert shop.stats()["paypal_order_captures"] == {order: 1} and shop.shipments() == {}

    done = completed("WH-COMPLETED-7007", order, shop_order, "3C679366HH908993F")
    outcomes = shop.send(done, done, done, approval, approval)
    assert sorted(outcomes) == ["accepted", "duplicate", "duplicate", "duplicate", "duplicate"]
    shop.wait_state(f"paypal:order-paid:{shop_order}", "succeeded")
    assert shop.send(done, approval) == ["duplicate", "duplicate"]
    assert shop.stats()["paypal_order_captures"] == {order: 1}
    assert shop.shipments() == {shop_order: 1}


def test_a_completed_capture_before_its_approval_and_a_declined_instrument_approved_again(shop: Shop) -> None:
    """Out of order: the first approval's capture is declined (`INSTRUMENT_DECLINED`) and the buyer approves
    the same order again (https://developer.paypal.com/docs/checkout/standard/customize/handle-funding-failures/):
    the second approval is a capture of its own, under its own `PayPal-Request-Id`
    (https://developer.paypal.com/reference/guidelines/idempotency). Its `PAYMENT.CAPTURE.COMPLETED` then
    arrives before a redelivery of the second approval and with late copies of the first; one capture, one
    shipment, nothing shipped before the money was taken."""
    order, shop_order = "8MC585209K746392H", "order-8008"
    shop.fake_order(order, "decline")
    first = approved("WH-APPROVED-8008-1", order, shop_order)
    assert shop.send(first) == ["accepted"]
    shop.wait_state(f"paypal:paypal-capture:{order}:WH-APPROVED-8008-1", "failed")
    assert shop.stats()["paypal_order_captures"] == {} and shop.shipments() == {}

    shop.fake_order(order, "approve")
    second = approved("WH-APPROVED-8008-2", order, shop_order)
    assert shop.send(second, first) == ["accepted", "duplicate"]
    shop.wait_state(f"paypal:paypal-capture:{order}:WH-APPROVED-8008-2", "succeeded")
    assert shop.stats()["paypal_order_captures"] == {order: 1} and shop.shipments() == {}

    done = completed("WH-COMPLETED-8008", order, shop_order, "7TK53561YB803214S")
    assert sorted(shop.send(done, done, second, first)) == ["accepted", "duplicate", "duplicate", "duplicate"]
    shop.wait_state(f"paypal:order-paid:{shop_order}", "succeeded")
    assert shop.stats()["paypal_order_captures"] == {order: 1}
    assert shop.shipments() == {shop_order: 1}
