"""A configurable HMAC scheme for providers without a module of their own.

Everything a typical "HMAC of the body in a header" provider varies is an option: header, algorithm,
hex or base64, a prefix such as ``sha256=``, an optional signed timestamp and the template that
places it, and where the event id and type come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    b64_hmac,
    check_timestamp,
    decode_digests,
    first_header,
    hex_hmac,
    json_field,
    option_choice,
    option_str,
    parse_json,
    parse_timestamp,
    require_header,
    require_text,
    resolve_tolerance,
    utf8_keys,
)
from ._matching import hmac_matcher, require_match
from .base import Covers, Event, PayloadError, SchemeConfigError, SignatureMalformed, Verified, body_event_id

_DIGEST_SIZES = {"sha1": 20, "sha256": 32, "sha512": 64}
_BODY = "{body}"
_TIMESTAMP = "{timestamp}"
_TIMESTAMP_BYTES = _TIMESTAMP.encode("ascii")


class HmacScheme(SchemeBase):
    """Verifies a generic HMAC signature carried in ``header``, with secrets used verbatim as UTF-8
    keys. Options, all checked at construction: ``algorithm`` sha1|sha256|sha512 (default sha256);
    ``encoding`` hex|base64 (default hex); ``prefix`` before the digest (default none);
    ``timestamp_header`` with its ``template`` (default ``{timestamp}.{body}``; without a timestamp the
    body alone is signed) and ``tolerance`` (default 300 s); ``id_header`` or ``id_field`` (dotted JSON
    path, default ``id``) and ``type_header`` or ``type_field`` (default ``type``). Only the body and the
    timestamp are signed: with ``id_header`` the event id is ``body_event_id`` of the body (the header is
    kept as ``delivery_id``), and with ``type_header`` the type is unsigned (``Covers``)."""

    name: ClassVar[str] = "hmac"

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        tolerance: int | None = None,
        header: str | None = None,
        algorithm: str | None = None,
        encoding: str | None = None,
        prefix: str | None = None,
        timestamp_header: str | None = None,
        template: str | None = None,
        id_header: str | None = None,
        id_field: str | None = None,
        type_header: str | None = None,
        type_field: str | None = None,
    ) -> None:
        self._keys = utf8_keys(secrets)
        signature_header = option_str("header", header)
        if signature_header is None:
            raise SchemeConfigError("header: required (the name of the header carrying the signature)")
        self._header = signature_header
        self._algorithm = option_choice("algorithm", algorithm, tuple(_DIGEST_SIZES), default="sha256")
        self._encoding = option_choice("encoding", encoding, ("hex", "base64"), default="hex")
        self._prefix = "" if prefix is None else _option_prefix(prefix)
        self._timestamp_header = option_str("timestamp_header", timestamp_header)
        if self._timestamp_header is None and tolerance is not None:
            raise SchemeConfigError("tolerance: only meaningful with timestamp_header")
        self._tolerance = resolve_tolerance(tolerance)
        default_template = _BODY if self._timestamp_header is None else f"{_TIMESTAMP}.{_BODY}"
        self._before, self._after = _split_template(
            option_str("template", template, default=default_template) or default_template,
            timestamped=self._timestamp_header is not None,
        )
        self._id_header, self._id_field = _source("id", id_header, id_field)
        self._type_header, self._type_field = _source("type", type_header, type_field)
        # Headers other than the timestamp are never signed here: an id or type read from one is not.
        self.covers = Covers(
            body=True,
            timestamp=self._timestamp_header is not None,
            id=self._id_header is None,
            type=self._type_header is None,
        )

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        value = require_header(headers, self._header)
        if not value.startswith(self._prefix):
            raise SignatureMalformed(f"{self._header}: does not start with the configured prefix")
        presented = decode_digests(
            [value[len(self._prefix) :]], self._encoding, _DIGEST_SIZES[self._algorithm], self._header
        )
        raw_timestamp = ""
        timestamp = None
        if self._timestamp_header is not None:
            raw_timestamp = require_header(headers, self._timestamp_header)
            timestamp = parse_timestamp(raw_timestamp, self._timestamp_header)
        stamp = raw_timestamp.encode("ascii")
        before = self._before.replace(_TIMESTAMP_BYTES, stamp)
        after = self._after.replace(_TIMESTAMP_BYTES, stamp)
        match = hmac_matcher(self._keys, self._algorithm, presented, lambda b: before + b + after)
        index = require_match(body, match, secrets=len(self._keys), signatures=1)
        if timestamp is not None:
            check_timestamp(timestamp, now, self._tolerance)
        document = parse_json(body)
        picked_id = self._pick(headers, document, self._id_header, self._id_field, "id")
        # An id from an unsigned header is kept for logs only; identity is the signed body's digest.
        event = Event(
            id=picked_id if self._id_header is None else body_event_id(body),
            type=self._pick(headers, document, self._type_header, self._type_field, "type"),
            payload=document,
            type_signed=self._type_header is None,
            delivery_id=picked_id if self._id_header is not None else None,
        )
        return Verified(events=(event,), secret_index=index)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        stamp = str(request.timestamp).encode("ascii")
        message = (
            self._before.replace(_TIMESTAMP_BYTES, stamp)
            + request.body
            + self._after.replace(_TIMESTAMP_BYTES, stamp)
        )
        key = self._keys[0]
        mac = (hex_hmac if self._encoding == "hex" else b64_hmac)(key, message, self._algorithm)
        headers = {self._header: self._prefix + mac}
        if self._timestamp_header is not None:
            headers[self._timestamp_header] = str(request.timestamp)
        if self._id_header is not None:
            headers[self._id_header] = request.id_or_fresh()
        if self._type_header is not None:
            headers[self._type_header] = request.require_type(self._type_header)
        return request.body, headers

    @staticmethod
    def _pick(headers: Headers, document: object, header: str | None, field: str, what: str) -> str:
        if header is not None:
            value = first_header(headers, header)
            if value is None:
                raise PayloadError(f"{header} header ({what}) is missing")
            return value
        return require_text(json_field(document, field), f"body field {field!r}", allow_int=what == "id")


def _option_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise SchemeConfigError(f"prefix: expected a string, got {prefix!r}")
    return prefix


def _split_template(template: str, *, timestamped: bool) -> tuple[bytes, bytes]:
    if template.count(_BODY) != 1:
        raise SchemeConfigError("template: must contain {body} exactly once")
    before, after = template.split(_BODY)
    has_timestamp = _TIMESTAMP in before or _TIMESTAMP in after
    if timestamped and not has_timestamp:
        # An unsigned timestamp could be rewritten freely, making the tolerance check worthless.
        raise SchemeConfigError("template: must contain {timestamp} when timestamp_header is set")
    if has_timestamp and not timestamped:
        raise SchemeConfigError("template: {timestamp} needs timestamp_header")
    rest = (before + after).replace(_TIMESTAMP, "")
    if "{" in rest or "}" in rest:
        raise SchemeConfigError("template: only {body} and {timestamp} placeholders are allowed")
    try:
        return before.encode("utf-8"), after.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemeConfigError("template: not encodable as UTF-8") from None


def _source(what: str, header: str | None, field: str | None) -> tuple[str | None, str]:
    header = option_str(f"{what}_header", header)
    field = option_str(f"{what}_field", field)
    if header is not None and field is not None:
        raise SchemeConfigError(f"{what}_header, {what}_field: set one, not both")
    return header, field or what
