"""Stripe: ``Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`` over ``"<t>." + body``.

See https://docs.stripe.com/webhooks#verify-manually. Stripe sends one ``v1`` per active endpoint
secret while a secret is being rolled, and may add other schemes (``v0``) that are ignored here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    as_key,
    check_timestamp,
    decode_digests,
    describe_labels,
    event_from_json,
    hex_hmac,
    parse_timestamp,
    require_header,
    resolve_tolerance,
    utf8_keys,
)
from ._matching import hmac_matcher, require_match
from .base import Covers, SignatureMalformed, UnsupportedSignatureVersion, Verified

_HEADER = "Stripe-Signature"


class StripeScheme(SchemeBase):
    """Verifies Stripe webhooks: HMAC-SHA256 keyed by the endpoint secret (``whsec_…``, used verbatim as
    UTF-8 bytes, as Stripe does), a timestamp within ``tolerance`` seconds either way (default 300), and
    the event id and type from the JSON body."""

    name: ClassVar[str] = "stripe"
    covers = Covers(body=True, timestamp=True, id=True, type=True)

    def __init__(self, secrets: Sequence[str], *, tolerance: int | None = None) -> None:
        self._keys = utf8_keys(secrets)
        self._tolerance = resolve_tolerance(tolerance)

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        raw_timestamp, signatures = _parse_header(require_header(headers, _HEADER))
        timestamp = parse_timestamp(raw_timestamp, _HEADER)
        presented = decode_digests(signatures, "hex", 32, f"{_HEADER} v1")
        # The timestamp is signed exactly as sent, so it is spliced in as the raw string.
        prefix = f"{raw_timestamp}.".encode("ascii")
        match = hmac_matcher(self._keys, "sha256", presented, lambda b: prefix + b)
        index = require_match(body, match, secrets=len(self._keys), signatures=len(presented))
        check_timestamp(timestamp, now, self._tolerance)
        return Verified(events=(event_from_json(body),), secret_index=index)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        # Stripe puts the event id and type in the body, which is signed as it is.
        return request.body, {
            _HEADER: signature_header(request.body, self._keys[0], timestamp=request.timestamp)
        }


def signature_header(body: bytes, secret: str | bytes, *, timestamp: int) -> str:
    """The ``Stripe-Signature`` value Stripe sends for ``body`` at ``timestamp`` (Unix seconds)."""
    return f"t={timestamp},v1={hex_hmac(as_key(secret), f'{timestamp}.'.encode('ascii') + body)}"


def _parse_header(value: str) -> tuple[str, list[str]]:
    timestamps: list[str] = []
    signatures: list[str] = []
    others: set[str] = set()
    for item in value.split(","):
        key, sep, item_value = item.strip().partition("=")
        if not sep:
            raise SignatureMalformed(f"{_HEADER}: expected comma-separated key=value pairs")
        if key == "t":
            timestamps.append(item_value)
        elif key == "v1":
            signatures.append(item_value)
        else:
            others.add(key)
    if len(timestamps) != 1:
        raise SignatureMalformed(f"{_HEADER}: expected exactly one t= timestamp, found {len(timestamps)}")
    if not signatures:
        if others:
            raise UnsupportedSignatureVersion(
                f"{_HEADER}: no v1 signature, only {describe_labels(sorted(others))}; the gateway verifies v1"
            )
        raise SignatureMalformed(f"{_HEADER}: no signature present")
    return timestamps[0], signatures
