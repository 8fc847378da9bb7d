"""What the provider said survives into the error record: HTTP status, the provider's request id and the
decline code, from our HTTP clients' answers and from Stripe's own SDK errors, through a re-raise."""

from __future__ import annotations

import httpx
import pytest
import stripe

from effectgate.handlers.downstream import classify_response
from effectgate.handlers.errors import TerminalError, TransientError, facts
from effectgate.handlers.providers.stripe import outcome_of
from effectgate.handlers.worker.recorder import error_record

REQUEST = httpx.Request("POST", "https://api.example.test/v1/captures")


def answer(status: int, body: object, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers, request=REQUEST)


def test_a_stripe_decline_keeps_status_request_id_and_decline_code() -> None:
    body = {"error": {"type": "card_error", "code": "card_declined", "decline_code": "do_not_honor"}}
    with pytest.raises(TerminalError) as raised:
        classify_response(answer(402, body, **{"Request-Id": "req_1"}))
    assert raised.value.code == "card_declined"
    assert facts(raised.value) == {"http_status": 402, "request_id": "req_1", "decline_code": "do_not_honor"}


def test_paypal_debug_id_from_the_header_or_the_body_and_a_retry_keeps_its_status() -> None:
    body = {
        "name": "UNPROCESSABLE_ENTITY",
        "debug_id": "8a1b2c",
        "details": [{"issue": "INSTRUMENT_DECLINED"}],
    }
    with pytest.raises(TerminalError) as raised:
        classify_response(answer(422, body))
    assert facts(raised.value) == {"http_status": 422, "request_id": "8a1b2c"}
    with pytest.raises(TransientError) as retried:
        classify_response(answer(503, {}, **{"Paypal-Debug-Id": "f00d"}))
    assert facts(retried.value) == {"http_status": 503, "request_id": "f00d"}


def test_the_stripe_sdk_error_keeps_them_and_a_clearer_error_raised_from_it_inherits_them() -> None:
    sdk = stripe.CardError(
        "Your card was declined.",
        None,
        "card_declined",
        http_status=402,
        json_body={
            "error": {"code": "card_declined", "decline_code": "insufficient_funds", "type": "card_error"}
        },
        headers={"request-id": "req_sdk"},
    )
    refused = outcome_of(sdk)
    assert facts(refused) == {
        "http_status": 402,
        "request_id": "req_sdk",
        "decline_code": "insufficient_funds",
    }
    try:
        try:
            raise refused
        except TerminalError as inner:
            raise TerminalError("payment intent pi_1 is canceled", code=inner.code) from inner
    except TerminalError as outer:
        record = error_record(outer)
    assert (record["code"], record["request_id"], record["decline_code"]) == (
        "card_declined",
        "req_sdk",
        "insufficient_funds",
    )


def test_an_error_from_no_provider_records_no_facts() -> None:
    assert facts(ValueError("boom")) == {}
    assert set(error_record(TerminalError("nope"))) == {"type", "message", "code", "traceback"}
