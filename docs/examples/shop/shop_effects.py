"""A shop's effects: Stripe with manual capture, an EasyPost label, a Shopify fulfilment — each once per order.

Stripe's order of events for a manual capture (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method):
the customer authorises, the intent becomes ``requires_capture`` and Stripe sends
``payment_intent.amount_capturable_updated``: capture then. After the capture Stripe sends
``payment_intent.succeeded``: ship then. With automatic capture only ``payment_intent.succeeded`` comes, and
``ship`` below serves that variant unchanged. (``charge.succeeded`` is no signal to ship: with manual capture
Stripe sends it at the authorisation, ``captured: false``.)

Each key names what its effect acts on. A capture acts on a PaymentIntent: ``capture:{payment intent}``. A
customer whose card is declined authorises again with a new intent for the same order, and that intent is
captured as an effect of its own; keyed per order it would be a key conflict, never captured, and the hold
would lapse. A shipment acts on the order: ``ship:{order}``. The intent is part of the shipment's
fingerprint, so a second intent that succeeds for an order already shipped is a key conflict: recorded
(``effectgate ledger rejects`` names both intents, one of which is money to give back), never shipped.

The Stripe capture carries the step's key as Stripe's ``Idempotency-Key``. EasyPost and Shopify's
``fulfillmentCreate`` take no idempotency key, so those steps run with ``find=`` (inside ``buy_label`` and
``fulfil_order``): the label's ``reference`` is the step's key, the fulfilment carries the label's tracking
number, and an attempt after a crash looks for them before creating again.
"""

from __future__ import annotations

import os
from typing import Any

from effectgate import EffectContext, Event, TerminalError, effect
from effectgate.handlers.providers.easypost import buy_label, easypost_for
from effectgate.handlers.providers.shopify import fulfil_order
from effectgate.handlers.providers.stripe import stripe_steps

# Tunable for tests (a crash test wants a short lease); the defaults are the library's.
LEASE_TTL = float(os.environ.get("SHOP_LEASE_TTL", "60"))
MAX_ATTEMPTS = int(os.environ.get("SHOP_MAX_ATTEMPTS", "8"))
CARRIER_ACCOUNT = os.environ.get("SHOP_EASYPOST_CARRIER_ACCOUNT", "ca_demo")
WAREHOUSE = {
    "name": "Shop Warehouse",
    "street1": "1 Dock Rd",
    "city": "Hamburg",
    "zip": "20457",
    "country": "DE",
}


def order_id(ev: Event) -> str:
    """The shop's order id, which checkout put in the payment intent's metadata."""
    return str(ev.payload["data"]["object"]["metadata"]["order_id"])


@effect(
    source="stripe",
    events=["payment_intent.amount_capturable_updated"],
    key=lambda ev: f"capture:{ev.payload['data']['object']['id']}",
    name="shop.capture",
    require={"/data/object/status": "requires_capture"},
    fingerprint=["/data/object/amount_capturable", "/data/object/currency"],
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
    max_attempts=MAX_ATTEMPTS,
)
async def capture(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Capture the authorised amount once per PaymentIntent."""
    intent = ev.payload["data"]["object"]
    captured = await stripe_steps(ctx).capture(ctx, intent["id"])
    return {"payment_intent": captured["id"], "status": captured["status"]}


@effect(
    source="stripe",
    events=["payment_intent.succeeded"],
    key=lambda ev: f"ship:{order_id(ev)}",
    name="shop.ship",
    fingerprint=["/data/object/id", "/data/object/amount_received", "/data/object/currency"],
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
    max_attempts=MAX_ATTEMPTS,
)
async def ship(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Buy the label, then fulfil the Shopify order with its tracking number; each once per order."""
    intent = ev.payload["data"]["object"]
    shopify_order = intent["metadata"].get("shopify_order_id")
    shipping = intent.get("shipping") or {}
    address = shipping.get("address") or {}
    if not shopify_order or not address:
        raise TerminalError(f"order {order_id(ev)}: no Shopify order or shipping address on the intent")
    label = await buy_label(
        ctx,
        easypost_for(ctx),
        to_address={
            "name": shipping.get("name"),
            "street1": address.get("line1"),
            "city": address.get("city"),
            "zip": address.get("postal_code"),
            "country": address.get("country"),
        },
        from_address=WAREHOUSE,
        parcel={"weight": 16.0},
        service="Priority",
        carrier_accounts=[CARRIER_ACCOUNT],
    )
    fulfilment = await fulfil_order(
        ctx,
        ctx.downstream("shopify"),
        order_id=shopify_order,
        tracking_number=label["tracking_code"],
        tracking_company=label["selected_rate"]["carrier"],
    )
    return {"label": label["id"], "tracking": label["tracking_code"], "fulfilment": fulfilment["id"]}
