"""The Stripe manual-capture recipe (`effectgate.handlers.examples.commerce`, the demo's handlers) played
through a real gateway and worker against the fake Stripe, with events in Stripe's own order — and out of it.

Stripe's sequence for a manual capture (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method):
the customer authorises, the charge is reported (`charge.succeeded`, `captured: false`) and the intent is
`requires_capture` (`payment_intent.amount_capturable_updated`); the merchant captures the intent
(https://docs.stripe.com/api/payment_intents/capture); Stripe then reports `charge.captured` and
`payment_intent.succeeded` (https://docs.stripe.com/api/events/types). Stripe does not promise to deliver
events in the order it made them, and retries any it did not see acknowledged
(https://docs.stripe.com/webhooks#event-ordering). Each test plays Stripe's part: it moves the fake intent
as Stripe would, signs each event with Stripe's own library, and counts captures per intent and shipments
per order at the fake.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe

from .processes import free_port
from .recipe_stack import JobStates, recipe_stack

SECRET = "whsec_recipes_secret"
AMOUNT = 4200


@dataclass
class Shop(JobStates):
    """The demo's Stripe recipe behind a real gateway and worker, and the fake Stripe the test plays."""

    gateway: str
    fake: str
    db_url: str

    def send(self, *events: dict[str, Any]) -> list[str]:
        """Post the events all at once, each signed by Stripe's library; each one's outcomes, joined by ','."""

        def post(event: dict[str, Any]) -> str:
            body = json.dumps(event)
            signature = stripe.WebhookSignature.generate_signature_header(body, SECRET)
            answer = httpx.post(
                f"{self.gateway}/webhooks/stripe",
                content=body,
                headers={"stripe-signature": signature, "content-type": "application/json"},
                timeout=30,
            )
            assert answer.status_code in (200, 202), answer.text
            return ",".join(e["outcome"] for e in answer.json()["effects"]) or "none"

        with ThreadPoolExecutor(max_workers=len(events)) as pool:
            return list(pool.map(post, events))

    def authorise(self, intent: str, status: str = "requires_capture") -> None:
        """The customer's authorisation, as Stripe holds it: the intent the fake will be asked to capture."""
        seeded = httpx.post(
            f"{self.fake}/_fake/payment_intents",
            json={"id": intent, "amount": AMOUNT, "currency": "eur", "status": status},
            timeout=10,
        )
        assert seeded.status_code == 200, seeded.text

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = httpx.get(f"{self.fake}/_fake/stats", timeout=10).json()
        return result


@pytest.fixture
def shop(db_url: str, tmp_path: Path) -> Iterator[Shop]:
    gateway_port, fake_port = free_port(), free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        f"""
[handlers]
modules = ["effectgate.handlers.examples.commerce"]
skip_sources = ["shopify"]

[sources.stripe]
scheme = "stripe"
secrets = ["RECIPES_STRIPE_SECRET"]

# Stripe's retries arrive from one address; the penalty box must not box them here.
[gateway.penalty_box]
replays = 0

[worker]
concurrency = 4
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[reconciler]
tick = 0.5

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""
    )
    env = {"DATABASE_URL": db_url, "RECIPES_STRIPE_SECRET": SECRET}
    with recipe_stack(config, env, tmp_path, gateway_port, fake_port):
        yield Shop(f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{fake_port}", db_url)


def intent_event(event_id: str, event_type: str, intent: str, order: str) -> dict[str, Any]:
    """A `payment_intent.*` event as Stripe sends it for a manual-capture intent of `order`."""
    status = {
        "payment_intent.amount_capturable_updated": "requires_capture",
        "payment_intent.succeeded": "succeeded",
        "payment_intent.payment_failed": "requires_payment_method",
        "payment_intent.canceled": "canceled",
    }[event_type]
    obj = {
        "id": intent,
        "object": "payment_intent",
        "amount": AMOUNT,
        "amount_capturable": AMOUNT if status == "requires_capture" else 0,
        "amount_received": AMOUNT if status == "succeeded" else 0,
        "capture_method": "manual",
        "currency": "eur",
        "status": status,
        "metadata": {"order_id": order},
    }
    return {"id": event_id, "object": "event", "type": event_type, "data": {"object": obj}}


def charge_event(
    event_id: str, event_type: str, intent: str, order: str, *, captured: bool
) -> dict[str, Any]:
    """A `charge.*` event of `intent`'s charge: `captured: false` at the authorisation, true once captured."""
    obj = {
        "id": f"ch_{intent}",
        "object": "charge",
        "amount": AMOUNT,
        "amount_captured": AMOUNT if captured else 0,
        "captured": captured,
        "currency": "eur",
        "paid": event_type != "charge.failed",
        "payment_intent": intent,
        "metadata": {"order_id": order},
    }
    return {"id": event_id, "object": "event", "type": event_type, "data": {"object": obj}}


