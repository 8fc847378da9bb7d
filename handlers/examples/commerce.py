"""Example handlers: a paid order is captured and shipped once, however often Stripe says so.

The effect key is the order, not the Stripe event: ``payment_intent.succeeded`` and
``charge.succeeded`` for the same order are one logical effect. Stripe sends both for one payment,
so "the same request" is the amount and currency both events carry (``fingerprint``), not the whole
payload: whichever arrives second is a duplicate (200, counted, never a second capture), while an
event for the same order with another amount is a conflict, recorded as a reject and never run.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, TerminalError, effect


def order_key(ev: Event) -> str:
    """``order-paid:{order id}`` from the payment object's metadata."""
    return f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}"


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
    """Capture the payment, then create the shipment; each step runs once per order."""
    obj = ev.payload["data"]["object"]
    order_id = obj["metadata"]["order_id"]
    intent = obj["id"] if obj.get("object") == "payment_intent" else obj.get("payment_intent")
    if not intent:
        raise TerminalError(f"order {order_id}: the event names no payment intent")
    capture = await ctx.step(
        "capture", lambda key: ctx.payments.capture_payment_intent(intent, idempotency_key=key)
    )
    shipment = await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order_id,
            address=obj.get("shipping") or {"name": "Demo Customer", "country": "DE"},
            items=[{"sku": "demo", "quantity": 1}],
            idempotency_key=key,
        ),
    )
    return {"capture": capture.get("id"), "shipment": shipment.get("id")}


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
    # The signed body says whether the order is paid; the topic only routes.
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
