"""Shopify fulfilment through the GraphQL Admin API (`fulfillmentCreate`), as a recorded step with `find`.

`fulfillmentCreate` takes no idempotency key (Shopify's `@idempotent` directive covers some mutations, such
as refunds and inventory changes, not this one), so a call that reached Shopify and whose answer was lost
would fulfil again on the next attempt. The step therefore runs with `find=`: what it creates carries a
stamp that can be read back, and an attempt that finds the step started but unrecorded looks first.

The stamp is the fulfillment's tracking number. `FulfillmentInput` has no reference, tag or metafield of
its own, but `trackingInfo.number` is stored on the fulfillment and listed by `order { fulfillments {
trackingInfo { number } } }`. The tracking number comes from a label step recorded *before* this one (see
`handlers.providers.easypost`), so it is the same on every attempt: a deterministic stamp, like the key.

The client is a `[downstream.NAME]` of the configuration reached by `ctx.downstream(NAME)`:

    [downstream.shopify]
    base_url = "https://SHOP.myshopify.com/admin/api/2025-01"
    auth_scheme = "X-Shopify-Access-Token"
    api_key_env = "SHOPIFY_ACCESS_TOKEN"
    idempotency_header = false

What already happened counts as done (`already_done`). Shopify's answer to an order fulfilled already — in
the admin, by another app — is that it has no `OPEN` fulfillment order left: they are `CLOSED`, "completed
and closed" (https://shopify.dev/docs/api/admin-graphql/latest/enums/FulfillmentOrderStatus). The step then
reads the order's fulfillments and records a `SUCCESS` one — the one carrying its tracking number if there
is one, else the latest — with `recovered: "already_fulfilled"`. A cancelled order (`cancelledAt` set),
fulfillment orders none of which is `CLOSED` or some of which are still `ON_HOLD`, `SCHEDULED`, … , or
closed ones with no successful fulfillment are a `TerminalError` naming the state.

GraphQL answers 200 for most failures; they are classified here: a top-level `THROTTLED` error is transient
(Shopify's leaky bucket refills), other top-level errors and any `userErrors` are terminal.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers.context import EffectContext
from effectgate.handlers.downstream import DownstreamClient
from effectgate.handlers.errors import TerminalError, TransientError
from effectgate.handlers.providers.already_done import ALREADY_FULFILLED, recovered

__all__ = ["fulfil_order", "graphql"]

_GRAPHQL_PATH = "/graphql.json"

_OPEN_FULFILLMENT_ORDERS = """
query OpenFulfillmentOrders($id: ID!) {
  order(id: $id) { id cancelledAt fulfillmentOrders(first: 50) { nodes { id status } } }
}
"""

_ORDER_FULFILLMENTS = """
query OrderFulfillments($id: ID!) {
  order(id: $id) { id fulfillments(first: 50) { id status createdAt trackingInfo { number company url } } }
}
"""

_FULFILLMENT_CREATE = """
mutation FulfillmentCreate($fulfillment: FulfillmentInput!) {
  fulfillmentCreate(fulfillment: $fulfillment) {
    fulfillment { id status createdAt trackingInfo { number company url } }
    userErrors { field message }
  }
}
"""


async def graphql(shopify: DownstreamClient, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    """Run one GraphQL operation and return its `data`, or raise the handler outcome of its errors."""
    answer = await shopify.request("POST", _GRAPHQL_PATH, json={"query": query, "variables": variables})
    errors = answer.get("errors")
    if errors:
        codes = [e.get("extensions", {}).get("code") for e in errors if isinstance(e, dict)]
        message = "; ".join(str(e.get("message")) for e in errors if isinstance(e, dict)) or str(errors)
        if "THROTTLED" in codes:
            raise TransientError(f"shopify: {message}", retry_after=1.0)
        raise TerminalError(f"shopify: {message}", code="graphql_error")
    data = answer.get("data")
    if not isinstance(data, dict):
        raise TransientError("shopify: an answer without data")
    return data


async def fulfil_order(
    ctx: EffectContext,
    shopify: DownstreamClient,
    *,
    order_id: str,
    tracking_number: str,
    tracking_company: str | None = None,
    tracking_url: str | None = None,
    notify_customer: bool = False,
    step: str = "fulfil",
) -> dict[str, Any]:
    """Fulfil every open fulfillment order of `order_id` (a `gid://shopify/Order/…`) once, with tracking.

    Returns the fulfillment (`id`, `status`, `trackingInfo`). An attempt after a lost answer finds the
    fulfillment by `tracking_number` instead of creating a second one; so `tracking_number` must be the same
    on every attempt — take it from a recorded step.
    """
    if not order_id.startswith("gid://shopify/Order/"):
        raise ValueError(f"order_id must be a Shopify global id (gid://shopify/Order/…), got {order_id!r}")
    if not tracking_number:
        raise ValueError("tracking_number is the stamp find looks for; it must not be empty")

    async def create(_key: str) -> dict[str, Any]:
        data = await graphql(shopify, _OPEN_FULFILLMENT_ORDERS, {"id": order_id})
        order = data.get("order")
        if order is None:
            raise TerminalError(f"shopify: no order {order_id}", code="order_not_found")
        nodes = order["fulfillmentOrders"]["nodes"]
        open_ids = [n["id"] for n in nodes if n["status"] == "OPEN"]
        if not open_ids:
            return await fulfilled_already(order, sorted({n["status"] for n in nodes}))
        tracking = {"number": tracking_number, "company": tracking_company, "url": tracking_url}
        fulfillment = {
            "lineItemsByFulfillmentOrder": [{"fulfillmentOrderId": i} for i in open_ids],
            "notifyCustomer": notify_customer,
            "trackingInfo": {k: v for k, v in tracking.items() if v is not None},
        }
        created = (await graphql(shopify, _FULFILLMENT_CREATE, {"fulfillment": fulfillment}))[
            "fulfillmentCreate"
        ]
        if created["userErrors"]:
            message = "; ".join(e["message"] for e in created["userErrors"])
            raise TerminalError(f"shopify fulfillmentCreate: {message}", code="user_errors")
        result: dict[str, Any] = created["fulfillment"]
        return result

    async def fulfilled_already(order: dict[str, Any], statuses: list[str]) -> dict[str, Any]:
        where = f"shopify: order {order_id}"
        if order.get("cancelledAt"):
            message = f"{where} was cancelled at {order['cancelledAt']}, not fulfilled"
            raise TerminalError(message, code="order_cancelled")
        # A cancelled fulfillment order beside a closed one is Shopify's replacement after a cancel: the
        # closed one was fulfilled. Any other state (ON_HOLD, SCHEDULED, IN_PROGRESS, …) is not an ending.
        if "CLOSED" not in statuses or not set(statuses) <= {"CLOSED", "CANCELLED"}:
            shown = ", ".join(statuses) or "none"
            message = f"{where} has no open fulfillment order (fulfillment orders: {shown})"
            raise TerminalError(message, code="nothing_open")
        fulfilled = (await graphql(shopify, _ORDER_FULFILLMENTS, {"id": order_id})).get("order") or {}
        done = [f for f in fulfilled.get("fulfillments") or [] if f.get("status") == "SUCCESS"]
        if not done:
            message = f"{where} has its fulfillment orders CLOSED but no successful fulfillment"
            raise TerminalError(message, code="nothing_open")
        ours = [f for f in done if tracking_number in _numbers(f)]
        latest = max(ours or done, key=lambda f: str(f.get("createdAt") or ""))
        return recovered(latest, ALREADY_FULFILLED)

    async def find(_key: str) -> dict[str, Any] | None:
        order = (await graphql(shopify, _ORDER_FULFILLMENTS, {"id": order_id})).get("order") or {}
        for fulfillment in order.get("fulfillments") or []:
            if tracking_number in _numbers(fulfillment) and fulfillment.get("status") != "CANCELLED":
                found: dict[str, Any] = fulfillment
                return found
        return None

    return await ctx.step(step, create, find=find)


def _numbers(fulfillment: dict[str, Any]) -> set[Any]:
    return {t.get("number") for t in fulfillment.get("trackingInfo") or []}
