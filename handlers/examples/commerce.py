"""Example handlers that follow Stripe's and Shopify's own event order.

Stripe, manual capture (https://docs.stripe.com/payments/place-a-hold-on-a-payment-method): once the
customer authorises, the intent is ``requires_capture`` and Stripe sends
``payment_intent.amount_capturable_updated`` ("occurs when a PaymentIntent has funds to be captured",
https://docs.stripe.com/api/events/types); that is when to capture. Stripe sends
``payment_intent.succeeded`` only *after* the capture (or at once, with automatic capture), and that is
when to ship. Capturing on ``payment_intent.succeeded`` would fail against real Stripe
(``payment_intent_unexpected_state``: the intent is no longer ``requires_capture``) and nothing would ship.

So there are two effects per order, each with its own key: ``order-capture:{order}`` captures,
``order-paid:{order}`` ships. With automatic capture only the second ever fires — the same handler serves
both variants. ``payment_intent.succeeded`` and ``charge.succeeded`` for one payment are one logical effect:
"the same request" is the amount and currency both events carry (``fingerprint``), so whichever arrives
second is a duplicate, and an event for the same order with another amount is a conflict, never run.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, TerminalError, effect


def order_key(ev: Event) -> str:
    """``order-paid:{order id}`` from the payment object's metadata."""
    return f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}"


def capture_key(ev: Event) -> str:
    """``order-capture:{order id}`` from the payment intent's metadata."""
    return f"order-capture:{ev.payload['data']['object']['metadata']['order_id']}"


@effect(
    source="stripe",
    events=["payment_intent.amount_capturable_updated"],
    key=capture_key,
    name="commerce.capture_payment",
    # Only an intent that is waiting for its capture; the event also fires when the capturable amount
    # changes for other reasons.
    require={"/data/object/status": "requires_capture"},
    fingerprint=["/data/object/amount_capturable", "/data/object/currency"],
    # Safe: the capture is a recorded step with Stripe's idempotency key.
    orphan_policy="redrive",
)
async def capture_payment(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Capture the authorised payment once per order; Stripe then sends ``payment_intent.succeeded``."""
    intent = ev.payload["data"]["object"]["id"]
    capture = await ctx.step(
        "capture", lambda key: ctx.payments.capture_payment_intent(intent, idempotency_key=key)
    )
    return {"capture": capture.get("id"), "status": capture.get("status")}


@effect(
    source="stripe",
    events=["payment_intent.succeeded", "charge.succeeded"],
    key=order_key,
    name="commerce.fulfil_order",
    # Both event types carry these; the rest of the two payloads differ by design.
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
    key=lambda ev: f"charge-refunded:{ev.payload['data']['object']['id']}",
    name="commerce.record_refund",
    orphan_policy="redrive",
)
async def record_refund(ctx: EffectContext, ev: Event) -> None:
    """Record the refund Stripe reports, once per charge, as a step of the ledger."""
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
