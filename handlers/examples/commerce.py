"""Example handlers that follow Stripe's and Shopify's own event order.

Stripe, manual capture (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method): once the
customer authorises, the intent is ``requires_capture`` and Stripe sends
``payment_intent.amount_capturable_updated`` ("occurs when a PaymentIntent has funds to be captured",
https://docs.stripe.com/api/events/types); that is when to capture. Stripe sends
``payment_intent.succeeded`` (and ``charge.captured``) only *after* the capture, or at once with automatic
capture, and that is when to ship. Capturing on ``payment_intent.succeeded`` would fail against real
Stripe (``payment_intent_unexpected_state``: the intent is no longer ``requires_capture``) and nothing
would ship. ``charge.succeeded`` is no signal to ship: with manual capture Stripe sends it at the
*authorisation*, with ``captured: false``.

Each effect is keyed by the thing it acts on:

- the capture acts on a PaymentIntent, so its key is ``capture:{payment intent}``. A customer whose card
  was declined authorises again with a new PaymentIntent for the same order; that intent is captured as
  its own effect. (Keyed per order, it would be a key conflict: rejected, never captured, and the hold
  would lapse after seven days.)
- the shipment acts on the order, so its key is ``order-paid:{order}``. ``payment_intent.succeeded``,
  ``charge.captured`` and a captured ``charge.succeeded`` for one payment are one request: "the same
  request" is the amount and currency they all carry (``fingerprint``), so whichever arrives second is a
  duplicate. A second payment for an order that already shipped never ships again: a duplicate when it
  has the same amount, a recorded key conflict when it has another.

With automatic capture only ``order-paid`` ever fires — the same handler serves both variants.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, TerminalError, effect


def order_key(ev: Event) -> str:
    """``order-paid:{order id}`` from the payment object's metadata."""
    return f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}"


def capture_key(ev: Event) -> str:
    """``capture:{payment intent id}``: a capture acts on one PaymentIntent, and an order may have several
    (a re-authorisation after a decline is a new intent)."""
    return f"capture:{ev.payload['data']['object']['id']}"


def captured(ev: Event) -> bool:
    """Whether the event reports money taken: a succeeded intent, or a charge with ``captured: true``.

    With manual capture Stripe sends ``charge.succeeded`` at the authorisation, ``captured: false``;
    shipping on it would ship before the capture (https://docs.stripe.com/api/charges/object).
    """
    obj = ev.payload["data"]["object"]
    if obj.get("object") == "payment_intent":
        return bool(obj.get("status") == "succeeded")
    return obj.get("captured") is True


@effect(
    source="stripe",
    events=["payment_intent.amount_capturable_updated"],
    key=capture_key,
    name="commerce.capture_payment",
    # Only an intent that is waiting for its capture; the event also fires when the capturable amount
    # changes for other reasons.
    require={"/data/object/status": "requires_capture"},
    # The intent is in the key; another capturable amount for the same intent is a conflict, never run.
    fingerprint=["/data/object/amount_capturable", "/data/object/currency"],
    # Safe: the capture is a recorded step with Stripe's idempotency key.
    orphan_policy="redrive",
)
async def capture_payment(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Capture the authorised intent once; Stripe then sends ``payment_intent.succeeded``."""
    intent = ev.payload["data"]["object"]["id"]
    capture = await ctx.step(
        "capture", lambda key: ctx.payments.capture_payment_intent(intent, idempotency_key=key)
    )
    return {"capture": capture.get("id"), "status": capture.get("status")}


@effect(
    source="stripe",
    events=["payment_intent.succeeded", "charge.captured", "charge.succeeded"],
    key=order_key,
    name="commerce.fulfil_order",
    # Only once the money is taken: charge.succeeded at an authorisation (captured: false) is skipped.
    require=captured,
    # All three event types carry these (amount is what was authorised, also after a partial capture);
    # the rest of the payloads differ by design.
    fingerprint=["/data/object/amount", "/data/object/currency"],
    # Safe: every side effect below goes through ctx.step with a downstream idempotency key.
    orphan_policy="redrive",
)
async def fulfil_order(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Ship a paid order once: the money is captured by the time Stripe says ``succeeded``."""
    obj = ev.payload["data"]["object"]
    order_id = obj["metadata"]["order_id"]
    intent = obj["id"] if obj.get("object") == "payment_intent" else obj.get("payment_intent")
    if not intent:
        raise TerminalError(f"order {order_id}: the event names no payment intent")
    shipment = await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order_id,
            address=obj.get("shipping") or {"name": "Demo Customer", "country": "DE"},
            items=[{"sku": "demo", "quantity": 1}],
            idempotency_key=key,
        ),
    )
    return {"payment_intent": intent, "shipment": shipment.get("id")}


@effect(
    source="stripe",
    events=["charge.refunded"],
    # Stripe sends charge.refunded for every refund, partial ones included; the charge's running total
    # tells them apart, so a second partial refund is recorded too instead of being a key conflict.
    key=lambda ev: (
        f"charge-refunded:{ev.payload['data']['object']['id']}:{ev.payload['data']['object']['amount_refunded']}"
    ),
    name="commerce.record_refund",
    orphan_policy="redrive",
)
async def record_refund(ctx: EffectContext, ev: Event) -> None:
    """Record each refund Stripe reports on a charge, once, as a step of the ledger."""
    charge = ev.payload["data"]["object"]

    async def record(_key: str) -> dict[str, Any]:
        return {"charge": charge["id"], "amount_refunded": charge.get("amount_refunded")}

    await ctx.step("record-refund", record)


@effect(
    source="shopify",
    events=["orders/paid"],
    key=lambda ev: f"shopify-order-paid:{ev.payload['id']}",
    name="commerce.fulfil_shopify_order",
    # X-Shopify-Topic is unsigned: a pending order's signed body resent as "orders/paid" must not ship.
    # The signed body says whether the order is paid; the topic only routes. (Topic ORDERS_PAID in
    # https://shopify.dev/docs/api/admin-graphql/latest/enums/WebhookSubscriptionTopic: an order is paid.)
    require={"/financial_status": "paid"},
    key_space="source",
    orphan_policy="redrive",
)
async def fulfil_shopify_order(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Ship a Shopify order once it is paid, once per order."""
    order = ev.payload
    shipment = await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=str(order["id"]),
            address=order.get("shipping_address") or {"name": "Demo Customer", "country": "DE"},
            items=[
                {"sku": i.get("sku") or "demo", "quantity": i.get("quantity", 1)} for i in order["line_items"]
            ],
            idempotency_key=key,
        ),
    )
    return {"shipment": shipment.get("id")}
