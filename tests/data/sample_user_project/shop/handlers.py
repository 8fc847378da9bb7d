from effectgate import EffectContext, Event, effect


def intent_key(ev: Event) -> str:
    # A capture acts on one PaymentIntent; an order can have several (a new card after a decline).
    return "capture:" + ev.payload["data"]["object"]["id"]


def order_key(ev: Event) -> str:
    return "order:" + ev.payload["data"]["object"]["metadata"]["order_id"]


# Manual capture: Stripe says the intent can be captured, then, after the capture, that it succeeded.
@effect(source="shop", events=["payment_intent.amount_capturable_updated"], key=intent_key)
async def capture_payment(ctx: EffectContext, ev: Event) -> None:
    intent = ev.payload["data"]["object"]
    await ctx.step(
        "capture",
        lambda idem: ctx.payments.capture_payment_intent(intent["id"], idempotency_key=idem),
    )


@effect(source="shop", events=["payment_intent.succeeded"], key=order_key)
async def fulfil_order(ctx: EffectContext, ev: Event) -> None:
    intent = ev.payload["data"]["object"]
    await ctx.step(
        "ship",
        lambda idem: ctx.shipping.create_shipment(
            order_id=intent["metadata"]["order_id"],
            address={"country": "NL", "postal_code": "1011 AB"},
            items=[{"sku": "mug", "quantity": 1}],
            idempotency_key=idem,
        ),
    )
