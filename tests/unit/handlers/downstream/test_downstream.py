"""The shared downstream request path: config validation, headers, and how every answer is classified."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
import respx

from effectgate.gateway import metrics
from effectgate.handlers.downstream import DownstreamConfig, classify_response, send_idempotent
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError
from tests.prometheus import value

pytestmark = pytest.mark.anyio

BASE = "https://api.example.test"
PATH = "/v1/things"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def config() -> DownstreamConfig:
    return DownstreamConfig(BASE, "sk_test_secret")


# -- configuration ------------------------------------------------------------------------------


def test_config_defaults_and_normalisation() -> None:
    config = DownstreamConfig("http://127.0.0.1:8080/prefix/", None)
    assert config.base_url == "http://127.0.0.1:8080/prefix"
    assert (config.timeout, config.connect_timeout) == (10.0, 5.0)
    timeout = config.httpx_timeout()
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (5.0, 10.0, 10.0, 10.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "ftp://api.example.test"}, "base_url"),
        ({"base_url": "api.example.test"}, "base_url"),
        ({"base_url": "https://"}, "base_url"),
        ({"base_url": "https://api.example.test/?x=1"}, "query"),
        ({"api_key": ""}, "api_key"),
        ({"api_key": " sk_test "}, "api_key"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"connect_timeout": 0.0}, "connect_timeout"),
    ],
)
def test_config_is_validated_at_construction(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"base_url": BASE, "api_key": "sk_test"} | kwargs
    with pytest.raises(ValueError, match=match):
        DownstreamConfig(**arguments)


def test_config_repr_never_shows_the_api_key() -> None:
    assert "sk_live_very_secret" not in repr(DownstreamConfig(BASE, "sk_live_very_secret"))


# -- the request ----------------------------------------------------------------------------------


async def test_sends_key_auth_and_form_body(http: httpx.AsyncClient, config: DownstreamConfig) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post(PATH).respond(200, json={"id": "th_1"})
        result = await send_idempotent(http, config, PATH, idempotency_key="k-1", form={"a": "1"})
    assert result == {"id": "th_1"}
    request = route.calls.last.request
    assert request.headers["Idempotency-Key"] == "k-1"
    assert request.headers["Authorization"] == "Bearer sk_test_secret"
    assert request.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert request.content == b"a=1"


async def test_no_auth_header_without_api_key(http: httpx.AsyncClient) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post(PATH).respond(200, json={})
        await send_idempotent(http, DownstreamConfig(BASE, None), PATH, idempotency_key="k", json={"a": 1})
    assert "Authorization" not in route.calls.last.request.headers
    assert route.calls.last.request.content == b'{"a":1}'


async def test_same_key_on_the_retry_after_a_500(http: httpx.AsyncClient, config: DownstreamConfig) -> None:
    with respx.mock(base_url=BASE) as router:
        route = router.post(PATH).mock(
            side_effect=[httpx.Response(500), httpx.Response(200, json={"id": "th_1"})]
        )
        with pytest.raises(TransientError):
            await send_idempotent(http, config, PATH, idempotency_key="k-retry")
        assert await send_idempotent(http, config, PATH, idempotency_key="k-retry") == {"id": "th_1"}
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == ["k-retry", "k-retry"]


@pytest.mark.parametrize("key", ["", "x" * 256, "k\nInjected: 1", "clé"])
async def test_bad_idempotency_keys_are_refused_before_sending(
    http: httpx.AsyncClient, config: DownstreamConfig, key: str
) -> None:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        route = router.post(PATH).respond(200, json={})
        with pytest.raises(ValueError, match="idempotency_key"):
            await send_idempotent(http, config, PATH, idempotency_key=key)
    assert not route.called


# -- classification -------------------------------------------------------------------------------

STRIPE_KEY_REUSED = {
    "error": {
        "type": "idempotency_error",
        "message": "Keys for idempotent requests can only be used with the same parameters.",
    }
}
STRIPE_KEY_IN_USE = {"error": {"type": "idempotency_error", "code": "idempotency_key_in_use"}}
CARD_DECLINED = {
    "error": {
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "insufficient_funds",
        "message": "Your card has insufficient funds.",
    }
}


@pytest.mark.parametrize(
    ("answer", "error", "code"),
    [
        (httpx.Response(409, json=STRIPE_KEY_IN_USE), TransientError, None),
        (httpx.Response(429, json={"error": {"type": "rate_limit_error"}}), TransientError, None),
        (httpx.Response(500, text="Internal Server Error"), TransientError, None),
        (httpx.Response(502), TransientError, None),
        (httpx.Response(503, json={"error": {"type": "api_error"}}), TransientError, None),
        (httpx.Response(408), TransientError, None),
        (httpx.ConnectError, TransientError, None),
        (httpx.ConnectTimeout, TransientError, None),
        (httpx.ReadTimeout, TransientError, None),
        (httpx.RemoteProtocolError, TransientError, None),
        (httpx.ReadError, TransientError, None),
        (httpx.Response(200, text="<html>oops</html>"), TransientError, None),
        (httpx.Response(201, json=["not", "an", "object"]), TransientError, None),
        (httpx.Response(400, json=STRIPE_KEY_REUSED), UnrecoverableError, "idempotency_error"),
        (httpx.Response(402, json=CARD_DECLINED), TerminalError, "card_declined"),
        (
            httpx.Response(400, json={"error": {"type": "card_error", "code": "expired_card"}}),
            TerminalError,
            "expired_card",
        ),
        (httpx.Response(400, json={"error": {"type": "invalid_request_error"}}), TerminalError, None),
        (
            httpx.Response(422, json={"error": "address_invalid", "message": "No such street"}),
            TerminalError,
            None,
        ),
        (httpx.Response(404, text="not found"), TerminalError, "http_404"),
        (httpx.Response(401, json={"error": {"type": "authentication_error"}}), TerminalError, None),
        (httpx.Response(302, headers={"Location": "/elsewhere"}), TerminalError, "http_302"),
    ],
)
async def test_each_answer_class_maps_to_its_outcome(
    http: httpx.AsyncClient,
    config: DownstreamConfig,
    answer: Any,
    error: type[Exception],
    code: str | None,
) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post(PATH).mock(side_effect=[answer])
        with pytest.raises(error) as caught:
            await send_idempotent(http, config, PATH, idempotency_key="k")
    assert type(caught.value) is error  # an UnrecoverableError is a TerminalError: be exact
    if isinstance(caught.value, TerminalError):
        expected = code
        if expected is None:
            body = answer.json()
            inner = body["error"]
            expected = inner if isinstance(inner, str) else inner.get("code") or inner["type"]
        assert caught.value.code == expected
    assert "sk_test_secret" not in str(caught.value)


async def test_transport_errors_are_chained(http: httpx.AsyncClient, config: DownstreamConfig) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post(PATH).mock(side_effect=httpx.ReadTimeout)
        with pytest.raises(TransientError) as caught:
            await send_idempotent(http, config, PATH, idempotency_key="k")
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)


async def test_terminal_error_carries_the_provider_message(
    http: httpx.AsyncClient, config: DownstreamConfig
) -> None:
    with respx.mock(base_url=BASE) as router:
        router.post(PATH).respond(402, json=CARD_DECLINED)
        with pytest.raises(TerminalError, match="insufficient funds") as caught:
            await send_idempotent(http, config, PATH, idempotency_key="k")
    assert caught.value.code == "card_declined"


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [
        (429, "7", 7.0),
        (429, "1.5", 1.5),
        (429, "-3", 0.0),
        (429, "soon", None),
        (429, None, None),
        (503, "30", 30.0),
        (409, "2", 2.0),
    ],
)
def test_retry_after_seconds(status: int, retry_after: str | None, expected: float | None) -> None:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    with pytest.raises(TransientError) as caught:
        classify_response(httpx.Response(status, headers=headers))
    assert caught.value.retry_after == expected


def test_retry_after_http_date() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    with pytest.raises(TransientError) as caught:
        classify_response(httpx.Response(429, headers={"Retry-After": when}))
    assert caught.value.retry_after is not None
    assert 100 <= caught.value.retry_after <= 120


def test_a_2xx_json_object_is_returned() -> None:
    assert classify_response(httpx.Response(200, json={"ok": True})) == {"ok": True}


def test_paypals_issue_is_the_code_of_a_terminal_error() -> None:
    """PayPal names the class in `name` and what happened in `details[0].issue`
    (https://developer.paypal.com/api/payments/v2/errors/authorization_already_captured): a step that
    recognises an issue needs the issue."""
    body = {
        "name": "UNPROCESSABLE_ENTITY",
        "message": "The requested action could not be performed.",
        "details": [
            {
                "issue": "AUTHORIZATION_ALREADY_CAPTURED",
                "description": "Authorization has already been captured.",
            }
        ],
    }
    with pytest.raises(TerminalError) as caught:
        classify_response(httpx.Response(422, json=body))
    assert caught.value.code == "AUTHORIZATION_ALREADY_CAPTURED"
    assert "Authorization has already been captured." in str(caught.value)


# -- observing calls ------------------------------------------------------------------------------


async def test_every_call_sent_is_reported_with_its_status_or_transport_error(
    http: httpx.AsyncClient, config: DownstreamConfig
) -> None:
    seen: list[tuple[str, int | str]] = []

    def on_call(service: str, status: int | str, seconds: float) -> None:
        assert seconds >= 0
        seen.append((service, status))

    with respx.mock(base_url=BASE) as router:
        router.post(PATH).mock(
            side_effect=[
                httpx.Response(200, json={"id": "th_1"}),
                httpx.Response(503),
                httpx.Response(402, json=CARD_DECLINED),
                httpx.ConnectError("connection refused"),
            ]
        )
        await send_idempotent(http, config, PATH, idempotency_key="k-1", service="things", on_call=on_call)
        for error in (TransientError, TerminalError, TransientError):
            with pytest.raises(error):
                await send_idempotent(
                    http, config, PATH, idempotency_key="k-1", service="things", on_call=on_call
                )
        # Refused before sending: no call, nothing to report.
        with pytest.raises(ValueError):
            await send_idempotent(http, config, PATH, idempotency_key="", service="things", on_call=on_call)
    assert seen == [("things", 200), ("things", 503), ("things", 402), ("things", "ConnectError")]


async def test_the_clients_count_their_calls_into_the_process_metrics(
    http: httpx.AsyncClient, config: DownstreamConfig
) -> None:
    def calls(service: str, status: str) -> float:
        return value(metrics.render(), "effectgate_downstream_calls_total", service=service, status=status)

    keys = [
        ("payments", "200"),
        ("payments", "ConnectError"),
        ("shipping", "503"),
        ("shipping", "ReadTimeout"),
    ]

    def timed(service: str, outcome: str) -> float:
        return value(
            metrics.render(), "effectgate_downstream_call_seconds_count", service=service, outcome=outcome
        )

    timings = [("payments", "2xx"), ("payments", "error"), ("shipping", "5xx"), ("shipping", "error")]
    before = {key: calls(*key) for key in keys}
    timed_before = {key: timed(*key) for key in timings}
    payments = PaymentsClient(http, config, on_call=metrics.downstream_call)
    shipping = ShippingClient(http, config, on_call=metrics.downstream_call)
    with respx.mock(base_url=BASE) as router:
        router.post("/v1/payment_intents/pi_1/capture").mock(
            side_effect=[httpx.Response(200, json={"id": "pi_1"}), httpx.ConnectError("refused")]
        )
        router.post("/v1/shipments").mock(side_effect=[httpx.Response(503), httpx.ReadTimeout("no answer")])
        await payments.capture_payment_intent("pi_1", idempotency_key="k-capture")
        with pytest.raises(TransientError):
            await payments.capture_payment_intent("pi_1", idempotency_key="k-capture")
        for _ in range(2):
            with pytest.raises(TransientError):
                await shipping.create_shipment(
                    order_id="o1", address={}, items=[{"sku": "x"}], idempotency_key="k-ship"
                )
    assert {key: calls(*key) - before[key] for key in keys} == dict.fromkeys(keys, 1.0)
    # Each call's wall time, by service and status class (a transport error is "error").
    assert {key: timed(*key) - timed_before[key] for key in timings} == dict.fromkeys(timings, 1.0)
