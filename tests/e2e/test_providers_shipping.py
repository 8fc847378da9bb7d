"""EasyPost's SDK and Shopify's GraphQL Admin API inside recorded steps, against fakes with no idempotency.

Neither `POST /v2/shipments` (EasyPost) nor `fulfillmentCreate` (Shopify) takes an idempotency key, so each
step runs with `find=`. The lost answer is real: the fake performs the effect and then holds its answer
until the client's own timeout gives up, so the worker sees a transient error for a label that was bought.
The retry must find that label (by `reference`, which EasyPost lets stand in for the id:
https://docs.easypost.com/docs/easypost-objects) and that fulfillment (by its tracking number), not make
a second one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig
from effectgate.handlers.idempotency import idempotency_key
from effectgate.handlers.providers.easypost import buy_label, easypost_client
from effectgate.handlers.providers.shopify import (
    _FULFILLMENT_CREATE,
    _OPEN_FULFILLMENT_ORDERS,
    fulfil_order,
    graphql,
)
from effectgate.ledger import db, jobs
from tests.integration.jobs_and_workers import claim, kind, make_worker, registry, run_job

from .fake_servers import serving

pytestmark = pytest.mark.anyio

ADDRESS = {"name": "Ada", "street1": "1 Main St", "city": "Berlin", "zip": "10115", "country": "DE"}
ORDER = "gid://shopify/Order/5001"


@pytest.fixture(scope="module")
def easypost_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving("easypost", tmp_path_factory.mktemp("fake_easypost")) as url:
        yield url


@pytest.fixture(scope="module")
def shopify_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving("shopify", tmp_path_factory.mktemp("fake_shopify")) as url:
        yield url


@pytest.fixture
async def fakes(easypost_url: str, shopify_url: str) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    async with httpx.AsyncClient(base_url=easypost_url) as ep, httpx.AsyncClient(base_url=shopify_url) as sh:
        for c in (ep, sh):
            assert (await c.post("/_fake/reset")).status_code == 200
        yield {"easypost": ep, "shopify": sh}
        for c in (ep, sh):
            await c.post("/_fake/hold", json={"hold": False})


async def ship_twice_lost(
    pool: db.Pool,
    fakes: dict[str, httpx.AsyncClient],
    easypost_url: str,
    shopify_url: str,
    *,
    lose: str | None,
) -> tuple[int, list[dict[str, Any]]]:
    """Run one order's label + fulfilment; `lose` names the fake whose first answer never arrives."""
    client = easypost_client("EZTK_test", base_url=easypost_url, timeout=1)
    async with httpx.AsyncClient() as http:
        shopify = DownstreamClient(
            "shopify",
            http,
            DownstreamConfig(
                f"{shopify_url}/admin/api/2025-01",
                "shpat_test",
                timeout=1,
                auth_scheme="X-Shopify-Access-Token",
                idempotency_header=None,
            ),
        )
        results: list[dict[str, Any]] = []

        async def handler(ctx: EffectContext, ev: Event) -> None:
            if lose is not None and ctx.attempt == 1:
                await fakes[lose].post("/_fake/hold", json={"hold": True})
            elif lose is not None:
                await fakes[lose].post("/_fake/hold", json={"hold": False})
            label = await buy_label(
                ctx,
                client,
                to_address=ADDRESS,
                from_address=ADDRESS,
                parcel={"weight": 10.0},
                service="Priority",
                carrier_accounts=["ca_test"],
            )
            fulfilment = await fulfil_order(
                ctx, shopify, order_id=ORDER, tracking_number=label["tracking_code"], tracking_company="USPS"
            )
            results.append({"label": label, "fulfilment": fulfilment})

        async with pool.connection() as conn:
            job_id = await claim(conn, "ship:5001", max_attempts=3)
        await make_worker(pool, registry(kind(handler))).run_until_idle()
        async with pool.connection() as conn:
            row = await jobs.get(conn, job_id) or {}
            assert row["state"] == "succeeded", [
                a["error_message"] for a in await jobs.attempts(conn, job_id)
            ]
            return row["attempt"], results


async def test_a_label_and_a_fulfilment_once_each_with_the_key_as_reference(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], easypost_url: str, shopify_url: str
) -> None:
    attempts, [result] = await ship_twice_lost(pool, fakes, easypost_url, shopify_url, lose=None)
    assert attempts == 1
    assert result["label"]["reference"] == idempotency_key("default", "ship:5001", "label")
    assert result["fulfilment"]["trackingInfo"][0]["number"] == result["label"]["tracking_code"]
    assert (await fakes["easypost"].get("/_fake/stats")).json()["labels"] == 1
    assert (await fakes["shopify"].get("/_fake/stats")).json()["fulfillments"] == 1


@pytest.mark.parametrize("lose", ["easypost", "shopify"])
async def test_a_lost_answer_is_found_on_the_retry_not_made_again(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], easypost_url: str, shopify_url: str, lose: str
) -> None:
    attempts, [result] = await ship_twice_lost(pool, fakes, easypost_url, shopify_url, lose=lose)
    assert attempts == 2  # the first ended with the client's timeout, after the fake had acted
    assert (await fakes["easypost"].get("/_fake/stats")).json()["labels"] == 1
    assert (await fakes["shopify"].get("/_fake/stats")).json()["fulfillments"] == 1
    assert result["fulfilment"]["trackingInfo"][0]["number"] == result["label"]["tracking_code"]


# -- what already happened counts as done --------------------------------------------------------------


