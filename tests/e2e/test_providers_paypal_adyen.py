"""PayPal and Adyen captures through `ctx.downstream`, each key in the provider's own header, against fakes.

PayPal: "when you include a previously specified PayPal-Request-Id header in a request, PayPal returns the
latest status of the previous request" (https://developer.paypal.com/reference/guidelines/idempotency).
Adyen: the Checkout API answers a POST whose `Idempotency-Key` was seen before with the first answer
(https://docs.adyen.com/development-resources/api-idempotency). The fakes do both, so the crash window of a
step (the capture made, its record lost, the step run again with the same key) captures once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig
from effectgate.handlers.idempotency import idempotency_key
from effectgate.handlers.providers.adyen import capture_payment
from effectgate.handlers.providers.paypal import capture_authorization, capture_order
from effectgate.ledger import db, jobs
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry, run_job

from .fake_servers import serving

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def fake_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving("paypal_adyen", tmp_path_factory.mktemp("fake_paypal_adyen")) as url:
        yield url


@pytest.fixture
async def http(fake_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        assert (await client.post(f"{fake_url}/_fake/reset")).status_code == 200
        yield client


def paypal(http: httpx.AsyncClient, url: str, header: str | None = "PayPal-Request-Id") -> DownstreamClient:
    return DownstreamClient("paypal", http, DownstreamConfig(url, "A21AA_token", idempotency_header=header))


def adyen(http: httpx.AsyncClient, url: str) -> DownstreamClient:
    config = DownstreamConfig(f"{url}/v71", "AQE_key", auth_scheme="X-API-Key")
    return DownstreamClient("adyen", http, config)


async def stats(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    result: dict[str, Any] = (await http.get(f"{url}/_fake/stats")).json()
    return result


async def test_both_captures_run_once_across_a_retry_with_the_steps_key(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    runs = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        nonlocal runs
        runs += 1
        pp = await capture_authorization(ctx, paypal(http, fake_url), "0VF52814937998046", step="paypal")
        assert pp["status"] == "COMPLETED"
        ad = await capture_payment(
            ctx,
            adyen(http, fake_url),
            "QFQTPCQ8HXSKGK82",
            merchant_account="ShopECOM",
            value=1000,
            currency="EUR",
            step="adyen",
        )
        assert ad["status"] == "received"
        if runs == 1:
            raise TransientError("a later call blinked")

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:77", max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        assert (await jobs.get(conn, job_id) or {})["state"] == "succeeded"
    counts = await stats(http, fake_url)
    assert counts["paypal_captures"] == {"0VF52814937998046": 1}
    assert counts["adyen_captures"] == {"QFQTPCQ8HXSKGK82": 1}
    assert (counts["replays"], counts["requests_without_key"]) == (0, 0)


async def test_the_same_key_again_is_answered_with_the_first_capture(
    http: httpx.AsyncClient, fake_url: str
) -> None:
    """The crash window: the capture reached the provider, its answer was never recorded, the step runs
    again with the same key. Both providers answer with the first result instead of capturing again."""
    key = idempotency_key("default", "order:78", "capture")
    path = "/v2/payments/authorizations/AUTH78/capture"
    first = await paypal(http, fake_url).request(
        "POST", path, json={"final_capture": True}, idempotency_key=key
    )
    again = await paypal(http, fake_url).request(
        "POST", path, json={"final_capture": True}, idempotency_key=key
    )
    assert again == first
    body = {"merchantAccount": "ShopECOM", "amount": {"value": 500, "currency": "EUR"}}
    a1 = await adyen(http, fake_url).request(
        "POST", "/payments/PSP78/captures", json=body, idempotency_key=key
    )
    a2 = await adyen(http, fake_url).request(
        "POST", "/payments/PSP78/captures", json=body, idempotency_key=key
    )
    assert a2 == a1
    counts = await stats(http, fake_url)
    assert (counts["paypal_captures"], counts["adyen_captures"], counts["replays"]) == (
        {"AUTH78": 1},
        {"PSP78": 1},
        2,
    )


async def test_a_key_in_the_wrong_header_is_refused_before_anything_is_sent(
    http: httpx.AsyncClient, fake_url: str
) -> None:
    # In Idempotency-Key, PayPal would ignore the key and capture again on a retry.
    with pytest.raises(ValueError, match="PayPal-Request-Id"):
        await capture_authorization(None, paypal(http, fake_url, header="Idempotency-Key"), "AUTH79")  # type: ignore[arg-type]
    assert (await stats(http, fake_url))["requests_without_key"] == 0


async def test_a_second_capture_under_another_key_is_refused_terminally(
    http: httpx.AsyncClient, fake_url: str
) -> None:
    path = "/v2/payments/authorizations/AUTH80/capture"
    await paypal(http, fake_url).request("POST", path, json={}, idempotency_key="k-first")
    with pytest.raises(TerminalError):
        await paypal(http, fake_url).request("POST", path, json={}, idempotency_key="k-second")
    assert (await stats(http, fake_url))["paypal_captures"] == {"AUTH80": 1}


async def test_an_authorization_captured_elsewhere_is_the_captures_outcome(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    """Captured in PayPal's dashboard first (or by the step's own call once PayPal forgot its request id):
    the step's capture is a 422 `AUTHORIZATION_ALREADY_CAPTURED`
    (https://developer.paypal.com/api/payments/v2/errors/authorization_already_captured); the step shows
    the authorization, finds it CAPTURED, and records it, marked."""
    path = "/v2/payments/authorizations/AUTH90/capture"
    await paypal(http, fake_url).request("POST", path, json={}, idempotency_key="dashboard")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await capture_authorization(ctx, paypal(http, fake_url), "AUTH90")

    row, recorded = await run_job(pool, "order:90", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["capture"]
    assert (result["id"], result["status"], result["recovered"]) == ("AUTH90", "CAPTURED", "already_captured")
    assert (await stats(http, fake_url))["paypal_captures"] == {"AUTH90": 1}


async def test_an_order_captured_already_is_the_captures_outcome(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    """Captured by another approval's capture first (or by the step's own call once PayPal forgot its
    request id): the step's capture is a 422 `ORDER_ALREADY_CAPTURED`
    (https://developer.paypal.com/docs/api/orders/v2/#error-ORDER_ALREADY_CAPTURED); the step shows the
    order, finds its capture COMPLETED, and records the order as PayPal shows it, marked."""
    path = "/v2/checkout/orders/5O190127TN364715T/capture"
    first = await paypal(http, fake_url).request("POST", path, json={}, idempotency_key="other-approval")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await capture_order(ctx, paypal(http, fake_url), "5O190127TN364715T")

    row, recorded = await run_job(pool, "order:92", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["capture"]
    assert (result["id"], result["status"], result["recovered"]) == (
        "5O190127TN364715T",
        "COMPLETED",
        "already_captured",
    )
    assert result["purchase_units"][0]["payments"] == first["purchase_units"][0]["payments"]
    assert (await stats(http, fake_url))["paypal_order_captures"] == {"5O190127TN364715T": 1}


async def test_an_order_captured_by_the_step_is_recorded_unmarked(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    async def handler(ctx: EffectContext, ev: Event) -> None:
        await capture_order(ctx, paypal(http, fake_url), "7XP12345AB678901C")

    row, recorded = await run_job(pool, "order:93", handler)
    assert row["state"] == "succeeded"
    result = recorded["capture"]
    assert result["status"] == "COMPLETED" and "recovered" not in result
    assert result["purchase_units"][0]["payments"]["captures"][0]["status"] == "COMPLETED"
    assert (await stats(http, fake_url))["paypal_order_captures"] == {"7XP12345AB678901C": 1}


async def test_an_order_whose_capture_is_held_fails_a_second_capture_naming_it(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    """PayPal completes the order but holds its capture for review (`PENDING`): the money is not taken, so
    `ORDER_ALREADY_CAPTURED` is not success; the job fails with PayPal's code and the capture's state."""
    assert (await http.post(f"{fake_url}/_fake/orders/8HL00000AB000000X/hold")).status_code == 200
    path = "/v2/checkout/orders/8HL00000AB000000X/capture"
    await paypal(http, fake_url).request("POST", path, json={}, idempotency_key="other-approval")

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await capture_order(ctx, paypal(http, fake_url), "8HL00000AB000000X")

    row, recorded = await run_job(pool, "order:94", handler)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert recorded["capture"]["code"] == "ORDER_ALREADY_CAPTURED"
    assert "COMPLETED with captures ['PENDING'], none completed" in recorded["capture"]["message"]
    assert (await stats(http, fake_url))["paypal_order_captures"] == {"8HL00000AB000000X": 1}


async def test_a_voided_authorization_fails_the_capture_naming_its_state(
    pool: db.Pool, http: httpx.AsyncClient, fake_url: str
) -> None:
    """Voided is terminal, but not captured: PayPal answers 422 `AUTHORIZATION_VOIDED`
    (https://developer.paypal.com/api/payments/v2/errors/authorization_voided) and the job fails with it."""
    voided = await http.post(
        f"{fake_url}/v2/payments/authorizations/AUTH91/void", headers={"Authorization": "Bearer A21AA_token"}
    )
    assert voided.status_code == 204

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await capture_authorization(ctx, paypal(http, fake_url), "AUTH91")

    row, recorded = await run_job(pool, "order:91", handler)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert recorded["capture"]["code"] == "AUTHORIZATION_VOIDED"
    assert "voided authorization cannot be captured" in recorded["capture"]["message"]
    assert (await stats(http, fake_url))["paypal_captures"] == {}
