"""PayPal (REST v2) captures over documented HTTP, as recorded steps with `PayPal-Request-Id`.

PayPal's idempotency header is `PayPal-Request-Id`: "when you include a previously specified
PayPal-Request-Id header in a request, PayPal returns the latest status of the previous request that used
that same header", and without it "PayPal duplicates the request"
(https://developer.paypal.com/reference/guidelines/idempotency). How long PayPal keeps an id differs per
API. The client is a `[downstream.NAME]`:

    [downstream.paypal]
    base_url = "https://api-m.paypal.com"
    api_key_env = "PAYPAL_ACCESS_TOKEN"
    idempotency_header = "PayPal-Request-Id"

What already happened counts as done (`already_done`): PayPal's documented answer to a second capture is a
422 whose `details[0].issue` is `AUTHORIZATION_ALREADY_CAPTURED`
(https://developer.paypal.com/api/payments/v2/errors/authorization_already_captured); the step then reads
the authorization (`GET /v2/payments/authorizations/{id}`) and records it if it is `CAPTURED`. The Orders
API's answer to a second capture of an order is a 422 `ORDER_ALREADY_CAPTURED`
(https://developer.paypal.com/docs/api/orders/v2/#error-ORDER_ALREADY_CAPTURED); `capture_order` then reads
the order (`GET /v2/checkout/orders/{id}`) and records it if it holds a `COMPLETED` capture.

`api_key` is sent as a bearer token: an OAuth access token, which PayPal issues for hours, not forever;
refreshing it is not done here.
"""

from __future__ import annotations

import re
from typing import Any

from effectgate.handlers.context import EffectContext
from effectgate.handlers.downstream import DownstreamClient
from effectgate.handlers.errors import TerminalError
from effectgate.handlers.providers.already_done import ALREADY_CAPTURED, recovered

__all__ = ["IDEMPOTENCY_HEADER", "capture_authorization", "capture_order"]

IDEMPOTENCY_HEADER = "PayPal-Request-Id"
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


async def capture_authorization(
    ctx: EffectContext,
    paypal: DownstreamClient,
    authorization_id: str,
    *,
    amount: dict[str, str] | None = None,
    final_capture: bool = True,
    step: str = "capture",
) -> dict[str, Any]:
    """Capture an authorized payment once per (effect, `step`); returns PayPal's capture (`id`, `status`).

    `amount` is PayPal's money object (`{"currency_code": "EUR", "value": "10.00"}`); without it the whole
    authorized amount is captured.

    An authorization captured already (in PayPal's dashboard, or by this step's own call once PayPal no
    longer remembers its `PayPal-Request-Id`) is refused with a 422 `AUTHORIZATION_ALREADY_CAPTURED`. The
    step then shows the authorization: `CAPTURED` is its outcome — the *authorization*, not a capture, with
    `recovered: "already_captured"`. Any other status is a `TerminalError` naming it; a voided
    authorization is refused as `AUTHORIZATION_VOIDED`, a `TerminalError` with that code.
    """
    _check(paypal)
    if not _ID.fullmatch(authorization_id):
        raise ValueError(f"authorization_id must be PayPal's id (letters, digits), got {authorization_id!r}")
    body: dict[str, Any] = {"final_capture": final_capture}
    if amount is not None:
        body["amount"] = dict(amount)
    path = f"/v2/payments/authorizations/{authorization_id}"

    async def capture(key: str) -> dict[str, Any]:
        try:
            return await paypal.request("POST", f"{path}/capture", json=body, idempotency_key=key)
        except TerminalError as refused:
            if refused.code != "AUTHORIZATION_ALREADY_CAPTURED":
                raise
            authorization = await paypal.request("GET", path)
            status = authorization.get("status")
            if status != "CAPTURED":
                message = f"paypal: authorization {authorization_id} is {status}, not captured in full"
                raise TerminalError(message, code=refused.code) from refused
            return recovered(authorization, ALREADY_CAPTURED)

    return await ctx.step(step, capture)


async def capture_order(
    ctx: EffectContext,
    paypal: DownstreamClient,
    order_id: str,
    *,
    step: str = "capture",
) -> dict[str, Any]:
    """Capture an approved PayPal order (Orders v2, `intent: CAPTURE`) once per (effect, `step`).

    Returns PayPal's answer to the capture: the order, `COMPLETED`, its capture under
    `purchase_units[0].payments.captures` (https://developer.paypal.com/docs/api/orders/v2/#orders_capture).

    An order captured already (by another approval's capture, or by this step's own call once PayPal no
    longer remembers its `PayPal-Request-Id`) is refused with a 422 `ORDER_ALREADY_CAPTURED`. The step then
    shows the order: one holding a `COMPLETED` capture is its outcome — the order as PayPal shows it, the
    same shape a capture answers, with `recovered: "already_captured"`. An order without one (its capture
    `PENDING` or `DECLINED`) is a `TerminalError` naming the order's status and its captures' statuses.
    """
    _check(paypal)
    if not _ID.fullmatch(order_id):
        raise ValueError(f"order_id must be PayPal's id (letters, digits), got {order_id!r}")
    path = f"/v2/checkout/orders/{order_id}"

    async def capture(key: str) -> dict[str, Any]:
        try:
            return await paypal.request("POST", f"{path}/capture", json={}, idempotency_key=key)
        except TerminalError as refused:
            if refused.code != "ORDER_ALREADY_CAPTURED":
                raise
            order = await paypal.request("GET", path)
            statuses = [capture.get("status") for capture in _captures(order)]
            if "COMPLETED" not in statuses:
                message = (
                    f"paypal: order {order_id} is {order.get('status')} with captures {statuses}, "
                    "none completed"
                )
                raise TerminalError(message, code=refused.code) from refused
            return recovered(order, ALREADY_CAPTURED)

    return await ctx.step(step, capture)


def _captures(order: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        capture
        for unit in order.get("purchase_units") or []
        for capture in (unit.get("payments") or {}).get("captures") or []
    ]


def _check(paypal: DownstreamClient) -> None:
    # The key must travel in PayPal's own header; in any other header PayPal would capture again on a retry.
    if paypal.config.idempotency_header != IDEMPOTENCY_HEADER:
        raise ValueError(
            f"[downstream.{paypal.name}] must set idempotency_header = {IDEMPOTENCY_HEADER!r} for PayPal, "
            f"not {paypal.config.idempotency_header!r}"
        )
