"""A fake payment and shipping provider that honours `Idempotency-Key` the way Stripe documents it.

Tests and demos point `PaymentsClient` and `ShippingClient` at it. It keeps real effects (captures, refunds,
shipments) apart from requests, so a test can assert that retries, reclaims and redrives produced exactly one
effect each, and it can inject the failures that make idempotency matter: a 500 before the effect, a hang,
and a connection dropped after the effect was performed.

Every endpoint is served through the idempotency layer (``idempotency``: what a key's first use, its replay,
its misuse and a validation error are answered), which also injects the faults.

Stripe's endpoints: `POST /v1/payment_intents/{id}/capture` (an unknown intent is created `requires_capture`),
`POST /v1/payment_intents/{id}/cancel`, `GET /v1/payment_intents/{id}`, `POST /v1/refunds`,
`GET /v1/refunds?payment_intent=…` and `POST /v1/transfers`, form-encoded, answering Stripe's object and
error shapes, so Stripe's own SDK can be pointed at the fake. As Stripe documents: a capture of an intent
that is not `requires_capture` is a 400 `payment_intent_unexpected_state`
(https://docs.stripe.com/api/payment_intents/capture); a refund of a charge refunded in full is a 400
`charge_already_refunded` (https://docs.stripe.com/error-codes); cancelling a `requires_capture` intent
refunds its `amount_capturable` (https://docs.stripe.com/api/payment_intents/cancel), so its charge then
counts as refunded.

Control endpoints: `POST /_fake/payment_intents` (an intent in a given status), `GET /_fake/stats`,
`POST /_fake/reset`, `GET|POST /_fake/faults`, and `GET /_fake/requests`:
the provider requests (method, path, the headers a test asserts on: `Idempotency-Key`, `traceparent`,
`tracestate`, and `at`, when it arrived), oldest first, at most the latest 1,000 (the layer keeps them).

The faults are `faults.py`, the answers' shapes `answers.py`, the idempotency layer `idempotency.py`. Why the
endpoints stay in one module (403 lines, `wc -l`): `_FakeProviders` is one state behind the layer's one
lock. The layer's claim (look up, then insert) and each endpoint's effect (check state, then change it) run
under that lock on the same keys, intents and counters, and `/_fake/reset` clears them all at once; split by
endpoint, that invariant would be spread over classes that must still share every field.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from .answers import (
    Answer,
    Invalid,
    amount_param,
    error_body,
    form_params,
    json_answer,
    metadata_of,
    new_intent,
)
from .faults import FaultConfig, FaultMode
from .idempotency import IdempotentFake

__all__ = ["FaultConfig", "FaultMode", "create_app", "serve"]

_INTENT_AMOUNT = 1000


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    replays: int = 0
    captures: int = 0
    refunds: int = 0
    transfers: int = 0
    shipments: int = 0
    double_capture_attempts: int = 0
    requests_without_key: int = 0
    captures_by_intent: dict[str, int] = field(default_factory=dict)
    shipments_by_order: dict[str, int] = field(default_factory=dict)


class _FakeProviders(IdempotentFake):
    """The fake Stripe and shipping API: its intents, refunds, transfers and shipments, and their counters."""

    _counters: _Counters

    def _clear(self) -> None:
        super()._clear()
        self._intents: dict[str, dict[str, Any]] = {}
        self._refunded: dict[str, int] = {}
        self._refunds: dict[str, list[dict[str, Any]]] = {}
        # Intents cancelled while requires_capture: their authorization was released as a refund.
        self._released: set[str] = set()
        self._transfers: dict[str, dict[str, Any]] = {}
        self._shipments: dict[str, dict[str, Any]] = {}
        self._counters = _Counters()

    # -- the provider endpoints -------------------------------------------------------------------

    def capture(self, request: Request, body: bytes) -> Answer:
        intent_id = request.path_params["id"]
        params = form_params(body)
        intent = self._intents.get(intent_id)
        if intent is None:
            # Auto-created so demos and tests need no setup call.
            intent = self._intents[intent_id] = new_intent(
                intent_id, _INTENT_AMOUNT, "usd", "requires_capture"
            )
        if intent["status"] != "requires_capture":
            # A capture of an already captured intent under a new key is the double effect the ledger
            # exists to prevent; the count is what tests assert stays zero.
            self._counters.double_capture_attempts += 1
            message = (
                f"This PaymentIntent's status is {intent['status']}, "
                "but it must be requires_capture to be captured."
            )
            return json_answer(
                400, error_body("invalid_request_error", "payment_intent_unexpected_state", message)
            )
        amount = amount_param(params, "amount_to_capture", default=intent["amount_capturable"])
        if amount > intent["amount_capturable"]:
            message = "The amount to capture is greater than the amount capturable."
            return json_answer(400, error_body("invalid_request_error", "amount_too_large", message))
        intent.update(
            amount_capturable=0,
            amount_received=amount,
            latest_charge=f"ch_{secrets.token_hex(12)}",
            status="succeeded",
        )
        self._counters.captures += 1
        by_intent = self._counters.captures_by_intent
        by_intent[intent_id] = by_intent.get(intent_id, 0) + 1
        return json_answer(200, intent)

    def refund(self, request: Request, body: bytes) -> Answer:
        params = form_params(body)
        intent_id = params.get("payment_intent")
        if not intent_id:
            message = "Missing required param: payment_intent."
            raise Invalid(json_answer(400, error_body("invalid_request_error", "parameter_missing", message)))
        intent = self._intents.get(intent_id)
        if intent is None:
            message = f"No such payment_intent: '{intent_id}'"
            raise Invalid(json_answer(400, error_body("invalid_request_error", "resource_missing", message)))
        if intent_id in self._released:
            message = f"Charge for PaymentIntent {intent_id} has already been refunded."
            return json_answer(400, error_body("invalid_request_error", "charge_already_refunded", message))
        if intent["status"] != "succeeded":
            message = f"This PaymentIntent's status is {intent['status']}: it has not been captured."
            return json_answer(
                400, error_body("invalid_request_error", "payment_intent_unexpected_state", message)
            )
        remaining = intent["amount_received"] - self._refunded.get(intent_id, 0)
        if remaining <= 0:
            message = f"Charge for PaymentIntent {intent_id} has already been refunded."
            return json_answer(400, error_body("invalid_request_error", "charge_already_refunded", message))
        amount = amount_param(params, "amount", default=remaining)
        if amount > remaining:
            message = f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})."
            return json_answer(400, error_body("invalid_request_error", "amount_too_large", message))
        self._refunded[intent_id] = self._refunded.get(intent_id, 0) + amount
        self._counters.refunds += 1
        refund = {
            "id": f"re_{secrets.token_hex(12)}",
            "object": "refund",
            "amount": amount,
            "currency": intent["currency"],
            "payment_intent": intent_id,
            "reason": params.get("reason"),
            "status": "succeeded",
            "created": int(time.time()),
        }
        self._refunds.setdefault(intent_id, []).append(refund)
        return json_answer(200, refund)

    def cancel(self, request: Request, body: bytes) -> Answer:
        intent = self._intents.get(request.path_params["id"])
        if intent is None:
            message = f"No such payment_intent: '{request.path_params['id']}'"
            raise Invalid(json_answer(404, error_body("invalid_request_error", "resource_missing", message)))
        if intent["status"] not in ("requires_payment_method", "requires_capture"):
            message = (
                f"You cannot cancel this PaymentIntent because it has a status of {intent['status']}. "
                "Only a PaymentIntent with one of the following statuses may be canceled: "
                "requires_payment_method, requires_capture, requires_confirmation, requires_action, processing."
            )
            return json_answer(
                400, error_body("invalid_request_error", "payment_intent_unexpected_state", message)
            )
        if intent["status"] == "requires_capture":
            self._released.add(intent["id"])
        reason = form_params(body).get("cancellation_reason")
        intent.update(amount_capturable=0, status="canceled", cancellation_reason=reason)
        return json_answer(200, intent)

    def list_refunds(self, request: Request, body: bytes) -> Answer:
        intent_id = request.query_params.get("payment_intent")
        found = (
            self._refunds.get(intent_id, [])
            if intent_id
            else [r for rs in self._refunds.values() for r in rs]
        )
        # Newest first, as Stripe lists.
        data = sorted(found, key=lambda r: r["created"], reverse=True)
        return json_answer(200, {"object": "list", "data": data, "has_more": False, "url": "/v1/refunds"})

    def transfer(self, request: Request, body: bytes) -> Answer:
        params = form_params(body)
        amount = amount_param(params, "amount", default=0)
        for name in ("amount", "currency", "destination"):
            if not params.get(name):
                message = f"Missing required param: {name}."
                raise Invalid(
                    json_answer(400, error_body("invalid_request_error", "parameter_missing", message))
                )
        destination = params["destination"]
        if not destination.startswith("acct_"):
            message = f"No such destination: '{destination}'"
            raise Invalid(json_answer(400, error_body("invalid_request_error", "resource_missing", message)))
        transfer_id = f"tr_{secrets.token_hex(12)}"
        transfer = {
            "id": transfer_id,
            "object": "transfer",
            "amount": amount,
            "amount_reversed": 0,
            "created": int(time.time()),
            "currency": params["currency"].lower(),
            "destination": destination,
            "livemode": False,
            "metadata": metadata_of(params),
            "reversed": False,
            "transfer_group": params.get("transfer_group"),
        }
        self._transfers[transfer_id] = transfer
        self._counters.transfers += 1
        return json_answer(200, transfer)

    def get_intent(self, request: Request, body: bytes) -> Answer:
        intent = self._intents.get(request.path_params["id"])
        if intent is None:
            message = f"No such payment_intent: '{request.path_params['id']}'"
            return json_answer(404, error_body("invalid_request_error", "resource_missing", message))
        return json_answer(200, intent)

    def create_shipment(self, request: Request, body: bytes) -> Answer:
        try:
            params = json.loads(body)
        except ValueError:
            params = None
        if not isinstance(params, dict):
            message = "The request body must be a JSON object."
            raise Invalid(json_answer(400, error_body("invalid_request_error", "invalid_json", message)))
        order_id = params.get("order_id")
        address = params.get("address")
        items = params.get("items")
        service = params.get("service", "standard")
        problem = None
        if not isinstance(order_id, str) or not order_id:
            problem = "order_id must be a non-empty string"
        elif not isinstance(address, dict):
            problem = "address must be an object"
        elif not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
            problem = "items must be a non-empty list of objects"
        elif not isinstance(service, str) or not service:
            problem = "service must be a non-empty string"
        if problem is not None or not isinstance(order_id, str):
            raise Invalid(json_answer(400, error_body("invalid_request_error", "parameter_invalid", problem)))
        shipment_id = f"shp_{secrets.token_hex(12)}"
        shipment = {
            "id": shipment_id,
            "object": "shipment",
            "order_id": order_id,
            "service": service,
            "status": "label_created",
            "address": address,
            "items": items,
            "tracking_number": f"FK{secrets.randbelow(10**12):012d}",
            "label_url": str(request.url_for("shipment_label", id=shipment_id)),
        }
        self._shipments[shipment_id] = shipment
        self._counters.shipments += 1
        by_order = self._counters.shipments_by_order
        by_order[order_id] = by_order.get(order_id, 0) + 1
        return json_answer(201, shipment)

    def get_shipment(self, request: Request, body: bytes) -> Answer:
        shipment = self._shipments.get(request.path_params["id"])
        if shipment is None:
            message = f"No such shipment: '{request.path_params['id']}'"
            return json_answer(404, error_body("invalid_request_error", "resource_missing", message))
        return json_answer(200, shipment)

    async def shipment_label(self, request: Request) -> Response:
        if request.path_params["id"] not in self._shipments:
            raise HTTPException(404)
        return Response(b"%PDF-1.4\n% effectgate fake label\n", media_type="application/pdf")

    # -- the control endpoints --------------------------------------------------------------------

    async def seed_intent(self, request: Request) -> Response:
        """`POST /_fake/payment_intents` {id, amount, currency, status}: an intent as a test needs it."""
        data = json.loads(await request.body() or b"{}")
        status = data.get("status", "requires_capture")
        if status not in ("requires_capture", "succeeded", "canceled", "requires_payment_method"):
            return JSONResponse(
                error_body("invalid_request_error", "invalid_status", status), status_code=400
            )
        amount = int(data.get("amount", _INTENT_AMOUNT))
        intent = new_intent(str(data["id"]), amount, str(data.get("currency", "usd")), status)
        async with self._lock:
            self._intents[intent["id"]] = intent
        return JSONResponse(intent)

    async def stats(self, request: Request) -> Response:
        async with self._lock:
            return JSONResponse(asdict(self._counters))

    async def requests(self, request: Request) -> Response:
        async with self._lock:
            return JSONResponse(list(self._requests))

    async def reset(self, request: Request) -> Response:
        async with self._lock:
            self._clear()
            self._set_faults(FaultConfig())
        return JSONResponse({"reset": True})

    async def faults(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                faults = FaultConfig.from_json(json.loads(await request.body()))
            except (ValueError, TypeError) as exc:
                return JSONResponse(
                    error_body("invalid_request_error", "invalid_faults", str(exc)), status_code=400
                )
            async with self._lock:
                self._set_faults(faults)
        return JSONResponse(asdict(self._faults))


def create_app(*, faults: FaultConfig | None = None) -> Starlette:
    """Build a fresh fake provider app; all its state lives in this instance, none in the module.

    `faults` sets the fault injection from the start (default: none); `POST /_fake/faults` changes it and
    `POST /_fake/reset` clears every effect, stored key, counter and fault.
    """
    fake = _FakeProviders(faults or FaultConfig())
    routes = [
        Route(
            "/v1/payment_intents/{id}/capture",
            fake.endpoint(fake.capture, mutating=True),
            methods=["POST"],
        ),
        Route("/v1/payment_intents/{id}/cancel", fake.endpoint(fake.cancel, mutating=True), methods=["POST"]),
        Route("/v1/payment_intents/{id}", fake.endpoint(fake.get_intent, mutating=False), methods=["GET"]),
        Route("/v1/refunds", fake.endpoint(fake.refund, mutating=True), methods=["POST"]),
        Route("/v1/refunds", fake.endpoint(fake.list_refunds, mutating=False), methods=["GET"]),
        Route("/v1/transfers", fake.endpoint(fake.transfer, mutating=True), methods=["POST"]),
        Route("/v1/shipments", fake.endpoint(fake.create_shipment, mutating=True), methods=["POST"]),
        Route("/v1/shipments/{id}", fake.endpoint(fake.get_shipment, mutating=False), methods=["GET"]),
        Route("/v1/shipments/{id}/label", fake.shipment_label, methods=["GET"], name="shipment_label"),
        Route("/_fake/stats", fake.stats, methods=["GET"]),
        Route("/_fake/payment_intents", fake.seed_intent, methods=["POST"]),
        Route("/_fake/requests", fake.requests, methods=["GET"]),
        Route("/_fake/reset", fake.reset, methods=["POST"]),
        Route("/_fake/faults", fake.faults, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})


#: Where ``effectgate fake-providers`` serves each of the other fakes, under one port: the prefix is the base URL's
#: path (``[downstream.easypost] base_url = "http://127.0.0.1:PORT/easypost"``).
MOUNTS = {"easypost": "/easypost", "shopify": "/shopify", "paypal_adyen": "/paypal-adyen"}


def create_all() -> Starlette:
    """Every fake API on one app: Stripe's (and the generic shipments) at the root, EasyPost, Shopify and
    PayPal/Adyen's under ``MOUNTS``, each with its own state and ``/_fake/…`` controls under its prefix."""
    from . import easypost, paypal_adyen, shopify

    apps = {
        "easypost": easypost.create_app(),
        "shopify": shopify.create_app(),
        "paypal_adyen": paypal_adyen.create_app(),
    }
    routes = [Mount(MOUNTS[name], app=app) for name, app in apps.items()]
    return Starlette(routes=[*routes, Mount("/", app=create_app())])


def serve(host: str, port: int) -> None:
    """Run every fake API (``create_all``) with uvicorn on `host:port` until the process is stopped.

    Graceful shutdown waits at most a second: a request held by a `hang` fault must not keep a stopping
    test server alive for an hour.
    """
    import uvicorn  # only the serving path needs the server; tests use the app in-process

    uvicorn.run(create_all(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)


async def _http_exception(request: Request, exc: Exception) -> Response:
    status = cast(HTTPException, exc).status_code
    return JSONResponse(
        error_body("invalid_request_error", "resource_missing" if status == 404 else f"http_{status}", None),
        status_code=status,
    )
