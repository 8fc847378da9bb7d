"""The Adyen recipe (tests/e2e/recipe_handlers.py, docs/provider_sdks.md "Recipes") through a real gateway and
worker, against fakes of Adyen's Checkout API and of the shipping API, with notifications signed by Adyen's
own library (`Adyen.util.generate_notification_sig`).

Adyen's sequence (https://docs.adyen.com/online-payments/capture): `AUTHORISATION` (`success` says whether the
payment was authorised), then the merchant's capture request, answered `received`
(https://docs.adyen.com/api-explorer/Checkout/latest/post/payments/(paymentPspReference)/captures), then the
`CAPTURE` webhook, whose `originalReference` is the authorisation. Adyen retries a notification until it is
acknowledged, and says to expect duplicates and events out of order
(https://docs.adyen.com/development-resources/webhooks/best-practices).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from Adyen.util import generate_notification_sig

from .fake_servers import serving
from .processes import free_port
from .recipe_stack import JobStates, recipe_stack

HMAC_KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"


@dataclass
class Shop(JobStates):
    gateway: str
    adyen: str
    fake: str
    db_url: str

    def send(self, *items: dict[str, Any]) -> list[int]:
        """Post each item in a notification of its own, all at once; the status of each answer."""

        def post(item: dict[str, Any]) -> int:
            signature = generate_notification_sig(item, HMAC_KEY).decode()
            signed = {**item, "additionalData": {"hmacSignature": signature}}
            body = json.dumps({"live": "false", "notificationItems": [{"NotificationRequestItem": signed}]})
            answer = httpx.post(
                f"{self.gateway}/webhooks/adyen",
                content=body,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert answer.content == b"[accepted]", answer.text
            return answer.status_code

        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            return list(pool.map(post, items))

    def captures(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(f"{self.adyen}/_fake/stats", timeout=10).json()["adyen_captures"]
        return result

    def shipments(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(f"{self.fake}/_fake/stats", timeout=10).json()[
            "shipments_by_order"
        ]
        return result


@pytest.fixture
def shop(db_url: str, tmp_path: Path) -> Iterator[Shop]:
    gateway_port, fake_port = free_port(), free_port()
    with serving("paypal_adyen", tmp_path) as adyen_url:
        config = tmp_path / "effectgate.toml"
        config.write_text(
            f"""
[handlers]
modules = ["tests.e2e.recipe_handlers"]
skip_sources = ["paypal", "shopify"]

[sources.adyen]
scheme = "adyen"
secrets = ["RECIPES_ADYEN_HMAC_KEY"]
on_conflict = 200

[gateway.penalty_box]
replays = 0

[worker]
concurrency = 4
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[downstream.adyen]
base_url = "{adyen_url}/v71"
auth_scheme = "X-API-Key"
api_key_env = "RECIPES_ADYEN_API_KEY"
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""
        )
        env = {
            "DATABASE_URL": db_url,
            "RECIPES_ADYEN_HMAC_KEY": HMAC_KEY,
            "RECIPES_ADYEN_API_KEY": "AQE_recipes",
        }
        with recipe_stack(config, env, tmp_path, gateway_port, fake_port):
            yield Shop(f"http://127.0.0.1:{gateway_port}", adyen_url, f"http://127.0.0.1:{fake_port}", db_url)


def item(
    psp: str, event: str, order: str, *, success: bool = True, original: str | None = None
) -> dict[str, Any]:
    """A notification item as Adyen sends it, before its signature."""
    fields: dict[str, Any] = {
        "pspReference": psp,
        "merchantReference": order,
        "merchantAccountCode": "ShopECOM",
        "amount": {"currency": "EUR", "value": 4200},
        "eventCode": event,
        "success": "true" if success else "false",
    }
    if original is not None:
        fields["originalReference"] = original
    return fields


def test_a_refusal_then_an_authorisation_captures_once_and_ships_once_after_the_capture(shop: Shop) -> None:
    """Refused (`AUTHORISATION`, `success: "false"`), then authorised on a new payment attempt with its own
    pspReference (https://docs.adyen.com/development-resources/webhooks/webhook-types): the new attempt
    is captured once; its `CAPTURE` webhook ships the order once; copies and a late `AUTHORISATION` retry
    arriving after the `CAPTURE` change nothing, and a failed `CAPTURE` ships nothing."""
    order = "order-5005"
    assert shop.send(item("PSPREFUSED5005", "AUTHORISATION", order, success=False)) == [200]

    authorised = item("PSPAUTH5005", "AUTHORISATION", order)
    assert sorted(shop.send(*[authorised] * 4)) == [200, 200, 200, 202]
    shop.wait_state("adyen:adyen-capture:PSPAUTH5005", "succeeded")
    assert shop.captures() == {"PSPAUTH5005": 1} and shop.shipments() == {}

    failed = item("PSPCAPFAIL5005", "CAPTURE", order, success=False, original="PSPAUTH5005")
    assert shop.send(failed) == [200]  # a failed capture: nothing is claimed, nothing ships
    assert shop.state("adyen:order-paid:order-5005") is None

    captured = item("PSPCAP5005", "CAPTURE", order, original="PSPAUTH5005")
    # The CAPTURE, its copies and a late retry of the AUTHORISATION, all at once.
    statuses = shop.send(captured, captured, captured, authorised, authorised)
    assert sorted(statuses) == [200, 200, 200, 200, 202]
    shop.wait_state("adyen:order-paid:order-5005", "succeeded")
    assert shop.send(captured, authorised) == [200, 200]
    assert shop.captures() == {"PSPAUTH5005": 1}
    assert shop.shipments() == {order: 1}
