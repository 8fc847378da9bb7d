"""Shopify: ``X-Shopify-Hmac-Sha256``, base64 HMAC-SHA256 over the body; no timestamp.

See https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    as_key,
    b64_hmac,
    decode_digests,
    first_header,
    parse_json,
    require_header,
    utf8_keys,
)
from ._matching import hmac_matcher, require_match
from .base import Covers, Event, PayloadError, Verified, body_event_id

_HEADER = "X-Shopify-Hmac-Sha256"


class ShopifyScheme(SchemeBase):
    """Verifies Shopify webhooks: base64 HMAC-SHA256 of the body keyed by the app's client secret. The
    event id is ``X-Shopify-Webhook-Id`` (stable across retries of one delivery), falling back to
    ``X-Shopify-Event-Id``; the type is ``X-Shopify-Topic`` (``orders/create``). Shopify signs the body
    alone, none of these headers and no timestamp: the event id is ``body_event_id`` of the body (the
    webhook id is kept as ``delivery_id``) and the topic is unsigned."""

    name: ClassVar[str] = "shopify"
    covers = Covers(body=True, timestamp=False, id=False, type=False)

    def __init__(self, secrets: Sequence[str]) -> None:
        self._keys = utf8_keys(secrets)

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        presented = decode_digests([require_header(headers, _HEADER)], "base64", 32, _HEADER)
        match = hmac_matcher(self._keys, "sha256", presented, lambda b: b)
        index = require_match(body, match, secrets=len(self._keys), signatures=1)
        event_id = first_header(headers, "X-Shopify-Webhook-Id", "X-Shopify-Event-Id")
        topic = first_header(headers, "X-Shopify-Topic")
        if event_id is None or topic is None:
            raise PayloadError("X-Shopify-Webhook-Id (or X-Shopify-Event-Id) or X-Shopify-Topic is missing")
        # Both headers are unsigned: identity comes from the signed body, and the topic is a routing hint.
        event = Event(
            id=body_event_id(body),
            type=topic,
            payload=parse_json(body),
            type_signed=False,
            delivery_id=event_id,
        )
        return Verified(events=(event,), secret_index=index)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        return request.body, {
            _HEADER: signature(request.body, self._keys[0]),
            "X-Shopify-Webhook-Id": request.id_or_fresh(),
            "X-Shopify-Topic": request.require_type("X-Shopify-Topic"),
        }


def signature(body: bytes, secret: str | bytes) -> str:
    """The ``X-Shopify-Hmac-Sha256`` value Shopify sends for ``body``."""
    return b64_hmac(as_key(secret), body)
