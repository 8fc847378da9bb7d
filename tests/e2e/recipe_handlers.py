"""The Adyen, PayPal and Shopify recipes of docs/provider_sdks.md ("Recipes"), as a handler module a worker
runs. A test configures one of the three sources and lists the other two in `[handlers] skip_sources`.

Adyen signs only named fields of each notification item (`pspReference`, `originalReference`,
`merchantAccountCode`, `merchantReference`, `value`, `currency`, `eventCode`, `success`); the Adyen keys,
requirements and fingerprints below read nothing else. PayPal and Shopify sign the whole body.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, effect
from effectgate.handlers.providers.adyen import capture_payment
from effectgate.handlers.providers.shopify import fulfil_order


@effect(
    source="adyen",
    events=["AUTHORISATION"],
    # A capture acts on one payment attempt; a new attempt after a refusal has a new pspReference.
    key=lambda ev: f"adyen-capture:{ev.payload['pspReference']}",
    key_space="source",
    require={"/success": "true"},
    fingerprint=["/amount/value", "/amount/currency", "/merchantReference"],
    name="recipe.adyen_capture",
    orphan_policy="redrive",
)
async def adyen_capture(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Capture an authorised payment once; Adyen answers `received` and confirms with a `CAPTURE` webhook."""
    item = ev.payload
    return await capture_payment(
        ctx,
        ctx.downstream("adyen"),
        item["pspReference"],
        merchant_account=item["merchantAccountCode"],
        value=item["amount"]["value"],
        currency=item["amount"]["currency"],
        reference=item["merchantReference"],
    )


@effect(
    source="adyen",
    events=["CAPTURE"],
    # A shipment acts on the shop's order: Adyen's merchantReference.
    key=lambda ev: f"order-paid:{ev.payload['merchantReference']}",
    key_space="source",
    require={"/success": "true"},
    fingerprint=["/amount/value", "/amount/currency"],
    name="recipe.adyen_ship",
    orphan_policy="redrive",
)
async def adyen_ship(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Ship once the `CAPTURE` webhook says the money is taken, once per order."""
    order = ev.payload["merchantReference"]
    return await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order,
            address={"country": "NL"},
            items=[{"sku": "demo", "quantity": 1}],
            idempotency_key=key,
        ),
    )


@effect(
    source="paypal",
    events=["CHECKOUT.ORDER.APPROVED"],
    # A capture acts on one approval of the PayPal order: after a declined instrument the buyer approves
    # the same order again, and that approval needs a capture of its own (and a PayPal-Request-Id PayPal
    # has not answered yet). A redelivered approval has the same event id, so it is a duplicate.
    key=lambda ev: f"paypal-capture:{ev.payload['resource']['id']}:{ev.payload['id']}",
    key_space="source",
    name="recipe.paypal_capture",
    orphan_policy="redrive",
)
async def paypal_capture(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Capture the approved PayPal order (Orders v2); `PAYMENT.CAPTURE.COMPLETED` then says it is taken."""
    order = ev.payload["resource"]["id"]
    paypal = ctx.downstream("paypal")
    result: dict[str, Any] = await ctx.step(
        "capture",
        lambda key: paypal.request(
            "POST", f"/v2/checkout/orders/{order}/capture", json={}, idempotency_key=key
        ),
    )
    return result


@effect(
    source="paypal",
    events=["PAYMENT.CAPTURE.COMPLETED"],
    # A shipment acts on the shop's order: the custom_id the shop set when it created the PayPal order.
    key=lambda ev: f"order-paid:{ev.payload['resource']['custom_id']}",
    key_space="source",
    fingerprint=["/resource/amount/value", "/resource/amount/currency_code"],
    name="recipe.paypal_ship",
    orphan_policy="redrive",
)
async def paypal_ship(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Ship once PayPal reports the capture completed, once per order."""
    order = ev.payload["resource"]["custom_id"]
    return await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order,
            address={"country": "US"},
            items=[{"sku": "demo", "quantity": 1}],
            idempotency_key=key,
        ),
    )


@effect(
    source="shopify",
    events=["orders/paid"],
    # A fulfilment acts on the Shopify order. X-Shopify-Topic is unsigned: the signed body says it is paid.
    key=lambda ev: f"shopify-fulfil:{ev.payload['id']}",
    key_space="source",
    require={"/financial_status": "paid"},
    # A later orders/paid of the same order differs in updated_at; only what was paid identifies it.
    fingerprint=["/total_price", "/currency"],
    name="recipe.shopify_fulfil",
    orphan_policy="redrive",
)
async def shopify_fulfil(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Buy a label, then fulfil the order's open fulfillment orders with its tracking number, once."""
    order = ev.payload
    shipment = await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=str(order["id"]),
            address={"country": "CA"},
            items=[
                {"sku": i.get("sku") or "demo", "quantity": i.get("quantity", 1)} for i in order["line_items"]
            ],
            idempotency_key=key,
        ),
    )
    return await fulfil_order(
        ctx,
        ctx.downstream("shopify"),
        order_id=order["admin_graphql_api_id"],
        tracking_number=shipment["tracking_number"],
    )
