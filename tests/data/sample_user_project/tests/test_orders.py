import httpx
import pytest
from shop.handlers import capture_payment, fulfil_order

from effectgate import TerminalError
from effectgate.testing import TestLedger, context_for, example_event, run_handler, services_over

pytestmark = pytest.mark.anyio


class Provider:
    """Answers the payment and shipping APIs, keeping what was sent."""

    def __init__(self, decline: bool = False) -> None:
        self.decline = decline
        self.sent: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((request.url.path, request.headers["Idempotency-Key"]))
        if self.decline:
            return httpx.Response(402, json={"error": {"code": "card_declined"}})
        return httpx.Response(200, json={"id": "obj_1", "status": "succeeded"})


async def test_each_step_runs_once_with_a_stable_key() -> None:
    provider = Provider()
    services = services_over(httpx.MockTransport(provider))
    capturable = example_event(
        "stripe", "payment_intent.amount_capturable_updated", event_id="evt_1", source="shop"
    )
    capture = context_for(capturable, capture_payment, services=services)
    await run_handler(capture)
    succeeded = example_event("stripe", "payment_intent.succeeded", event_id="evt_1", source="shop")
    ship = context_for(succeeded, fulfil_order, services=services)
    await run_handler(ship)

    intent = capturable.payload["data"]["object"]
    assert capture.effect_key == "capture:" + intent["id"]
    assert ship.effect_key == "order:" + intent["metadata"]["order_id"]
    assert [key for _, key in provider.sent] == [
        capture.idempotency_key("capture"),
        ship.idempotency_key("ship"),
    ]

    again = capture.rerun()  # a retry, a reclaimed lease or a redrive: recorded steps are replayed
    await run_handler(again)
    assert again.calls == [] and len(provider.sent) == 2


async def test_a_declined_card_fails_for_good() -> None:
    provider = Provider(decline=True)
    ev = example_event("stripe", "payment_intent.amount_capturable_updated", event_id="evt_2", source="shop")
    ctx = context_for(ev, capture_payment, services=services_over(httpx.MockTransport(provider)))
    with pytest.raises(TerminalError) as failed:
        await run_handler(ctx)
    assert failed.value.code == "card_declined"

    with pytest.raises(TerminalError):  # recorded: raised again, the card is not charged again
        await run_handler(ctx.rerun())
    assert len(provider.sent) == 1


async def test_claimed_and_run_through_the_worker(effectgate_ledger: TestLedger) -> None:
    provider = Provider()
    ev = example_event("stripe", event_id="evt_3", source="shop")
    [claimed] = await effectgate_ledger.deliver(ev)
    assert claimed.outcome == "accepted"
    assert [o.outcome for o in await effectgate_ledger.deliver(ev)] == ["duplicate"]

    job = await effectgate_ledger.run_job(fulfil_order, services=services_over(httpx.MockTransport(provider)))
    assert job.state == "succeeded"
    assert job.steps["ship"].idempotency_key == provider.sent[0][1]