def test_capture_once_on_the_authorisation_and_ship_once_after_the_capture(shop: Shop) -> None:
    """Stripe's manual-capture order (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method):
    `charge.succeeded` (`captured: false`) and `payment_intent.amount_capturable_updated` at the
    authorisation, then, after the capture, `charge.captured` and `payment_intent.succeeded`
    (https://docs.stripe.com/api/events/types). The authorisation's charge ships nothing."""
    pi, order = "pi_a1", "1001"
    shop.authorise(pi)
    authorised_charge = charge_event("evt_a_ch_ok", "charge.succeeded", pi, order, captured=False)
    capturable = intent_event("evt_a_cap", "payment_intent.amount_capturable_updated", pi, order)
    # The shipment's requirement is not met by an authorisation: nothing is claimed, nothing ships.
    assert shop.send(authorised_charge, capturable) == ["unmet_requirement", "accepted"]
    shop.wait_state(f"capture:{pi}", "succeeded")
    stats = shop.stats()
    assert (stats["captures_by_intent"], stats["shipments"]) == ({pi: 1}, 0)
    assert shop.state(f"order-paid:{order}") is None

    # Captured: Stripe reports the charge captured and the intent succeeded; one of them ships.
    captured_charge = charge_event("evt_a_ch_cap", "charge.captured", pi, order, captured=True)
    succeeded = intent_event("evt_a_ok", "payment_intent.succeeded", pi, order)
    assert sorted(shop.send(captured_charge, succeeded)) == ["accepted", "duplicate"]
    shop.wait_state(f"order-paid:{order}", "succeeded")
    stats = shop.stats()
    assert stats["captures_by_intent"] == {pi: 1} and stats["shipments_by_order"] == {order: 1}
    assert stats["double_capture_attempts"] == 0


def test_a_reauthorisation_after_a_decline_is_captured_and_the_order_ships_once(shop: Shop) -> None:
    """A declined payment leaves the order unpaid (`payment_intent.payment_failed`,
    https://docs.stripe.com/payments/paymentintents/lifecycle); an authorisation can also lapse or be
    canceled before its capture (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method: the
    intent becomes `canceled`). The customer then pays with a new card on a new PaymentIntent for the
    same order (https://docs.stripe.com/api/payment_intents/create). A capture keyed per order answered that
    intent `rejected` and never captured it; keyed per intent, it is captured, and the order ships once."""
    order = "2002"
    # A card declined at the authorisation: Stripe reports the failure; no effect is asked for.
    declined = intent_event("evt_b0_fail", "payment_intent.payment_failed", "pi_b0", order)
    failed_charge = charge_event("evt_b0_ch", "charge.failed", "pi_b0", order, captured=False)
    assert shop.send(declined, failed_charge) == ["none", "none"]

    # A second card authorised, but the hold is gone by the time of the capture: Stripe refuses it.
    shop.authorise("pi_b1", status="canceled")
    assert shop.send(
        intent_event("evt_b1_cap", "payment_intent.amount_capturable_updated", "pi_b1", order)
    ) == ["accepted"]
    shop.wait_state("capture:pi_b1", "failed")

    # The customer authorises again, on a new intent for the same order: captured, not rejected.
    shop.authorise("pi_b2")
    again = intent_event("evt_b2_cap", "payment_intent.amount_capturable_updated", "pi_b2", order)
    assert shop.send(again, again) in (["accepted", "duplicate"], ["duplicate", "accepted"])
    shop.wait_state("capture:pi_b2", "succeeded")
    assert shop.send(intent_event("evt_b2_ok", "payment_intent.succeeded", "pi_b2", order)) == ["accepted"]
    shop.wait_state(f"order-paid:{order}", "succeeded")

    # A stray success for yet another intent of the order (a customer who paid twice) does not ship again.
    assert shop.send(intent_event("evt_b3_ok", "payment_intent.succeeded", "pi_b3", order)) == ["duplicate"]
    stats = shop.stats()
    # The refused capture of pi_b1 is the fake's one "double capture attempt": an intent not requires_capture.
    assert stats["captures_by_intent"] == {"pi_b2": 1}
    assert stats["shipments_by_order"] == {order: 1}


def test_duplicates_and_events_out_of_order_capture_once_and_ship_once(shop: Shop) -> None:
    """Stripe may deliver an event more than once and in any order, and retries one whose acknowledgement it
    did not see (https://docs.stripe.com/webhooks#event-ordering, #handle-duplicate-events): the
    authorisation's `payment_intent.amount_capturable_updated` arrives again after — and among — the
    capture's `payment_intent.succeeded` and `charge.captured`. One capture per intent, one shipment."""
    pi, order = "pi_c1", "3003"
    shop.authorise(pi)
    capturable = intent_event("evt_c_cap", "payment_intent.amount_capturable_updated", pi, order)
    authorised_charge = charge_event("evt_c_ch_ok", "charge.succeeded", pi, order, captured=False)
    first = shop.send(*[capturable] * 4, authorised_charge)
    assert sorted(first) == ["accepted", "duplicate", "duplicate", "duplicate", "unmet_requirement"]
    shop.wait_state(f"capture:{pi}", "succeeded")

    # After the capture, everything at once and shuffled: the capture's events, late copies of the
    # authorisation's, and the authorisation's charge again.
    succeeded = intent_event("evt_c_ok", "payment_intent.succeeded", pi, order)
    captured_charge = charge_event("evt_c_ch_cap", "charge.captured", pi, order, captured=True)
    burst = [succeeded] * 4 + [captured_charge] * 2 + [capturable] * 3 + [authorised_charge] * 2
    random.Random(3003).shuffle(burst)
    outcomes = shop.send(*burst)
    ship_outcomes = sorted(
        o for e, o in zip(burst, outcomes, strict=True) if e in (succeeded, captured_charge)
    )
    assert ship_outcomes == ["accepted"] + ["duplicate"] * 5
    assert [o for e, o in zip(burst, outcomes, strict=True) if e is capturable] == ["duplicate"] * 3
    assert [o for e, o in zip(burst, outcomes, strict=True) if e is authorised_charge] == [
        "unmet_requirement"
    ] * 2
    shop.wait_state(f"order-paid:{order}", "succeeded")

    # Later still: each again, as Stripe's retries may bring them.
    assert shop.send(succeeded, capturable) == ["duplicate", "duplicate"]
    stats = shop.stats()
    assert stats["captures_by_intent"] == {pi: 1} and stats["shipments_by_order"] == {order: 1}
    assert stats["double_capture_attempts"] == 0
