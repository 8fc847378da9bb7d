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
from effectgate.handlers.providers.shopify import fulfil_order
from effectgate.ledger import db
from effectgate.ledger.jobs import leases as jobs
from tests.integration.jobs_fixtures import claim, kind, make_worker, pool, registry

from .fake_servers import serving

pytestmark = pytest.mark.anyio
__all__ = ["pool"]

ADDRESS = {"name": "Ada", "street1": "1 Main St", "city": "Berlin", "zip": "10115", "country": "DE"}
ORDER = "gid://shopify/Order/5001"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
