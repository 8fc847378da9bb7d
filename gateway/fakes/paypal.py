"""A fake PayPal REST API: the endpoints a gateway confirming PayPal deliveries calls, in PayPal's shapes.

- ``POST /v1/oauth2/token`` — client credentials over HTTP Basic, ``grant_type=client_credentials``;
  answers ``{"scope", "access_token", "token_type": "Bearer", "app_id", "expires_in", "nonce"}``, or 401
  ``{"error": "invalid_client", "error_description": …}``.
- ``GET /v1/notifications/webhooks-events/{id}`` — the event as PayPal stored it, or 404
  ``{"name": "INVALID_RESOURCE_ID", "message", "debug_id", "information_link"}``.
- ``POST /v1/notifications/verify-webhook-signature`` — ``{"verification_status": "SUCCESS"|"FAILURE"}``;
  400 ``VALIDATION_ERROR`` when a required field is missing. The fake answers SUCCESS when it sent a
  transmission with exactly these headers and this event (a PayPal that knows what it sent); PayPal does
  not document whether the real API compares the event, which is why ``fetch_event`` is the recommended
  confirmation.
- ``GET /v1/notifications/certs/{name}`` — the certificate chains it was given (PayPal serves its signing
  certificates from its API host).

Every API call needs ``Authorization: Bearer <a token it issued>`` (else 401 ``AUTHENTICATION_FAILURE``).
Tests record what "PayPal sent" with ``FakePayPal.sent`` and read ``calls`` to count requests by
endpoint; ``failing`` makes every API call answer 500 ``INTERNAL_SERVICE_ERROR``.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["FakePayPal", "SentTransmission", "create_app"]

_TOKEN_LIFETIME = 32400
_VERIFY_FIELDS = (
    "auth_algo",
    "cert_url",
    "transmission_id",
    "transmission_sig",
    "transmission_time",
    "webhook_id",
)


@dataclass(frozen=True, slots=True)
class SentTransmission:
    """The headers PayPal put on one delivery of an event, and the webhook it went to."""

    auth_algo: str
    cert_url: str
    transmission_id: str
    transmission_sig: str
    transmission_time: str
    webhook_id: str

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], webhook_id: str) -> SentTransmission:
        """From the ``PAYPAL-*`` headers of a delivery (any case)."""
        lowered = {k.lower(): v for k, v in headers.items()}
        return cls(
            auth_algo=lowered["paypal-auth-algo"],
            cert_url=lowered["paypal-cert-url"],
            transmission_id=lowered["paypal-transmission-id"],
            transmission_sig=lowered["paypal-transmission-sig"],
            transmission_time=lowered["paypal-transmission-time"],
            webhook_id=webhook_id,
        )


@dataclass
class FakePayPal:
    """The fake's state: credentials it accepts, events and transmissions it sent, what it was asked."""

    client_id: str
    client_secret: str
    certificates: dict[str, bytes] = field(default_factory=dict)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    transmissions: dict[str, tuple[SentTransmission, str]] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    calls: Counter[str] = field(default_factory=Counter)
    failing: bool = False

    def sent(self, event: dict[str, Any], transmission: SentTransmission | None = None) -> None:
        """Record that PayPal holds ``event`` (and, when given, delivered it with ``transmission``)."""
        self.events[str(event["id"])] = event
        if transmission is not None:
            self.transmissions[transmission.transmission_id] = (transmission, str(event["id"]))

    async def token(self, request: Request) -> Response:
        self.calls["oauth2/token"] += 1
        if not self._basic_ok(request.headers.get("authorization", "")):
            return JSONResponse(
                {"error": "invalid_client", "error_description": "Client Authentication failed"}, 401
            )
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
        if form.get("grant_type") != "client_credentials":
            return JSONResponse(
                {"error": "unsupported_grant_type", "error_description": "Grant Type is NULL"}, 400
            )
        token = "A21AA" + secrets.token_urlsafe(24)
        self.tokens.add(token)
        return JSONResponse(
            {
                "scope": "https://uri.paypal.com/services/applications/webhooks",
                "access_token": token,
                "token_type": "Bearer",
                "app_id": "APP-80W284485P519543T",
                "expires_in": _TOKEN_LIFETIME,
                "nonce": secrets.token_hex(16),
            }
        )

    async def webhook_event(self, request: Request) -> Response:
        self.calls["webhooks-events"] += 1
        refused = self._refuse(request)
        if refused is not None:
            return refused
        event = self.events.get(request.path_params["id"])
        if event is None:
            return _paypal_error(404, "INVALID_RESOURCE_ID", "The requested resource ID was not found")
        return JSONResponse(event)

    async def verify_signature(self, request: Request) -> Response:
        self.calls["verify-webhook-signature"] += 1
        refused = self._refuse(request)
        if refused is not None:
            return refused
        try:
            document = json.loads(await request.body())
        except ValueError:
            return _paypal_error(400, "MALFORMED_REQUEST", "The request JSON is not well formed.")
        missing = [
            name
            for name in (*_VERIFY_FIELDS, "webhook_event")
            if not isinstance(document, dict) or not document.get(name)
        ]
        if missing:
            return _paypal_error(400, "VALIDATION_ERROR", f"Invalid data provided: {', '.join(missing)}")
        known = self.transmissions.get(document["transmission_id"])
        status = "FAILURE"
        if known is not None:
            transmission, event_id = known
            headers_match = all(document[name] == getattr(transmission, name) for name in _VERIFY_FIELDS)
            if headers_match and document["webhook_event"] == self.events.get(event_id):
                status = "SUCCESS"
        return JSONResponse({"verification_status": status})

    async def certificate(self, request: Request) -> Response:
        self.calls["certs"] += 1
        chain = self.certificates.get(request.path_params["name"])
        if chain is None:
            return _paypal_error(404, "RESOURCE_NOT_FOUND", "The specified resource does not exist.")
        return Response(chain, media_type="application/x-pem-file")

    def _basic_ok(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        return decoded == f"{self.client_id}:{self.client_secret}"

    def _refuse(self, request: Request) -> Response | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return _paypal_error(401, "AUTHENTICATION_FAILURE", "Authentication failed due to invalid token")
        if self.failing:
            return _paypal_error(500, "INTERNAL_SERVICE_ERROR", "An internal service error occurred.")
        return None


def create_app(fake: FakePayPal) -> Starlette:
    """The fake's routes over ``fake``'s state (kept on ``app.state.paypal`` too)."""
    app = Starlette(
        routes=[
            Route("/v1/oauth2/token", fake.token, methods=["POST"]),
            Route("/v1/notifications/webhooks-events/{id}", fake.webhook_event, methods=["GET"]),
            Route("/v1/notifications/verify-webhook-signature", fake.verify_signature, methods=["POST"]),
            Route("/v1/notifications/certs/{name}", fake.certificate, methods=["GET"]),
        ]
    )
    app.state.paypal = fake
    return app


def _paypal_error(status: int, name: str, message: str) -> JSONResponse:
    debug_id = secrets.token_hex(6)
    return JSONResponse(
        {
            "name": name,
            "message": message,
            "debug_id": debug_id,
            "information_link": f"https://developer.paypal.com/docs/api/webhooks/v1/#error-{name}",
        },
        status,
    )
