"""Stripe's own SDK inside recorded steps, pointed at the fake Stripe on loopback (`base_addresses`).

The fake reproduces Stripe's documented idempotency (https://docs.stripe.com/api/idempotent_requests): the
same key with the same parameters replays the first answer with `Idempotent-Replayed: true`; the same key with
other parameters is a 400 `idempotency_error`. Capture of an intent that is not `requires_capture` is a 400
`payment_intent_unexpected_state` (https://docs.stripe.com/api/payment_intents/capture).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import stripe

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError, UnrecoverableError
from effectgate.handlers.downstream.pace import Pace, PaceExceeded
from effectgate.handlers.idempotency import idempotency_key
from effectgate.handlers.providers.stripe import StripeSteps, call_stripe, stripe_client
from effectgate.ledger import db, jobs
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry, run_job

from .fake_servers import serving

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def fake_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving("providers", tmp_path_factory.mktemp("fake_stripe")) as url:
        yield url


@pytest.fixture
async def fake(fake_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fake_url) as client:
        assert (await client.post("/_fake/reset")).status_code == 200
        yield client


@pytest.fixture
async def client(fake_url: str) -> AsyncIterator[stripe.StripeClient]:
    http = stripe.HTTPXClient(timeout=10)
    yield stripe_client("sk_test_sdk", base_url=fake_url, http_client=http)
    await http.close_async()


async def stats(fake: httpx.AsyncClient) -> dict[str, Any]:
    result: dict[str, Any] = (await fake.get("/_fake/stats")).json()
    return result


def capture_call_async(client: stripe.StripeClient, intent: str, key: str) -> Any:
    return client.v1.payment_intents.capture_async(
        intent, {}, {"idempotency_key": key, "max_network_retries": 0}
    )


def capture_call(client: stripe.StripeClient, intent: str, key: str, **params: Any) -> Any:
    return call_stripe(
        lambda: client.v1.payment_intents.capture_async(
            intent,
            params,  # type: ignore[arg-type]
            {"idempotency_key": key, "max_network_retries": 0},
        )
    )


async def test_steps_capture_refund_and_transfer_once_with_the_steps_keys(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    steps = StripeSteps(client)
    runs = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        nonlocal runs
        runs += 1
        captured = await steps.capture(ctx, "pi_sdk_1")
        assert captured["status"] == "succeeded" and captured["object"] == "payment_intent"
        await steps.refund(ctx, payment_intent="pi_sdk_1", amount=300)
        await steps.transfer(ctx, amount=500, currency="eur", destination="acct_1", metadata={"order": "42"})
        if runs == 1:
            raise TransientError("the next call blinked")  # the retry reads all three steps back

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:42", max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()

    async with pool.connection() as conn:
        row = await jobs.get(conn, job_id) or {}
        assert row["state"] == "succeeded", [
            (a.get("outcome"), a.get("error_type"), a.get("error_message"))
            for a in await jobs.attempts(conn, job_id)
        ]
    counts = await stats(fake)
    assert (counts["captures"], counts["refunds"], counts["transfers"], counts["replays"]) == (1, 1, 1, 0)
    sent = [r for r in (await fake.get("/_fake/requests")).json() if r["path"].startswith("/v1/")]
    assert [r["path"] for r in sent] == [
        "/v1/payment_intents/pi_sdk_1/capture",
        "/v1/refunds",
        "/v1/transfers",
    ]
    keys = [r["headers"]["idempotency-key"] for r in sent]
    assert keys == [idempotency_key("default", "order:42", s) for s in ("capture", "refund", "transfer")]


async def test_same_key_same_params_is_replayed_not_captured_twice(
    fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """The crash window of a step: the capture reached Stripe, its record did not commit, the step runs
    again with the same key. Stripe answers with the saved result (docs.stripe.com/api/idempotent_requests)."""
    first = await capture_call(client, "pi_replay", "key-replay")
    again = await capture_call(client, "pi_replay", "key-replay")
    assert again == first
    counts = await stats(fake)
    assert (counts["captures"], counts["replays"]) == (1, 1)


async def test_same_key_other_params_is_unrecoverable(
    fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """Stripe compares the parameters of a reused key and refuses others with an idempotency_error
    (docs.stripe.com/api/idempotent_requests); the SDK raises IdempotencyError, a bug no retry fixes."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_params", "amount": 1000})
    await capture_call(client, "pi_params", "key-params", amount_to_capture=400)
    with pytest.raises(UnrecoverableError) as raised:
        await capture_call(client, "pi_params", "key-params", amount_to_capture=500)
    assert raised.value.code == "idempotency_error"
    assert isinstance(raised.value.__cause__, stripe.IdempotencyError)
    assert (await stats(fake))["captures"] == 1


