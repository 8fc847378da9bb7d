"""GitHub: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 over the body; no timestamp.

See https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries. The delivery and
event type travel in headers; the type is refined with the body's ``action`` (``issues.opened``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    as_key,
    decode_digests,
    describe_labels,
    first_header,
    hex_hmac,
    option_bool,
    parse_json,
    utf8_keys,
)
from ._matching import hmac_matcher, require_match
from .base import (
    Covers,
    Event,
    PayloadError,
    SignatureMalformed,
    SignatureMissing,
    UnsupportedSignatureVersion,
    Verified,
    body_event_id,
)

_SHA256_HEADER = "X-Hub-Signature-256"
_SHA1_HEADER = "X-Hub-Signature"
_DIGEST_SIZES = {"sha256": 32, "sha1": 20}


class GitHubScheme(SchemeBase):
    """Verifies GitHub webhooks: HMAC-SHA256 of the body keyed by the webhook secret. The legacy SHA-1
    header is accepted only with ``allow_sha1=True`` (and only when no SHA-256 header is sent). The
    event id is ``X-GitHub-Delivery`` and the type ``X-GitHub-Event`` plus ``.action`` when the body
    has one. GitHub signs the body alone: no timestamp, and neither header. So the event id handlers and
    keys see is ``body_event_id`` of the body (the delivery header is kept as ``delivery_id``), and the
    type is unsigned; a replay of the body is then a duplicate, whatever delivery id it carries."""

    name: ClassVar[str] = "github"
    covers = Covers(body=True, timestamp=False, id=False, type=False)

    def __init__(self, secrets: Sequence[str], *, allow_sha1: bool = False) -> None:
        self._keys = utf8_keys(secrets)
        self._allow_sha1 = option_bool("allow_sha1", allow_sha1)

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        header, value = _SHA256_HEADER, first_header(headers, _SHA256_HEADER)
        if value is None:
            legacy = first_header(headers, _SHA1_HEADER)
            if legacy is None:
                raise SignatureMissing(f"{_SHA256_HEADER} header is missing or blank")
            if not self._allow_sha1:
                raise UnsupportedSignatureVersion(
                    f"only {_SHA1_HEADER} (SHA-1) was sent; SHA-1 is accepted only with allow_sha1"
                )
            header, value = _SHA1_HEADER, legacy
        expected = "sha256" if header == _SHA256_HEADER else "sha1"
        algorithm, sep, hexdigest = value.partition("=")
        if not sep or not algorithm:
            raise SignatureMalformed(f"{header}: expected {expected}=<hex>")
        if algorithm != expected:
            raise UnsupportedSignatureVersion(
                f"{header}: expected {expected}=, got {describe_labels([algorithm])}"
            )
        presented = decode_digests([hexdigest], "hex", _DIGEST_SIZES[expected], header)
        match = hmac_matcher(self._keys, expected, presented, lambda b: b)
        index = require_match(body, match, secrets=len(self._keys), signatures=1)
        return Verified(events=(_event(body, headers),), secret_index=index)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        # GitHub's event header names the event alone ("issues"); the action travels in the body.
        event = request.require_type("X-GitHub-Event").split(".", 1)[0]
        return request.body, {
            _SHA256_HEADER: signature_header(request.body, self._keys[0]),
            "X-GitHub-Delivery": request.id_or_fresh(),
            "X-GitHub-Event": event,
        }


def signature_header(body: bytes, secret: str | bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``."""
    return "sha256=" + hex_hmac(as_key(secret), body)


def _event(body: bytes, headers: Headers) -> Event:
    delivery = first_header(headers, "X-GitHub-Delivery")
    event_type = first_header(headers, "X-GitHub-Event")
    if delivery is None or event_type is None:
        raise PayloadError("X-GitHub-Delivery or X-GitHub-Event header is missing")
    document = parse_json(body)
    action = document.get("action") if isinstance(document, dict) else None
    if isinstance(action, str) and action:
        event_type = f"{event_type}.{action}"
    # X-GitHub-Delivery and X-GitHub-Event are unsigned: the id comes from the signed body, and the type
    # is marked as a routing hint (the action in the body is signed, the event name beside it is not).
    return Event(
        id=body_event_id(body), type=event_type, payload=document, type_signed=False, delivery_id=delivery
    )
