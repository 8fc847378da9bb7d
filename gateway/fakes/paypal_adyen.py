"""Fakes of PayPal's and Adyen's capture endpoints, each with the provider's own idempotency header.

PayPal (REST v2): `POST /v2/payments/authorizations/{id}/capture`. A request carrying a `PayPal-Request-Id`
already used is answered with the result of the first request, not a second capture ("PayPal returns the
latest status of the previous request that used that same header", https://developer.paypal.com/reference/
guidelines/idempotency); without the header PayPal duplicates the request. An authorization is `CREATED` on
first sight, `CAPTURED` after a capture and `VOIDED` after `POST /v2/payments/authorizations/{id}/void`
(204); `GET /v2/payments/authorizations/{id}` shows it. As PayPal documents, a second capture of a captured
authorization is a 422 `AUTHORIZATION_ALREADY_CAPTURED`
(https://developer.paypal.com/api/payments/v2/errors/authorization_already_captured), a capture of a voided
one a 422 `AUTHORIZATION_VOIDED` (…/errors/authorization_voided), and a void of a captured one a 422
`PREVIOUSLY_CAPTURED` (…/errors/previously_captured).

PayPal Orders v2: `POST /v2/checkout/orders/{id}/capture`, with the same `PayPal-Request-Id` replay. An order is
`APPROVED` on first sight (the buyer approved it) and `COMPLETED` once captured; a capture answers the order
with its capture under `purchase_units[0].payments.captures`
(https://developer.paypal.com/docs/api/orders/v2/#orders_capture). A captured order refuses another capture
with a 422 `ORDER_ALREADY_CAPTURED`, an order not approved with a 422 `ORDER_NOT_APPROVED`
(https://developer.paypal.com/docs/api/orders/v2/#error-ORDER_ALREADY_CAPTURED). `POST
/_fake/orders/{id}/decline` makes the order's next capture fail as a declined card does, a 422
`INSTRUMENT_DECLINED` that leaves the order waiting for the buyer (`PAYER_ACTION_REQUIRED`); `POST
/_fake/orders/{id}/approve` is the buyer approving again on the same order, as PayPal's "handle funding
failures" has them do (https://developer.paypal.com/docs/checkout/standard/customize/handle-funding-failures/).
`POST /_fake/orders/{id}/hold` makes the order's next capture be held for review: the order `COMPLETED`, its
capture `PENDING` with `status_details.reason` `PENDING_REVIEW`, as the Orders API documents a capture PayPal
has not settled (https://developer.paypal.com/docs/api/orders/v2/#orders_capture, `captures[].status`).
`GET /v2/checkout/orders/{id}` shows an order.

Adyen (Checkout v71): `POST /v71/payments/{pspReference}/captures` with `X-API-Key`. A request whose
`Idempotency-Key` was used before is answered with the first request's answer
(https://docs.adyen.com/development-resources/api-idempotency); a capture is answered 201 with
`status: "received"` (Adyen confirms it later by webhook).

`GET /_fake/stats` counts captures per authorization / order / payment and replays; `POST /_fake/reset` clears it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["create_app", "serve"]


@dataclass
class _State:
    answers: dict[tuple[str, str], tuple[int, bytes]] = field(default_factory=dict)
    authorizations: dict[str, dict[str, Any]] = field(default_factory=dict)
    paypal_captures: dict[str, int] = field(default_factory=dict)
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    declining: set[str] = field(default_factory=set)
    holding: set[str] = field(default_factory=set)
    order_captures: dict[str, int] = field(default_factory=dict)
    adyen_captures: dict[str, int] = field(default_factory=dict)
    replays: int = 0
    keyless: int = 0


def create_app() -> Starlette:
    """A fresh fake of both providers; all its state lives in this app."""
    state = _State()

    def replayed(provider: str, key: str | None) -> Response | None:
        if key is None:
            state.keyless += 1
            return None
        stored = state.answers.get((provider, key))
        if stored is None:
            return None
        state.replays += 1
        return Response(stored[1], status_code=stored[0], media_type="application/json")

    def remember(provider: str, key: str | None, status: int, body: dict[str, Any]) -> Response:
        raw = json.dumps(body).encode()
        if key is not None:
            state.answers[(provider, key)] = (status, raw)
        return Response(raw, status_code=status, media_type="application/json")

    def authorization_of(request: Request) -> dict[str, Any]:
        # Unknown authorizations exist on first sight, so tests and demos need no setup call.
        auth_id = request.path_params["id"]
        found = state.authorizations.get(auth_id)
        if found is None:
            found = state.authorizations[auth_id] = {
                "id": auth_id,
                "status": "CREATED",
                "amount": {"currency_code": "USD", "value": "10.00"},
                "links": [
                    {
                        "rel": "self",
                        "method": "GET",
                        "href": f"{request.base_url}v2/payments/authorizations/{auth_id}",
                    }
                ],
            }
        return found

    async def paypal_capture(request: Request) -> Response:
        if (refused := _paypal_unauthorised(request)) is not None:
            return refused
        key = request.headers.get("paypal-request-id")
        if (again := replayed("paypal", key)) is not None:
            return again
        authorization = authorization_of(request)
        body = json.loads(await request.body() or b"{}")
        if authorization["status"] == "CAPTURED":
            issue = ("AUTHORIZATION_ALREADY_CAPTURED", "Authorization has already been captured.")
            return remember("paypal", key, 422, _unprocessable(*issue))
        if authorization["status"] == "VOIDED":
            issue = ("AUTHORIZATION_VOIDED", "A voided authorization cannot be captured or reauthorized.")
            return remember("paypal", key, 422, _unprocessable(*issue))
        # A capture with final_capture false leaves the authorization open for more (PARTIALLY_CAPTURED).
        final = body.get("final_capture", True) is not False
        authorization["status"] = "CAPTURED" if final else "PARTIALLY_CAPTURED"
        state.paypal_captures[authorization["id"]] = state.paypal_captures.get(authorization["id"], 0) + 1
        capture = {
            "id": secrets.token_hex(8).upper(),
            "status": "COMPLETED",
            "amount": body.get("amount") or {"currency_code": "USD", "value": "10.00"},
            "final_capture": body.get("final_capture", True),
            "links": [{"rel": "self", "method": "GET", "href": f"{request.base_url}v2/payments/captures/"}],
        }
        return remember("paypal", key, 201, capture)

    async def paypal_void(request: Request) -> Response:
        if (refused := _paypal_unauthorised(request)) is not None:
            return refused
        authorization = authorization_of(request)
        if authorization["status"] == "CAPTURED":
            issue = (
                "PREVIOUSLY_CAPTURED",
                "Authorization has been previously captured and hence cannot be voided.",
            )
            return JSONResponse(_unprocessable(*issue), 422)
        if authorization["status"] == "VOIDED":
            issue = (
                "PREVIOUSLY_VOIDED",
                "Authorization has been previously voided and hence cannot be voided again.",
            )
            return JSONResponse(_unprocessable(*issue), 422)
        authorization["status"] = "VOIDED"
        return Response(status_code=204)

    async def paypal_authorization(request: Request) -> Response:
        if (refused := _paypal_unauthorised(request)) is not None:
            return refused
        found = state.authorizations.get(request.path_params["id"])
        if found is None:
            error = {
                "name": "RESOURCE_NOT_FOUND",
                "message": "The specified resource does not exist.",
                "details": [
                    {"issue": "INVALID_RESOURCE_ID", "description": "Specified resource ID does not exist."}
                ],
            }
            return JSONResponse(error, 404)
        return JSONResponse(found)

    def order_of(request: Request) -> dict[str, Any]:
        # Unknown orders exist, approved, on first sight: the buyer's approval happens at PayPal, not here.
        order_id = request.path_params["id"]
        found = state.orders.get(order_id)
        if found is None:
            found = state.orders[order_id] = {
                "id": order_id,
                "intent": "CAPTURE",
                "status": "APPROVED",
                "purchase_units": [
                    {"reference_id": "default", "amount": {"currency_code": "USD", "value": "10.00"}}
                ],
                "links": [
                    {
                        "rel": "self",
                        "method": "GET",
                        "href": f"{request.base_url}v2/checkout/orders/{order_id}",
                    }
                ],
            }
        return found

    async def order_capture(request: Request) -> Response:
        if (refused := _paypal_unauthorised(request)) is not None:
            return refused
        key = request.headers.get("paypal-request-id")
        if (again := replayed("paypal", key)) is not None:
            return again
        order = order_of(request)
        if order["status"] == "COMPLETED":
            issue = (
                "ORDER_ALREADY_CAPTURED",
                "Order already captured. If 'intent=CAPTURE' only one capture per order is allowed.",
            )
            return remember("paypal", key, 422, _unprocessable(*issue))
        if order["status"] != "APPROVED":
            issue = ("ORDER_NOT_APPROVED", "Payer has not yet approved the Order for payment.")
            return remember("paypal", key, 422, _unprocessable(*issue))
        if order["id"] in state.declining:
            state.declining.discard(order["id"])
            order["status"] = "PAYER_ACTION_REQUIRED"
            issue = (
                "INSTRUMENT_DECLINED",
                "The instrument presented was either declined by the processor or bank.",
            )
            return remember("paypal", key, 422, _unprocessable(*issue))
        order["status"] = "COMPLETED"
        state.order_captures[order["id"]] = state.order_captures.get(order["id"], 0) + 1
        unit = order["purchase_units"][0]
        capture: dict[str, Any] = {
            "id": secrets.token_hex(8).upper(),
            "status": "COMPLETED",
            "amount": unit["amount"],
            "final_capture": True,
        }
        if order["id"] in state.holding:
            state.holding.discard(order["id"])
            capture.update(status="PENDING", status_details={"reason": "PENDING_REVIEW"})
        unit["payments"] = {"captures": [capture]}
        return remember("paypal", key, 201, order)

    async def order_show(request: Request) -> Response:
        if (refused := _paypal_unauthorised(request)) is not None:
            return refused
        found = state.orders.get(request.path_params["id"])
        if found is None:
            error = {
                "name": "RESOURCE_NOT_FOUND",
                "message": "The specified resource does not exist.",
                "details": [
                    {"issue": "INVALID_RESOURCE_ID", "description": "Specified resource ID does not exist."}
                ],
            }
            return JSONResponse(error, 404)
        return JSONResponse(found)

    async def order_decline(request: Request) -> Response:
        state.declining.add(order_of(request)["id"])
        return JSONResponse({"declining": request.path_params["id"]})

    async def order_hold(request: Request) -> Response:
        state.holding.add(order_of(request)["id"])
        return JSONResponse({"holding": request.path_params["id"]})

    async def order_approve(request: Request) -> Response:
        order = order_of(request)
        if order["status"] != "COMPLETED":
            order["status"] = "APPROVED"
        return JSONResponse(order)

    async def adyen_capture(request: Request) -> Response:
        if not request.headers.get("x-api-key"):
            return JSONResponse(
                {
                    "status": 401,
                    "errorCode": "000",
                    "message": "HTTP Status Response - Unauthorized",
                    "errorType": "security",
                },
                401,
            )
        key = request.headers.get("idempotency-key")
        if (again := replayed("adyen", key)) is not None:
            return again
        psp = request.path_params["psp"]
        body = json.loads(await request.body() or b"{}")
        if not body.get("merchantAccount") or not isinstance(body.get("amount"), dict):
            error = {
                "status": 422,
                "errorCode": "100",
                "message": "Required field 'amount' is not provided.",
                "errorType": "validation",
            }
            return JSONResponse(error, 422)
        state.adyen_captures[psp] = state.adyen_captures.get(psp, 0) + 1
        capture = {
            "merchantAccount": body["merchantAccount"],
            "paymentPspReference": psp,
            "pspReference": "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(16)),
            "reference": body.get("reference"),
            "status": "received",
            "amount": body["amount"],
        }
        return remember("adyen", key, 201, capture)

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                "paypal_captures": state.paypal_captures,
                "paypal_order_captures": state.order_captures,
                "adyen_captures": state.adyen_captures,
                "replays": state.replays,
                "requests_without_key": state.keyless,
            }
        )

    async def reset(request: Request) -> Response:
        nonlocal state
        state = _State()
        return JSONResponse({"reset": True})

    return Starlette(
        routes=[
            Route("/v2/payments/authorizations/{id}/capture", paypal_capture, methods=["POST"]),
            Route("/v2/payments/authorizations/{id}/void", paypal_void, methods=["POST"]),
            Route("/v2/payments/authorizations/{id}", paypal_authorization, methods=["GET"]),
            Route("/v2/checkout/orders/{id}/capture", order_capture, methods=["POST"]),
            Route("/v2/checkout/orders/{id}", order_show, methods=["GET"]),
            Route("/_fake/orders/{id}/decline", order_decline, methods=["POST"]),
            Route("/_fake/orders/{id}/approve", order_approve, methods=["POST"]),
            Route("/_fake/orders/{id}/hold", order_hold, methods=["POST"]),
            Route("/v71/payments/{psp}/captures", adyen_capture, methods=["POST"]),
            Route("/_fake/stats", stats, methods=["GET"]),
            Route("/_fake/reset", reset, methods=["POST"]),
        ]
    )


def _paypal_unauthorised(request: Request) -> Response | None:
    if request.headers.get("authorization", "").startswith("Bearer "):
        return None
    return JSONResponse({"error": "invalid_client", "error_description": "Client Authentication failed"}, 401)


def _unprocessable(issue: str, description: str) -> dict[str, Any]:
    """PayPal's 422: the class in `name`, what happened in `details[0].issue`."""
    return {
        "name": "UNPROCESSABLE_ENTITY",
        "message": "The requested action could not be performed, semantically incorrect, or failed business validation.",
        "debug_id": secrets.token_hex(6),
        "details": [{"issue": issue, "description": description}],
        "links": [
            {
                "href": f"https://developer.paypal.com/docs/api/payments/v2/#error-{issue}",
                "rel": "information_link",
                "method": "GET",
            }
        ],
    }


def serve(host: str, port: int) -> None:
    """Run a fresh fake with uvicorn on `host:port` until the process is stopped."""
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)