async def test_capture_of_an_intent_not_requires_capture_is_terminal(
    fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """An automatically captured intent (what `payment_intent.succeeded` reports) cannot be captured:
    400 payment_intent_unexpected_state, which the SDK raises as InvalidRequestError."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_auto", "status": "succeeded"})
    with pytest.raises(TerminalError) as raised:
        await capture_call(client, "pi_auto", "key-auto")
    assert not isinstance(raised.value, UnrecoverableError)
    assert raised.value.code == "payment_intent_unexpected_state"
    assert isinstance(raised.value.__cause__, stripe.InvalidRequestError)
    assert (await stats(fake))["captures"] == 0


async def test_rate_limit_is_transient_and_carries_retry_after(
    fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    await fake.post("/_fake/faults", json={"mode": "rate_limit"})
    with pytest.raises(TransientError) as raised:
        await capture_call(client, "pi_limited", "key-limited")
    assert raised.value.retry_after == 7
    assert isinstance(raised.value.__cause__, stripe.RateLimitError)
    # max_network_retries=0: one request, not the SDK's own retry loop inside the step.
    assert (await stats(fake))["requests"] == 1


async def test_a_rate_limit_holds_the_paced_sdk_calls_and_the_next_one_is_not_sent(
    fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    # The fake's 429 says Retry-After: 7; a pace whose calls wait at most 2 s refuses the next one unsent.
    pace = Pace(max_wait=2.0)
    await fake.post("/_fake/faults", json={"mode": "rate_limit"})
    with pytest.raises(TransientError) as limited:
        await call_stripe(lambda: capture_call_async(client, "pi_held", "key-held-1"), pace=pace)
    assert isinstance(limited.value.__cause__, stripe.RateLimitError)
    await fake.post("/_fake/faults", json={"mode": "none"})
    with pytest.raises(PaceExceeded) as refused:
        await call_stripe(lambda: capture_call_async(client, "pi_held", "key-held-2"), pace=pace)
    assert refused.value.retry_after == pytest.approx(7, abs=1)
    assert (await stats(fake))["requests"] == 1


async def test_a_connection_refused_is_transient() -> None:
    http = stripe.HTTPXClient(timeout=5)
    try:
        with pytest.raises(TransientError) as raised:
            closed = stripe_client("sk_test_sdk", base_url="http://127.0.0.1:9", http_client=http)
            await capture_call(closed, "pi_nowhere", "key-nowhere")
    finally:
        await http.close_async()
    assert isinstance(raised.value.__cause__, stripe.APIConnectionError)


# -- what already happened counts as done --------------------------------------------------------------


async def test_an_intent_captured_in_the_dashboard_is_the_captures_outcome(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """Captured elsewhere first (the Dashboard, or the step's own call past Stripe's 24-hour key window):
    Stripe refuses the step's capture with `payment_intent_unexpected_state`
    (https://docs.stripe.com/api/payment_intents/capture); the step reads the intent back, finds it
    `succeeded` for the whole amount, and records it as its outcome, marked."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_dash", "amount": 1500})
    await capture_call(client, "pi_dash", "dashboard-key")  # the Dashboard's capture
    steps_ = StripeSteps(client)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        captured = await steps_.capture(ctx, "pi_dash")
        assert captured["recovered"] == "already_captured"

    row, recorded = await run_job(pool, "order:dash", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["capture"]
    assert (result["id"], result["status"], result["amount_received"]) == ("pi_dash", "succeeded", 1500)
    assert result["recovered"] == "already_captured"
    counts = await stats(fake)
    assert (counts["captures"], counts["captures_by_intent"]) == (1, {"pi_dash": 1})


async def test_a_canceled_intent_fails_the_capture_naming_its_state(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """Canceled is terminal too, but not the state a capture wants: the job fails, the error says why."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_gone", "amount": 1500})
    assert (await fake.post("/v1/payment_intents/pi_gone/cancel")).status_code == 200
    steps_ = StripeSteps(client)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await steps_.capture(ctx, "pi_gone")

    row, recorded = await run_job(pool, "order:gone", handler)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert recorded["capture"]["code"] == "payment_intent_unexpected_state"
    assert "pi_gone is canceled, not captured" in recorded["capture"]["message"]
    assert (await stats(fake))["captures"] == 0


async def test_a_capture_elsewhere_for_another_amount_is_not_this_steps_capture(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    await fake.post("/_fake/payment_intents", json={"id": "pi_part", "amount": 1500})
    await capture_call(client, "pi_part", "dashboard-part", amount_to_capture=500)
    steps_ = StripeSteps(client)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await steps_.capture(ctx, "pi_part")

    row, recorded = await run_job(pool, "order:part", handler)
    assert row["state"] == "failed"
    assert "captured elsewhere for 500, not the 1500" in recorded["capture"]["message"]


async def test_a_charge_refunded_in_the_dashboard_is_the_refunds_outcome(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """Refunded in full elsewhere first: Stripe refuses the step's refund with `charge_already_refunded`
    (https://docs.stripe.com/error-codes#charge-already-refunded); the step finds the captured intent's
    refunds adding up to what was received and records the refund, marked."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_back", "amount": 800, "status": "succeeded"})
    elsewhere = await call_stripe(
        lambda: client.v1.refunds.create_async({"payment_intent": "pi_back"}, {"idempotency_key": "dash-r"})
    )
    steps_ = StripeSteps(client)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        refunded = await steps_.refund(ctx, payment_intent="pi_back")
        assert refunded["recovered"] == "already_refunded"

    row, recorded = await run_job(pool, "order:back", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["refund"]
    assert (result["id"], result["amount"], result["object"]) == (elsewhere["id"], 800, "refund")
    assert result["recovered"] == "already_refunded"
    assert (await stats(fake))["refunds"] == 1


async def test_a_canceled_intent_fails_the_refund_naming_its_state(
    pool: db.Pool, fake: httpx.AsyncClient, client: stripe.StripeClient
) -> None:
    """Cancelling a `requires_capture` intent refunds its capturable amount
    (https://docs.stripe.com/api/payment_intents/cancel), so a refund is refused as
    `charge_already_refunded` — but nothing was ever captured, so nothing this step wanted happened."""
    await fake.post("/_fake/payment_intents", json={"id": "pi_void", "amount": 800})
    assert (await fake.post("/v1/payment_intents/pi_void/cancel")).status_code == 200
    steps_ = StripeSteps(client)

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await steps_.refund(ctx, payment_intent="pi_void")

    row, recorded = await run_job(pool, "order:void", handler)
    assert row["state"] == "failed"
    assert recorded["refund"]["code"] == "charge_already_refunded"
    assert "pi_void is canceled, never captured" in recorded["refund"]["message"]
    assert (await stats(fake))["refunds"] == 0
