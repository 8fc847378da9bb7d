from effectgate import EffectContext, Event, effect


def order_key(ev: Event) -> str:
    return "order:" + ev.payload["data"]["object"]["metadata"]["order_id"]


@effect(source="shop", events=["payment_intent.succeeded"], key=order_key)
async def fulfil_order(ctx: EffectContext, ev: Event) -> None:
    intent = ev.payload["data"]["object"]
    await ctx.step(
        "capture",
        lambda idem: ctx.payments.capture_payment_intent(intent["id"], idempotency_key=idem),
    )
    await ctx.step(
        "ship",
        lambda idem: ctx.shipping.create_shipment(
            order_id=intent["metadata"]["order_id"],
            address={"country": "NL", "postal_code": "1011 AB"},
            items=[{"sku": "mug", "quantity": 1}],
            idempotency_key=idem,
        ),
    )
