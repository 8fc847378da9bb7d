"""Twilio: ``X-Twilio-Signature``, base64 HMAC-SHA1 over the public URL and the POST parameters.

See https://www.twilio.com/docs/usage/webhooks/webhooks-security. For form bodies the signed string is
the URL followed by every parameter name and value, sorted. For JSON bodies Twilio appends
``bodySHA256=<sha256 hex of the body>`` to the URL and signs that URL alone; the gateway does not see
the request URL, so the scheme rebuilds it from the configured ``url`` and the body it received,
which makes a body that does not match its hash fail as an invalid signature.

Webhooks signed with a SharedKey carry ``X-Twilio-Webhooks-Signature-Settings: key=…,algorithm=…``;
``HMAC_SHA256`` then replaces SHA-1 (the configured secret is the SharedKey's), as in Twilio's own
``RequestValidator``. A source whose secret is a SharedKey's names the key with the ``shared_key``
option; verification reads the algorithm from each request either way, and ``sign`` then signs as
Twilio does with that key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    as_key,
    b64_hmac,
    decode_digests,
    describe_labels,
    first_header,
    option_str,
    parse_json,
    require_header,
    require_text,
    utf8_keys,
)
from ._matching import hmac_index, require_match
from .base import (
    JSON_CONTENT_TYPE,
    Covers,
    Event,
    SchemeConfigError,
    SignatureInvalid,
    SigningError,
    UnsupportedSignatureVersion,
    Verified,
    body_event_id,
)

_HEADER = "X-Twilio-Signature"
_SETTINGS = "X-Twilio-Webhooks-Signature-Settings"
_ALGORITHMS = {"HMAC_SHA1": ("sha1", 20), "HMAC_SHA256": ("sha256", 32)}
_DEFAULT_TYPE = "twilio.request"
_DEFAULT_PORTS = {"https": 443, "http": 80}
# A body Twilio sends as JSON starts (after any whitespace) like a JSON object or array; none of its forms do.
_JSON_START = re.compile(rb"[ \t\r\n]*[\[{]")
# What follows the URL in the string Twilio signs for a JSON body.
_JSON_SIGNED_SUFFIX = re.compile(r"[?&]bodySHA256=[0-9a-f]{64}")
# parse_qsl's own guard against a body made of millions of "&"; Twilio sends a few dozen fields.
_MAX_FIELDS = 1000


class TwilioScheme(SchemeBase):
    """Verifies Twilio webhooks against the auth token(s): HMAC-SHA1 over ``url`` (the public URL
    configured in Twilio, query string included, tried with and without its default port as Twilio's
    own validator does) plus the sorted form parameters, or, for JSON bodies, over the URL with the
    body's ``bodySHA256``; HMAC-SHA256 instead when ``X-Twilio-Webhooks-Signature-Settings`` names it
    (SharedKey signing, the secret being the SharedKey's, whose SID the ``shared_key`` option names for
    ``sign``). Which of the two readings applies is decided by the signature that matches (a body shaped
    like JSON is never read as a form), never by the unsigned ``Content-Type``. The event id is ``body_event_id`` of the signed body (the unsigned
    ``I-Twilio-Idempotency-Token`` is kept as ``delivery_id``); the type is the ``event_type`` option,
    else ``SmsStatus``, else ``twilio.request``."""

    name: ClassVar[str] = "twilio"
    covers = Covers(body=True, timestamp=False, id=False, type=True, url=True)

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        url: str | None = None,
        event_type: str | None = None,
        shared_key: str | None = None,
    ) -> None:
        self._keys = utf8_keys(secrets)
        public_url = option_str("url", url)
        if public_url is None:
            raise SchemeConfigError("url: required (the public URL configured in Twilio)")
        self._url = public_url
        self._urls = _url_variants(public_url)
        self._event_type = option_str("event_type", event_type)
        self._shared_key = option_str("shared_key", shared_key)
        if self._shared_key is not None and not all(c.isalnum() or c in "_-" for c in self._shared_key):
            # It travels in a header; a comma or '=' would corrupt the settings Twilio's format parses.
            raise SchemeConfigError("shared_key: expected the SharedKey's SID (letters, digits, '_', '-')")

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        digest, size = _algorithm(first_header(headers, _SETTINGS))
        presented = decode_digests([require_header(headers, _HEADER)], "base64", size, _HEADER)
        # The unsigned Content-Type does not choose the reading: the signature does. A JSON body is signed as
        # url?bodySHA256=… (a hash of the body and a short HMAC: tried first), a form as the URL plus its
        # parameters; a body shaped like JSON (an object or an array) is never read as a form, which also
        # keeps a failed check of a JSON body to one matching pass. Rewriting Content-Type changes nothing.
        json_shaped = _JSON_START.match(body) is not None
        read_as: list[str] = []

        def match(candidate: bytes) -> int | None:
            read_as.clear()
            signed = [text.encode("utf-8") for text in _json_signed_strings(self._urls, candidate)]
            index = hmac_index(self._keys, digest, presented, signed)
            if index is not None:
                read_as.append("json")
                return index
            form = None if json_shaped else _form_signed_strings(self._urls, candidate)
            if form is None:
                return None
            return hmac_index(self._keys, digest, presented, [text.encode("utf-8") for text in form])

        index = require_match(body, match, secrets=len(self._keys), signatures=1)
        payload: Any = parse_json(body) if read_as == ["json"] else _form_payload(body)
        return Verified(events=(self._event(body, headers, payload),), secret_index=index)

    def _event(self, body: bytes, headers: Headers, payload: Any) -> Event:
        fields = payload if isinstance(payload, dict) else {}
        if self._event_type is not None:
            event_type: Any = self._event_type
        else:
            event_type = fields.get("SmsStatus") or _DEFAULT_TYPE
        # I-Twilio-Idempotency-Token is unsigned, and MessageSid names a message, not one of its status
        # callbacks: the id is the signed body's digest (the same bytes on Twilio's retries).
        return Event(
            id=body_event_id(body),
            type=require_text(event_type, "SmsStatus"),
            payload=payload,
            delivery_id=first_header(headers, "I-Twilio-Idempotency-Token"),
        )

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        # Twilio signs the public URL it calls, which is what this scheme verifies against: the
        # configured url, whatever address the delivery is posted to.
        algorithm = "HMAC_SHA1" if self._shared_key is None else "HMAC_SHA256"
        if request.content_type.lower().startswith(JSON_CONTENT_TYPE):
            value = signature(json_url(self._url, request.body), (), self._keys[0], algorithm=algorithm)
        else:
            try:
                fields = _form_fields(request.body)
            except SignatureInvalid:
                raise SigningError(
                    "body: not form-encoded UTF-8; send a JSON body with content type application/json"
                ) from None
            value = signature(self._url, fields, self._keys[0], algorithm=algorithm)
        headers = {_HEADER: value, "I-Twilio-Idempotency-Token": request.id_or_fresh()}
        if self._shared_key is not None:
            headers[_SETTINGS] = f"key={self._shared_key},algorithm={algorithm}"
        return request.body, headers


def signature(
    url: str, params: Iterable[tuple[str, str]], secret: str | bytes, *, algorithm: str = "HMAC_SHA1"
) -> str:
    """The ``X-Twilio-Signature`` value Twilio sends when it calls ``url`` with the form ``params``
    (none for a JSON body, whose hash is in ``json_url``), keyed by the auth token or SharedKey secret,
    as Twilio's ``RequestValidator.compute_signature`` computes it."""
    digest, _size = _ALGORITHMS[algorithm]
    values: dict[str, set[str]] = {}
    for key, value in params:
        values.setdefault(key, set()).add(value)
    signed = url + "".join(key + value for key in sorted(values) for value in sorted(values[key]))
    return b64_hmac(as_key(secret), signed.encode("utf-8"), digest)


