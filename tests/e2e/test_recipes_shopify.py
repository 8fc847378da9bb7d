"""The Shopify recipe (tests/e2e/recipe_handlers.py, docs/provider_sdks.md "Recipes") through a real gateway
and worker, against the fake Shopify GraphQL Admin API and the fake shipping API of `effectgate fake-providers`.

Shopify takes the payment itself; the shop fulfils once `orders/paid` says the order is paid (topic
`ORDERS_PAID`, https://shopify.dev/docs/api/admin-graphql/latest/enums/WebhookSubscriptionTopic), with
`fulfillmentCreate` on the order's open fulfillment orders
(https://shopify.dev/docs/api/admin-graphql/latest/mutations/fulfillmentCreate). Shopify may deliver a webhook
more than once and does not promise an order: duplicates carry the same `X-Shopify-Webhook-Id`
(https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates). Each delivery is signed as Shopify documents
it, written out here rather than with effectgate's own code: base64 of the HMAC-SHA256 of the body under the
app's secret, in `X-Shopify-Hmac-Sha256` (https://shopify.dev/docs/apps/build/webhooks/subscribe/https).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from .processes import free_port
from .recipe_stack import JobStates, recipe_stack

SECRET = "shpss_recipes_secret_2c41"


@dataclass
class Shop(JobStates):
    gateway: str
    fake: str
    db_url: str

    def send(self, *deliveries: tuple[str, dict[str, Any]]) -> list[str]:
        """Post each (topic, order) at once, signed as Shopify signs; each one's outcomes ('none' if none)."""

        def post(delivery: tuple[str, dict[str, Any]]) -> str:
            topic, order = delivery
            body = json.dumps(order).encode()
            signature = base64.b64encode(hmac.new(SECRET.encode(), body, hashlib.sha256).digest()).decode()
            headers = {
                "X-Shopify-Hmac-Sha256": signature,
                "X-Shopify-Topic": topic,
                "X-Shopify-Webhook-Id": hashlib.sha256(topic.encode() + body).hexdigest()[:36],
                "X-Shopify-Shop-Domain": "recipes.myshopify.com",
                "content-type": "application/json",
            }
            answer = httpx.post(f"{self.gateway}/webhooks/shopify", content=body, headers=headers, timeout=30)
            assert answer.status_code in (200, 202), answer.text
            return ",".join(e["outcome"] for e in answer.json()["effects"]) or "none"

        with ThreadPoolExecutor(max_workers=len(deliveries)) as pool:
            return list(pool.map(post, deliveries))

    def fulfillments(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(f"{self.fake}/shopify/_fake/stats", timeout=10).json()[
            "fulfillments_by_order"
        ]
        return result

    def shipments(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(f"{self.fake}/_fake/stats", timeout=10).json()[
            "shipments_by_order"
        ]
        return result


@pytest.fixture
def shop(db_url: str, tmp_path: Path) -> Iterator[Shop]:
    gateway_port, fake_port = free_port(), free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        f"""
[handlers]
modules = ["tests.e2e.recipe_handlers"]
skip_sources = ["adyen", "paypal"]

[sources.shopify]
scheme = "shopify"
secrets = ["RECIPES_SHOPIFY_SECRET"]

[gateway.penalty_box]
replays = 0

[worker]
concurrency = 4
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[downstream.shopify]
base_url = "http://127.0.0.1:{fake_port}/shopify/admin/api/2025-01"
auth_scheme = "X-Shopify-Access-Token"
api_key_env = "RECIPES_SHOPIFY_TOKEN"
idempotency_header = false
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""
    )
    env = {"DATABASE_URL": db_url, "RECIPES_SHOPIFY_SECRET": SECRET, "RECIPES_SHOPIFY_TOKEN": "shpat_recipes"}
    with recipe_stack(config, env, tmp_path, gateway_port, fake_port):
        yield Shop(f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{fake_port}", db_url)


def order(order_id: int, financial_status: str, updated_at: str) -> dict[str, Any]:
    """An order webhook's body as Shopify sends it (the fields the recipe reads, and some it must not)."""
    return {
        "id": order_id,
        "admin_graphql_api_id": f"gid://shopify/Order/{order_id}",
        "name": f"#{order_id % 10_000}",
        "financial_status": financial_status,
        "fulfillment_status": None,
        "total_price": "42.00",
        "currency": "CAD",
        "updated_at": updated_at,
        "line_items": [{"id": 866550311766439020, "sku": "tee-black-m", "quantity": 1}],
    }


def test_orders_paid_sent_many_times_and_out_of_order_fulfils_the_order_once(shop: Shop) -> None:
    """`orders/paid` four times at once, after an `orders/create` that arrived late, a second `orders/paid`
    of the same order made later (another `updated_at`), and an `orders/updated`: one label, one
    fulfilment (https://shopify.dev/docs/api/admin-graphql/latest/enums/WebhookSubscriptionTopic,
    https://shopify.dev/docs/apps/build/webhooks/ignore-duplicates)."""
    order_id = 450789469001
    paid = ("orders/paid", order(order_id, "paid", "2026-12-06T09:00:05-05:00"))
    outcomes = shop.send(paid, paid, paid, paid)
    assert sorted(outcomes) == ["accepted", "duplicate", "duplicate", "duplicate"]
    key = f"shopify:shopify-fulfil:{order_id}"
    shop.wait_state(key, "succeeded")

    created = ("orders/create", order(order_id, "pending", "2026-12-06T09:00:00-05:00"))
    repaid = ("orders/paid", order(order_id, "paid", "2026-12-06T09:07:41-05:00"))
    updated = ("orders/updated", order(order_id, "paid", "2026-12-06T09:07:42-05:00"))
    assert shop.send(created, repaid, updated, paid) == ["none", "duplicate", "none", "duplicate"]
    assert shop.state(key) == "succeeded"
    assert shop.shipments() == {str(order_id): 1}
    assert shop.fulfillments() == {f"gid://shopify/Order/{order_id}": 1}


def test_an_unpaid_order_resent_under_the_paid_topic_fulfils_nothing(shop: Shop) -> None:
    """`X-Shopify-Topic` is not signed: a pending order's signed body replayed as `orders/paid` claims
    nothing (the recipe requires `financial_status: paid` from the signed body); the genuine `orders/paid`
    that follows fulfils once."""
    order_id = 450789469002
    pending = order(order_id, "pending", "2026-12-06T10:00:00-05:00")
    assert shop.send(("orders/create", pending), ("orders/paid", pending)) == ["none", "unmet_requirement"]
    assert shop.state(f"shopify:shopify-fulfil:{order_id}") is None

    paid = ("orders/paid", order(order_id, "paid", "2026-12-06T10:00:09-05:00"))
    assert sorted(shop.send(paid, paid)) == ["accepted", "duplicate"]
    shop.wait_state(f"shopify:shopify-fulfil:{order_id}", "succeeded")
    assert shop.fulfillments() == {f"gid://shopify/Order/{order_id}": 1}
    assert shop.shipments() == {str(order_id): 1}