def shopify_client(http: httpx.AsyncClient, shopify_url: str) -> DownstreamClient:
    config = DownstreamConfig(
        f"{shopify_url}/admin/api/2025-01",
        "shpat_test",
        auth_scheme="X-Shopify-Access-Token",
        idempotency_header=None,
    )
    return DownstreamClient("shopify", http, config)


def buy_by_hand(easypost_url: str, reference: str) -> dict[str, Any]:
    """A label bought outside effectgate (EasyPost's dashboard, another process) with `reference`."""
    client = easypost_client("EZTK_test", base_url=easypost_url)
    shipment = client.shipment.create(
        to_address=ADDRESS,
        from_address=ADDRESS,
        parcel={"weight": 10.0},
        service="Priority",
        carrier_accounts=["ca_test"],
        reference=reference,
    )
    bought: dict[str, Any] = shipment.to_dict()
    return bought


async def label_step(ctx: EffectContext, easypost_url: str) -> dict[str, Any]:
    client = easypost_client("EZTK_test", base_url=easypost_url)
    return await buy_label(
        ctx,
        client,
        to_address=ADDRESS,
        from_address=ADDRESS,
        parcel={"weight": 10.0},
        service="Priority",
        carrier_accounts=["ca_test"],
    )


async def test_a_label_bought_with_the_steps_reference_is_the_steps_outcome(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], easypost_url: str
) -> None:
    """EasyPost has no "already bought" answer (a second create buys a second label), so the step looks
    its reference up first; EasyPost lets a reference stand in for the id
    (https://docs.easypost.com/docs/easypost-objects). A bought label found there is recorded, marked."""
    bought = buy_by_hand(easypost_url, idempotency_key("default", "label:93", "label"))

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await label_step(ctx, easypost_url)

    row, recorded = await run_job(pool, "label:93", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["label"]
    assert (result["id"], result["tracking_code"]) == (bought["id"], bought["tracking_code"])
    assert result["recovered"] == "already_bought"
    assert (await fakes["easypost"].get("/_fake/stats")).json()["labels"] == 1


async def test_a_refunded_label_fails_the_step_naming_its_refund_status(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], easypost_url: str
) -> None:
    """A label returned for a refund (`refund_status`, https://docs.easypost.com/docs/shipments) is not
    the label the step wanted, and buying another behind the refund's back is not the step's to decide."""
    bought = buy_by_hand(easypost_url, idempotency_key("default", "label:94", "label"))
    refund = await fakes["easypost"].post(
        f"/v2/shipments/{bought['id']}/refund", headers={"Authorization": "Bearer EZTK_test"}
    )
    assert refund.json()["refund_status"] == "submitted"

    async def handler(ctx: EffectContext, ev: Event) -> None:
        await label_step(ctx, easypost_url)

    row, recorded = await run_job(pool, "label:94", handler)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert recorded["label"]["code"] == "label_refunded"
    assert "refund_status submitted" in recorded["label"]["message"]
    assert (await fakes["easypost"].get("/_fake/stats")).json()["labels"] == 1


async def test_an_order_fulfilled_in_the_admin_is_the_steps_outcome(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], shopify_url: str
) -> None:
    """Fulfilled elsewhere first: the order has no OPEN fulfillment order left, only CLOSED ones,
    "completed and closed" (https://shopify.dev/docs/api/admin-graphql/latest/enums/FulfillmentOrderStatus).
    The step records the order's successful fulfillment, marked."""
    order = "gid://shopify/Order/5095"
    async with httpx.AsyncClient() as http:
        shopify = shopify_client(http, shopify_url)
        admin = await graphql(shopify, _OPEN_FULFILLMENT_ORDERS, {"id": order})
        [fo] = admin["order"]["fulfillmentOrders"]["nodes"]
        made = await graphql(
            shopify,
            _FULFILLMENT_CREATE,
            {
                "fulfillment": {
                    "lineItemsByFulfillmentOrder": [{"fulfillmentOrderId": fo["id"]}],
                    "trackingInfo": {"number": "ADMIN-1"},
                }
            },
        )

        async def handler(ctx: EffectContext, ev: Event) -> None:
            await fulfil_order(ctx, shopify, order_id=order, tracking_number="9400111")

        row, recorded = await run_job(pool, "ship:5095", handler)
    assert row["state"] == "succeeded" and row["attempt"] == 1
    result = recorded["fulfil"]
    assert result["id"] == made["fulfillmentCreate"]["fulfillment"]["id"]
    assert (result["trackingInfo"][0]["number"], result["status"]) == ("ADMIN-1", "SUCCESS")
    assert result["recovered"] == "already_fulfilled"
    assert (await fakes["shopify"].get("/_fake/stats")).json()["fulfillments"] == 1


async def test_a_cancelled_order_fails_the_step_naming_it(
    pool: db.Pool, fakes: dict[str, httpx.AsyncClient], shopify_url: str
) -> None:
    """Cancelled is terminal too (`Order.cancelledAt`), but not fulfilled: the job fails, saying so."""
    order = "gid://shopify/Order/5096"
    assert (await fakes["shopify"].post("/_fake/orders/cancel", json={"id": order})).status_code == 200
    async with httpx.AsyncClient() as http:
        shopify = shopify_client(http, shopify_url)

        async def handler(ctx: EffectContext, ev: Event) -> None:
            await fulfil_order(ctx, shopify, order_id=order, tracking_number="9400112")

        row, recorded = await run_job(pool, "ship:5096", handler)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert recorded["fulfil"]["code"] == "order_cancelled"
    assert f"order {order} was cancelled at" in recorded["fulfil"]["message"]
    assert (await fakes["shopify"].get("/_fake/stats")).json()["fulfillments"] == 0
