"""PaymentsClient against respx: request shape, idempotency keys, argument checks, answer classes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
import respx

from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError

pytestmark = pytest.mark.anyio

BASE = "https://payments.example.test"
CAPTURE = "/v1/payment_intents/pi_123/capture"


@pytest.fixture
async def payments() -> AsyncIterator[PaymentsClient]:
    async with httpx.AsyncClient() as http:
        yield PaymentsClient(http, DownstreamConfig(BASE, "sk_test_123"))


def form(request: httpx.Request) -> dict[str, list[str]]:
    return parse_qs(request.content.decode())


async def test_capture_sends_key_auth_and_amount(payments: PaymentsClient) -> None:
    intent = {"id": "pi_123", "object": "payment_intent", "status": "succeeded"}
    with respx.mock(base_url=BASE) as router:
        route = router.post(CAPTURE).respond(200, json=intent)
        result = await payments.capture_payment_intent(
            "pi_123", idempotency_key="t1:order-paid:42:capture", amount_to_capture=750
        )
    assert result == intent
    request = route.calls.last.request
    assert request.headers["Idempotency-Key"] == "t1:order-paid:42:capture"
    assert request.headers["Authorization"] == "Bearer sk_test_123"
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert form(request) == {"amount_to_capture": ["750"]}


async def test_capture_in_full_sends_no_amount(payments: PaymentsClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post(CAPTURE).respond(200, json={"id": "pi_123"})
        await payments.capture_payment_intent("pi_123", idempotency_key="k")
    assert route.calls.last.request.content == b""


async def test_refund_sends_form_body(payments: PaymentsClient) -> None:
    refund = {"id": "re_1", "object": "refund", "amount": 300}
    with respx.mock(base_url=BASE) as router:
        route = router.post("/v1/refunds").respond(200, json=refund)
        result = await payments.create_refund(
            payment_intent="pi_123", idempotency_key="k-refund", amount=300, reason="requested_by_customer"
        )
    assert result == refund
    request = route.calls.last.request
    assert request.headers["Idempotency-Key"] == "k-refund"
    assert request.headers["Authorization"] == "Bearer sk_test_123"
    assert form(request) == {
        "payment_intent": ["pi_123"],
        "amount": ["300"],
        "reason": ["requested_by_customer"],
    }


async def test_same_key_on_every_retry(payments: PaymentsClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post(CAPTURE).mock(
            side_effect=[httpx.Response(500), httpx.ConnectError, httpx.Response(200, json={"id": "pi_123"})]
        )
        for _ in range(2):
            with pytest.raises(TransientError):
                await payments.capture_payment_intent("pi_123", idempotency_key="same-key")
        assert await payments.capture_payment_intent("pi_123", idempotency_key="same-key") == {"id": "pi_123"}
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == ["same-key"] * 3
    assert len({call.request.content for call in route.calls}) == 1


async def test_refund_same_key_after_500(payments: PaymentsClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post("/v1/refunds").mock(
            side_effect=[httpx.Response(503), httpx.Response(200, json={"id": "re_1"})]
        )
        with pytest.raises(TransientError):
            await payments.create_refund(payment_intent="pi_1", idempotency_key="rk")
        await payments.create_refund(payment_intent="pi_1", idempotency_key="rk")
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == ["rk", "rk"]


@pytest.mark.parametrize(
    "bad_id", ["", "pi/../../v1/refunds", "pi_1?expand=x", "..", "pi 1", "pi_1%2F", "é", "x" * 256]
)
async def test_ids_are_validated_before_any_request(payments: PaymentsClient, bad_id: str) -> None:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        route = router.route().respond(200, json={})
        with pytest.raises(ValueError, match="payment_intent"):
            await payments.capture_payment_intent(bad_id, idempotency_key="k")
        with pytest.raises(ValueError, match="payment_intent"):
            await payments.create_refund(payment_intent=bad_id, idempotency_key="k")
    assert not route.called


@pytest.mark.parametrize("amount", [0, -5, True, 1.5, "100"])
async def test_amounts_are_validated(payments: PaymentsClient, amount: Any) -> None:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        route = router.route().respond(200, json={})
        with pytest.raises(ValueError, match="amount"):
            await payments.capture_payment_intent("pi_1", idempotency_key="k", amount_to_capture=amount)
        with pytest.raises(ValueError, match="amount"):
            await payments.create_refund(payment_intent="pi_1", idempotency_key="k", amount=amount)
    assert not route.called


async def test_empty_reason_is_refused(payments: PaymentsClient) -> None:
    with pytest.raises(ValueError, match="reason"):
        await payments.create_refund(payment_intent="pi_1", idempotency_key="k", reason="")


def stripe_error(type_: str, code: str | None = None) -> dict[str, Any]:
    error = {"type": type_, "message": f"{type_} happened"}
    if code is not None:
        error["code"] = code
    return {"error": error}


@pytest.mark.parametrize(
    ("answer", "error", "code"),
    [
        (
            httpx.Response(409, json=stripe_error("idempotency_error", "idempotency_key_in_use")),
            TransientError,
            None,
        ),
        (httpx.Response(429, json=stripe_error("rate_limit_error")), TransientError, None),
        (httpx.Response(500, json=stripe_error("api_error")), TransientError, None),
        (httpx.Response(503, text="upstream unavailable"), TransientError, None),
        (httpx.ConnectError, TransientError, None),
        (httpx.ReadTimeout, TransientError, None),
        (httpx.RemoteProtocolError, TransientError, None),
        (httpx.Response(200, text="not json"), TransientError, None),
        (
            httpx.Response(400, json=stripe_error("idempotency_error")),
            UnrecoverableError,
            "idempotency_error",
        ),
        (
            httpx.Response(402, json=stripe_error("card_error", "card_declined")),
            TerminalError,
            "card_declined",
        ),
        (
            httpx.Response(
                400, json=stripe_error("invalid_request_error", "payment_intent_unexpected_state")
            ),
            TerminalError,
            "payment_intent_unexpected_state",
        ),
        (
            httpx.Response(400, json=stripe_error("invalid_request_error", "charge_already_refunded")),
            TerminalError,
            "charge_already_refunded",
        ),
        (
            httpx.Response(404, json=stripe_error("invalid_request_error")),
            TerminalError,
            "invalid_request_error",
        ),
    ],
)
async def test_answers_map_to_outcomes(
    payments: PaymentsClient, answer: Any, error: type[Exception], code: str | None
) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post(CAPTURE).mock(side_effect=[answer])
        router.post("/v1/refunds").mock(side_effect=[answer])
        with pytest.raises(error) as capture_error:
            await payments.capture_payment_intent("pi_123", idempotency_key="k")
        with pytest.raises(error) as refund_error:
            await payments.create_refund(payment_intent="pi_123", idempotency_key="k2")
    for caught in (capture_error, refund_error):
        assert type(caught.value) is error
        if isinstance(caught.value, TerminalError):
            assert caught.value.code == code


async def test_429_retry_after_is_honoured(payments: PaymentsClient) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post(CAPTURE).respond(
            429, headers={"Retry-After": "12"}, json=stripe_error("rate_limit_error")
        )
        with pytest.raises(TransientError) as caught:
            await payments.capture_payment_intent("pi_123", idempotency_key="k")
    assert caught.value.retry_after == 12.0
