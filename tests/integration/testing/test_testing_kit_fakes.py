"""``effectgate.testing``'s fake providers: the sample shop's SDK-based handlers (docs/examples/shop, Stripe's
and EasyPost's SDKs, Shopify's GraphQL) run through the kit against the fakes with nothing patched — the SDKs
reach the fakes through the ``[downstream]`` configs ``FakeProviders.services()`` gives them."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from effectgate.handlers.registry import REGISTRY
from effectgate.ledger.claims import Accepted
from effectgate.testing import (
    FakeProviders,
    TestLedger,
    context_for,
    example_event,
    fake_providers,
    run_handler,
)

pytestmark = pytest.mark.anyio

SHOP = Path(__file__).resolve().parents[3] / "docs" / "examples" / "shop"


@pytest.fixture
def shop(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The sample shop's handler module, imported into an empty registry that is thrown away afterwards."""
    monkeypatch.setattr(REGISTRY, "_kinds", {})
    monkeypatch.setattr(sys, "path", [str(SHOP), *sys.path])
    monkeypatch.delitem(sys.modules, "shop_effects", raising=False)
    yield importlib.import_module("shop_effects")
    sys.modules.pop("shop_effects", None)


def _authorise(fakes: FakeProviders, intent: dict[str, object]) -> None:
    """The customer's authorisation, as Stripe would hold it: the intent the fake is asked to capture."""
    body = {k: intent[k] for k in ("id", "amount", "currency")} | {"status": "requires_capture"}
    httpx.post(
        fakes.control_url("stripe", "/_fake/payment_intents"), json=body, timeout=10
    ).raise_for_status()


def _requests_to_stripe(fakes: FakeProviders) -> list[dict[str, Any]]:
    """What the fake Stripe was sent (method, path, the headers a test asserts on), oldest first."""
    sent: list[dict[str, Any]] = httpx.get(fakes.control_url("stripe", "/_fake/requests"), timeout=10).json()
    return sent


async def test_the_shops_stripe_capture_runs_through_the_worker_against_the_fake_stripe(
    shop: ModuleType, effectgate_ledger: TestLedger, effectgate_fake_providers: FakeProviders
) -> None:
    fakes = effectgate_fake_providers
    ev = example_event("stripe", "payment_intent.amount_capturable_updated", event_id="evt_kit_1")
    intent = ev.payload["data"]["object"]
    _authorise(fakes, intent)
    [claimed] = await effectgate_ledger.deliver(ev)
    assert isinstance(claimed, Accepted) and claimed.effect_key == f"capture:{intent['id']}"

    async with fakes.services() as services:
        run = await effectgate_ledger.run_job("shop.capture", services=services)
    assert run.state == "succeeded", run.job
    assert run.steps["capture"].result["status"] == "succeeded"
    stats = fakes.stats("stripe")
    assert stats["captures"] == 1 and stats["requests"] == 1
    # Stripe's SDK sent the step's key as Stripe's Idempotency-Key, to the fake.
    [sent] = _requests_to_stripe(fakes)
    assert sent["headers"]["idempotency-key"] == run.steps["capture"].idempotency_key


async def test_the_shops_label_and_fulfilment_run_in_memory_against_the_fake_easypost_and_shopify(
    shop: ModuleType,
) -> None:
    with fake_providers() as fakes:
        ev = example_event("stripe", "payment_intent.succeeded", event_id="evt_kit_2")
        intent = ev.payload["data"]["object"]
        shopify_order = "gid://shopify/Order/5001"
        intent = intent | {
            "metadata": intent["metadata"] | {"shopify_order_id": shopify_order},
            "shipping": {
                "name": "Ada",
                "address": {"line1": "1 Loop St", "city": "Berlin", "postal_code": "10115", "country": "DE"},
            },
        }
        ev = dataclasses.replace(ev, payload=ev.payload | {"data": {"object": intent}})
        async with fakes.services() as services:
            ctx = context_for(ev, "shop.ship", services=services)
            result = await run_handler(ctx)
            assert fakes.stats("easypost")["labels"] == 1
            assert fakes.stats("shopify")["fulfillments_by_order"] == {shopify_order: 1}
            assert result["tracking"] == ctx.steps["label"].result["tracking_code"]

            # The next attempt replays both recorded steps: nothing more is bought or fulfilled.
            again = ctx.rerun()
            await run_handler(again)
        assert again.calls == [] and fakes.stats("easypost")["labels"] == 1
        assert fakes.stats("shopify")["fulfillments"] == 1


def test_the_fakes_stop_with_the_block_and_each_block_starts_fresh() -> None:
    with fake_providers() as first:
        httpx.post(first.control_url("stripe", "/_fake/payment_intents"), json={"id": "pi_x"}, timeout=10)
        assert (
            httpx.get(first.control_url("stripe", "/v1/payment_intents/pi_x"), timeout=10).status_code != 404
        )
    with pytest.raises(httpx.ConnectError):
        httpx.get(first.control_url("stripe", "/_fake/stats"), timeout=2)
    with fake_providers() as second:
        assert second.stats("stripe")["captures"] == 0
        assert set(second.downstreams()) == {
            "payments",
            "shipping",
            "stripe",
            "easypost",
            "shopify",
            "paypal",
            "adyen",
        }
