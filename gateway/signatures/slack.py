"""Slack: ``X-Slack-Signature: v0=<hex>`` over ``"v0:<timestamp>:" + body``.

See https://api.slack.com/authentication/verifying-requests-from-slack. Handles the Events API: an
``event_callback`` becomes one event; the ``url_verification`` handshake becomes a challenge answer.
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
    hex_hmac,
    json_field,
    parse_json,
    parse_timestamp,
    require_header,
    require_text,
    resolve_tolerance,
    utf8_keys,
)
from ._matching import hmac_matcher, require_match
from .base import Covers, Event, SignatureMalformed, UnsupportedSignatureVersion, Verified

_SIGNATURE = "X-Slack-Signature"
_TIMESTAMP = "X-Slack-Request-Timestamp"


class SlackScheme(SchemeBase):
    """Verifies Slack Events API requests: HMAC-SHA256 keyed by the app's signing secret, a request
    timestamp within ``tolerance`` seconds either way (default 300), the event id from ``event_id`` and
    the type from ``event.type``. A verified ``url_verification`` body yields no events and the
    ``{"challenge": …}`` answer Slack expects."""

    name: ClassVar[str] = "slack"
    covers = Covers(body=True, timestamp=True, id=True, type=True)

    def __init__(self, secrets: Sequence[str], *, tolerance: int | None = None) -> None:
        self._keys = utf8_keys(secrets)
        self._tolerance = resolve_tolerance(tolerance)

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        signature = require_header(headers, _SIGNATURE)
        raw_timestamp = require_header(headers, _TIMESTAMP)
        timestamp = parse_timestamp(raw_timestamp, _TIMESTAMP)
        version, sep, hexdigest = signature.partition("=")
        if not sep:
            raise SignatureMalformed(f"{_SIGNATURE}: expected v0=<hex>")
        if version != "v0":
            raise UnsupportedSignatureVersion(
                f"{_SIGNATURE}: version {describe_labels([version])}; only v0 is supported"
            )
        presented = decode_digests([hexdigest], "hex", 32, _SIGNATURE)
        prefix = f"v0:{raw_timestamp}:".encode("ascii")
        match = hmac_matcher(self._keys, "sha256", presented, lambda b: prefix + b)
        index = require_match(body, match, secrets=len(self._keys), signatures=1)
        check_timestamp(timestamp, now, self._tolerance)
        document = parse_json(body)
        if json_field(document, "type") == "url_verification":
            challenge = require_text(json_field(document, "challenge"), "body field 'challenge'")
            return Verified(events=(), secret_index=index, challenge={"challenge": challenge})
        event = Event(
            id=require_text(json_field(document, "event_id"), "body field 'event_id'"),
            type=require_text(json_field(document, "event.type"), "body field 'event.type'"),
            payload=document,
        )
        return Verified(events=(event,), secret_index=index)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        # Slack's event id and type are fields of the body, which is signed as it is.
        return request.body, {
            _SIGNATURE: signature(request.body, self._keys[0], timestamp=request.timestamp),
            _TIMESTAMP: str(request.timestamp),
        }


def signature(body: bytes, secret: str | bytes, *, timestamp: int) -> str:
    """The ``X-Slack-Signature`` value Slack sends for ``body`` with request timestamp ``timestamp``."""
    return "v0=" + hex_hmac(as_key(secret), f"v0:{timestamp}:".encode("ascii") + body)
