"""How Shopify's GraphQL answers and EasyPost's SDK errors map onto the handler outcomes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from easypost.errors.api.http_error import HttpError
from easypost.errors.api.invalid_request_error import InvalidRequestError
from easypost.errors.api.rate_limit_error import RateLimitError
from easypost.errors.api.service_unavailable_error import ServiceUnavailableError

from effectgate.handlers import TerminalError, TransientError
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig
from effectgate.handlers.providers.easypost import outcome_of
from effectgate.handlers.providers.shopify import graphql

pytestmark = pytest.mark.anyio


async def answer(body: dict[str, Any]) -> dict[str, Any]:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    async with httpx.AsyncClient(transport=transport) as http:
        config = DownstreamConfig(
            "https://shop.example/admin/api/2025-01", "shpat", auth_scheme="X-Shopify-Access-Token"
        )
        return await graphql(DownstreamClient("shopify", http, config), "query { shop { id } }", {})


async def test_shopify_throttling_is_transient_and_other_graphql_errors_terminal() -> None:
    throttled = {"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}]}
    with pytest.raises(TransientError):
        await answer(throttled)
    with pytest.raises(TerminalError) as raised:
        await answer({"errors": [{"message": "Field 'nope' doesn't exist on type 'Shop'"}]})
    assert raised.value.code == "graphql_error"
    assert await answer({"data": {"shop": {"id": "gid://shopify/Shop/1"}}}) == {
        "shop": {"id": "gid://shopify/Shop/1"}
    }


@pytest.mark.parametrize(
    "error", [HttpError("reset"), RateLimitError("slow", http_status=429), ServiceUnavailableError("down")]
)
def test_easypost_blips_are_transient(error: Exception) -> None:
    assert type(outcome_of(error)) is TransientError  # type: ignore[arg-type]


def test_easypost_refusals_are_terminal_with_its_code() -> None:
    body = '{"error": {"code": "SHIPMENT.INVALID_PARAMS", "message": "Invalid parcel", "errors": []}}'
    error = outcome_of(InvalidRequestError("Invalid parcel", http_status=422, http_body=body))
    assert type(error) is TerminalError and error.code == "SHIPMENT.INVALID_PARAMS"
