"""A fake Shopify GraphQL Admin API: an order's fulfillment orders, its fulfillments, `fulfillmentCreate`.

`POST /admin/api/{version}/graphql.json` with `{"query", "variables"}` and `X-Shopify-Access-Token` answers
the three operations `effectgate.handlers.providers.shopify` sends, in Shopify's shapes (`data`, `userErrors`,
`extensions.cost`, global ids `gid://shopify/...`). The operation is told apart by the root field it selects
(`fulfillmentCreate`, `order { fulfillmentOrders }`, `order { fulfillments }`); this is not a GraphQL server.

Like Shopify, `fulfillmentCreate` takes no idempotency key (only some mutations accept `@idempotent`): every
call on an OPEN fulfillment order makes a fulfillment, and the order then CLOSED refuses another with a
`userErrors` entry. An unknown order is created on first sight, with one OPEN fulfillment order of one line.

Control endpoints: `GET /_fake/stats` (fulfillments, per order), `POST /_fake/reset`, and
`POST /_fake/hold {"hold": true|false}`: while set, `fulfillmentCreate` makes its fulfillment and then does
not answer until the client goes away or the hold is lifted (the crash window, as in `fake_easypost`);
`POST /_fake/outage {"outage": true|false}`: while set, every GraphQL request is answered 503;
`POST /_fake/orders/cancel {"id": gid}`: the order cancelled, as in the admin: `cancelledAt` set and no
fulfillment order left `OPEN`.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .easypost import hold_answer

__all__ = ["create_app", "serve"]

_COST = {
    "requestedQueryCost": 10,
    "actualQueryCost": 10,
    "throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 1990, "restoreRate": 100.0},
}


class _FakeShopify:
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.orders: dict[str, dict[str, Any]] = {}
        self.fulfillment_orders: dict[str, dict[str, Any]] = {}
        self.fulfillments_by_order: dict[str, int] = {}
        self.fulfillments = 0
        self.next_id = 1000
        self.hold = False
        self.outage = False
        self.released = asyncio.Event()

    def _gid(self, kind: str) -> str:
        self.next_id += 1
        return f"gid://shopify/{kind}/{self.next_id}"

    def _order(self, gid: str) -> dict[str, Any]:
        order = self.orders.get(gid)
        if order is None:
            fo = {"id": self._gid("FulfillmentOrder"), "status": "OPEN", "order": gid}
            self.fulfillment_orders[fo["id"]] = fo
            order = self.orders[gid] = {
                "id": gid,
                "cancelledAt": None,
                "fulfillment_orders": [fo["id"]],
                "fulfillments": [],
            }
        return order

    async def graphql(self, request: Request) -> Response:
        if self.outage:
            return JSONResponse({"errors": "Service Unavailable"}, status_code=503)
        if not request.headers.get("x-shopify-access-token"):
            # Shopify answers a missing or wrong token with 401 and a plain `errors` string.
            return JSONResponse(
                {"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"},
                status_code=401,
            )
        try:
            body = json.loads(await request.body())
            query, variables = body["query"], body.get("variables") or {}
            if not isinstance(query, str) or not isinstance(variables, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"errors": [{"message": "Invalid JSON in request body"}]}, status_code=400)
        if re.search(r"\bfulfillmentCreate\s*\(", query):
            return await self._fulfillment_create(request, variables)
        order_id = variables.get("id")
        if not isinstance(order_id, str) or not order_id.startswith("gid://shopify/Order/"):
            return _answer({"order": None})
        order = self._order(order_id)
        if re.search(r"\bfulfillmentOrders\b", query):
            nodes = [self.fulfillment_orders[f] for f in order["fulfillment_orders"]]
            found = {"id": order_id, "cancelledAt": order["cancelledAt"]}
            return _answer({"order": {**found, "fulfillmentOrders": {"nodes": [_fo(n) for n in nodes]}}})
        if re.search(r"\bfulfillments\b", query):
            return _answer({"order": {"id": order_id, "fulfillments": order["fulfillments"]}})
        return JSONResponse({"errors": [{"message": "unsupported operation in the fake"}]}, status_code=200)

    async def _fulfillment_create(self, request: Request, variables: dict[str, Any]) -> Response:
        fulfillment = variables.get("fulfillment") or {}
        pairs = fulfillment.get("lineItemsByFulfillmentOrder") or []
        user_errors = []
        fos: list[dict[str, Any]] = []
        for pair in pairs:
            fo = self.fulfillment_orders.get(pair.get("fulfillmentOrderId"))
            if fo is None:
                user_errors.append({"field": ["fulfillment"], "message": "Fulfillment order does not exist."})
            elif fo["status"] != "OPEN":
                number, status = fo["id"].rsplit("/", 1)[1], fo["status"].lower()
                message = f"Fulfillment order {number} has an unfulfillable status= {status}."
                user_errors.append({"field": ["fulfillment"], "message": message})
            else:
                fos.append(fo)
        if not pairs:
            user_errors.append(
                {"field": ["fulfillment"], "message": "lineItemsByFulfillmentOrder is required"}
            )
        if user_errors:
            return _answer({"fulfillmentCreate": {"fulfillment": None, "userErrors": user_errors}})
        tracking = fulfillment.get("trackingInfo") or {}
        created = {
            "id": self._gid("Fulfillment"),
            "status": "SUCCESS",
            "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "trackingInfo": [
                {
                    "number": tracking.get("number"),
                    "company": tracking.get("company"),
                    "url": tracking.get("url"),
                }
            ],
        }
        order_id = fos[0]["order"]
        for fo in fos:
            fo["status"] = "CLOSED"
        self.orders[order_id]["fulfillments"].append(created)
        self.fulfillments += 1
        self.fulfillments_by_order[order_id] = self.fulfillments_by_order.get(order_id, 0) + 1
        if self.hold:
            await hold_answer(request, self.released)
        return _answer({"fulfillmentCreate": {"fulfillment": created, "userErrors": []}})

    async def stats(self, request: Request) -> Response:
        return JSONResponse(
            {
                "fulfillments": self.fulfillments,
                "fulfillments_by_order": self.fulfillments_by_order,
                "hold": self.hold,
            }
        )

    async def set_hold(self, request: Request) -> Response:
        self.hold = bool((await request.json()).get("hold"))
        if not self.hold:
            self.released.set()
            self.released = asyncio.Event()
        return JSONResponse({"hold": self.hold})

    async def set_outage(self, request: Request) -> Response:
        self.outage = bool((await request.json()).get("outage"))
        return JSONResponse({"outage": self.outage})

    async def cancel_order(self, request: Request) -> Response:
        order = self._order(str((await request.json()).get("id")))
        order["cancelledAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for fo_id in order["fulfillment_orders"]:
            if self.fulfillment_orders[fo_id]["status"] == "OPEN":
                self.fulfillment_orders[fo_id]["status"] = "CLOSED"
        return JSONResponse({"id": order["id"], "cancelledAt": order["cancelledAt"]})

    async def reset(self, request: Request) -> Response:
        self.released.set()
        self._clear()
        return JSONResponse({"reset": True})


def create_app() -> Starlette:
    """A fresh fake Shopify Admin API; all its state lives in this app."""
    fake = _FakeShopify()
    return Starlette(
        routes=[
            Route("/admin/api/{version}/graphql.json", fake.graphql, methods=["POST"]),
            Route("/_fake/stats", fake.stats, methods=["GET"]),
            Route("/_fake/hold", fake.set_hold, methods=["POST"]),
            Route("/_fake/outage", fake.set_outage, methods=["POST"]),
            Route("/_fake/orders/cancel", fake.cancel_order, methods=["POST"]),
            Route("/_fake/reset", fake.reset, methods=["POST"]),
        ]
    )


def serve(host: str, port: int) -> None:
    """Run a fresh fake Shopify with uvicorn on `host:port` until the process is stopped."""
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)


def _fo(fo: dict[str, Any]) -> dict[str, Any]:
    return {"id": fo["id"], "status": fo["status"]}


def _answer(data: dict[str, Any]) -> Response:
    return JSONResponse({"data": data, "extensions": {"cost": _COST}})
