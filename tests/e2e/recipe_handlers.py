"""The Adyen recipe of docs/provider_sdks.md ("Recipes", Adyen), as a handler module a worker runs.

Adyen signs only named fields of each notification item (`pspReference`, `originalReference`,
`merchantAccountCode`, `merchantReference`, `value`, `currency`, `eventCode`, `success`); the keys,
requirements and fingerprints below read nothing else.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, effect
from effectgate.handlers.providers.adyen import capture_payment


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
