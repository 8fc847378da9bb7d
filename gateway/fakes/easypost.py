"""A fake EasyPost API (v2) with EasyPost's answer shapes and, like EasyPost, no idempotency keys.

`POST /v2/shipments` with `{"shipment": {...}}` creates a shipment. With `service` and `carrier_accounts`
it is bought in the same call (EasyPost's "one-call buy"): the answer carries `tracking_code`,
`selected_rate` and `postage_label.label_url`, and that purchase is the effect the fake counts as a label.
Every create makes a new shipment, whatever headers the request carries: EasyPost documents no idempotency
key, so a repeated call buys a second label.

`GET /v2/shipments/{id}` finds a shipment by its id **or its `reference`**: EasyPost lets a reference you
assigned stand in for the id (https://docs.easypost.com/docs/easypost-objects), which is what a step's
`find` uses. Unknown: 404 `{"error": {"code": "NOT_FOUND", ...}}`. Requests need `Authorization: Bearer`.

`POST /v2/shipments/{id}/refund` asks for a bought label's refund: the shipment answers with `refund_status:
"submitted"` (EasyPost then moves it to `refunded` or `rejected`; the fake stays at `submitted` and models
no refusal).

Control endpoints: `GET /_fake/stats` (labels, shipments, labels per reference), `POST /_fake/reset`, and
`POST /_fake/hold {"hold": true|false}`: while set, a create stores and buys its shipment and then does
*not answer* until the client goes away or the hold is lifted — the window in which a worker has reached the
API and recorded nothing, for crash tests to SIGKILL it in without aiming with sleeps.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["create_app", "hold_answer", "serve"]


class _FakeEasyPost:
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.shipments: dict[str, dict[str, Any]] = {}
        self.labels_by_reference: dict[str, int] = {}
        self.labels = 0
        self.hold = False
        self.released = asyncio.Event()

    async def create(self, request: Request) -> Response:
        if (refused := _unauthorised(request)) is not None:
            return refused
        try:
            params = json.loads(await request.body())["shipment"]
            if not isinstance(params, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error(422, "PARAMETER.REQUIRED", "Missing required parameter: shipment.")
        for name in ("to_address", "from_address", "parcel"):
            if not isinstance(params.get(name), dict):
                return _error(422, "PARAMETER.REQUIRED", f"Missing required parameter: shipment.{name}.")
        shipment_id = f"shp_{secrets.token_hex(16)}"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rate = {
            "id": f"rate_{secrets.token_hex(16)}",
            "object": "Rate",
            "carrier": "USPS",
            "service": params.get("service") or "Priority",
            "rate": "7.58",
            "currency": "USD",
            "shipment_id": shipment_id,
        }
        shipment: dict[str, Any] = {
            "id": shipment_id,
            "object": "Shipment",
            "mode": "test",
            "reference": params.get("reference"),
            "created_at": now,
            "updated_at": now,
            "status": "unknown",
            "to_address": {"object": "Address", **params["to_address"]},
            "from_address": {"object": "Address", **params["from_address"]},
            "parcel": {"object": "Parcel", **params["parcel"]},
            "options": params.get("options") or {},
            "rates": [rate],
            "selected_rate": None,
            "postage_label": None,
            "tracking_code": None,
            "tracker": None,
            "refund_status": None,
            "messages": [],
        }
        if params.get("service") and params.get("carrier_accounts"):
            shipment["selected_rate"] = rate
            shipment["tracking_code"] = f"9400{secrets.randbelow(10**18):018d}"
            shipment["postage_label"] = {
                "object": "PostageLabel",
                "id": f"pl_{secrets.token_hex(16)}",
                "label_url": f"{request.base_url}labels/{shipment_id}.png",
                "label_file_type": "image/png",
                "created_at": now,
            }
            self.labels += 1
            reference = str(params.get("reference"))
            self.labels_by_reference[reference] = self.labels_by_reference.get(reference, 0) + 1
        self.shipments[shipment_id] = shipment
        if self.hold:
            await hold_answer(request, self.released)
        return JSONResponse(shipment, status_code=201)

    async def retrieve(self, request: Request) -> Response:
        if (refused := _unauthorised(request)) is not None:
            return refused
        wanted = request.path_params["id"]
        found = self.shipments.get(wanted)
        if found is None:
            # A reference stands in for the id; the latest shipment carrying it answers.
            by_reference = [s for s in self.shipments.values() if s["reference"] == wanted]
            found = by_reference[-1] if by_reference else None
        if found is None:
            return _error(404, "NOT_FOUND", "The requested resource could not be found.")
        return JSONResponse(found)

    async def refund(self, request: Request) -> Response:
        if (refused := _unauthorised(request)) is not None:
            return refused
        found = self.shipments.get(request.path_params["id"])
        if found is None:
            return _error(404, "NOT_FOUND", "The requested resource could not be found.")
        found["refund_status"] = "submitted"
        return JSONResponse(found)

    async def stats(self, request: Request) -> Response:
        return JSONResponse(
            {
                "shipments": len(self.shipments),
                "labels": self.labels,
                "labels_by_reference": self.labels_by_reference,
                "hold": self.hold,
            }
        )

    async def set_hold(self, request: Request) -> Response:
        self.hold = bool((await request.json()).get("hold"))
        if not self.hold:
            self.released.set()
            self.released = asyncio.Event()
        return JSONResponse({"hold": self.hold})

    async def reset(self, request: Request) -> Response:
        self.released.set()
        self._clear()
        return JSONResponse({"reset": True})


def create_app() -> Starlette:
    """A fresh fake EasyPost; all its state lives in this app."""
    fake = _FakeEasyPost()
    return Starlette(
        routes=[
            Route("/v2/shipments", fake.create, methods=["POST"]),
            Route("/v2/shipments/{id}", fake.retrieve, methods=["GET"]),
            Route("/v2/shipments/{id}/refund", fake.refund, methods=["POST"]),
            Route("/_fake/stats", fake.stats, methods=["GET"]),
            Route("/_fake/hold", fake.set_hold, methods=["POST"]),
            Route("/_fake/reset", fake.reset, methods=["POST"]),
        ]
    )


def serve(host: str, port: int) -> None:
    """Run a fresh fake EasyPost with uvicorn on `host:port` until the process is stopped."""
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)


def _unauthorised(request: Request) -> Response | None:
    auth = request.headers.get("authorization", "")
    if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
        return _error(401, "APIKEY.REQUIRED", "No API key was provided.")
    return None


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": {"code": code, "message": message, "errors": []}}, status_code=status)


async def hold_answer(request: Request, released: asyncio.Event) -> None:
    """Wait until the hold is lifted or the client disconnects (a SIGKILLed worker's socket closes)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waits = [asyncio.ensure_future(released.wait()), asyncio.ensure_future(gone())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