def json_url(url: str, body: bytes) -> str:
    """The URL Twilio signs for a JSON body: ``url`` with ``bodySHA256=<hex sha256 of the body>`` added."""
    return f"{url}{'&' if '?' in url else '?'}bodySHA256={hashlib.sha256(body).hexdigest()}"


def _algorithm(settings: str | None) -> tuple[str, int]:
    # Twilio's validator: the first non-empty algorithm= entry, else the legacy Auth Token HMAC-SHA1.
    for part in (settings or "").split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() == "algorithm" and value.strip():
            algorithm = _ALGORITHMS.get(value.strip().upper())
            if algorithm is None:
                raise UnsupportedSignatureVersion(
                    f"{_SETTINGS}: algorithm {describe_labels([value.strip()])}; "
                    f"supported: {', '.join(_ALGORITHMS)}"
                )
            return algorithm
    return _ALGORITHMS["HMAC_SHA1"]


def _url_variants(url: str) -> tuple[str, ...]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SchemeConfigError("url: not a valid URL") from None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise SchemeConfigError("url: expected an absolute http:// or https:// URL")
    # Twilio signs the URL as it dialled it; whether a default port appeared in it is not knowable.
    host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    without_port = urlunsplit(parts._replace(netloc=host))
    with_port = urlunsplit(parts._replace(netloc=f"{host}:{port or _DEFAULT_PORTS[parts.scheme]}"))
    return tuple(dict.fromkeys((url, without_port, with_port)))


def _form_fields(body: bytes) -> list[tuple[str, str]]:
    try:
        return parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=_MAX_FIELDS,
        )
    except ValueError:
        # A body that is not a form cannot be what Twilio signed; it is refused unauthenticated.
        raise SignatureInvalid("body is not form-encoded, so no Twilio signature can match it") from None


def _form_signed_strings(urls: Sequence[str], body: bytes) -> list[str] | None:
    # Twilio's validator sorts names, then each name's distinct values, and concatenates them.
    values: dict[str, set[str]] = {}
    try:
        fields = _form_fields(body)
    except SignatureInvalid:
        return None
    for key, value in fields:
        values.setdefault(key, set()).add(value)
    params = "".join(key + value for key in sorted(values) for value in sorted(values[key]))
    if _JSON_SIGNED_SUFFIX.fullmatch(params):
        # A form whose parameters spell "?bodySHA256=<hex>" signs exactly what a JSON delivery signs:
        # it would let a captured JSON signature vouch for a made-up form. Twilio never sends such a name.
        return None
    return [url + params for url in urls]


def _json_signed_strings(urls: Sequence[str], body: bytes) -> list[str]:
    digest = hashlib.sha256(body).hexdigest()
    return [f"{url}{'&' if '?' in url else '?'}bodySHA256={digest}" for url in urls]


def _form_payload(body: bytes) -> dict[str, str | list[str]]:
    payload: dict[str, str | list[str]] = {}
    for key, value in _form_fields(body):
        previous = payload.get(key)
        if previous is None:
            payload[key] = value
        elif isinstance(previous, list):
            previous.append(value)
        else:
            payload[key] = [previous, value]
    return payload
