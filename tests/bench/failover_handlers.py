"""The handler the failover run's workers load: capture then ship, each a step under its idempotency key, with
the default orphan policy (park), so a failover taken for an orphan would show as a parked job."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event, effect


def order_key(ev: Event) -> str:
    return f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}"


@effect(source="shop", events=["payment_intent.succeeded"], key=order_key, name="failover.fulfil")
async def fulfil(ctx: EffectContext, ev: Event) -> None:
    obj = ev.payload["data"]["object"]
    order_id = obj["metadata"]["order_id"]
    await ctx.step("capture", lambda key: ctx.payments.capture_payment_intent(obj["id"], idempotency_key=key))
    await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order_id,
            address={"country": "DE"},
            items=[{"sku": "x", "quantity": 1}],
            idempotency_key=key,
        ),
    )
