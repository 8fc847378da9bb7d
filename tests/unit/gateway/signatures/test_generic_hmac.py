import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from effectgate.gateway.signatures import (
    PayloadError,
    SchemeConfigError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    Verified,
    body_event_id,
    build_scheme,
)
from tests.unit.gateway.signatures.signing import HMAC_OPTIONS, NOW, hmac_headers

SECRET = "generic-secret"
BODY = json.dumps({"id": "e-1", "type": "order.created", "data": {"id": 42, "kind": "order"}}).encode()


def verify(
    body: bytes, headers: dict[str, str], now: float = NOW, tolerance: int | None = None, **options: Any
) -> Verified:
    return build_scheme("hmac", [SECRET], tolerance=tolerance, options=options).verify(body, headers, now=now)


def test_defaults_are_hex_sha256_over_the_body() -> None:
    headers = {"X-Sig": hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()}
    (event,) = verify(BODY, headers, header="X-Sig").events
    assert (event.id, event.type) == ("e-1", "order.created")


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha512"])
@pytest.mark.parametrize("encoding", ["hex", "base64"])
def test_algorithms_and_encodings(algorithm: str, encoding: str) -> None:
    digest = hmac.new(SECRET.encode(), BODY, algorithm).digest()
    value = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    headers = {"X-Sig": "sig=" + value}
    options: dict[str, Any] = {
        "header": "X-Sig",
        "algorithm": algorithm,
        "encoding": encoding,
        "prefix": "sig=",
    }
    assert verify(BODY, headers, **options).secret_index == 0
    with pytest.raises(SignatureInvalid):
        verify(BODY + b" ", headers, **options)


def test_timestamp_with_default_template() -> None:
    assert verify(BODY, hmac_headers(BODY, SECRET), **HMAC_OPTIONS).events[0].id == "e-1"


def test_timestamp_with_custom_template() -> None:
    template = "v1:{timestamp}:{body}:end"
    signature = hmac.new(SECRET.encode(), f"v1:{NOW}:".encode() + BODY + b":end", hashlib.sha256).hexdigest()
    headers = {"X-Sig": signature, "X-Ts": str(NOW)}
    assert verify(BODY, headers, header="X-Sig", timestamp_header="X-Ts", template=template).secret_index == 0


def test_ids_and_types_from_headers_or_dotted_fields() -> None:
    headers = {**hmac_headers(BODY, SECRET), "X-Event-Id": "h-1", "X-Event-Type": "h.type"}
    (event,) = verify(
        BODY, headers, **HMAC_OPTIONS, id_header="X-Event-Id", type_header="X-Event-Type"
    ).events
    # Headers are unsigned here: the id is the body's digest, the header id kept apart for logs.
    assert (event.id, event.delivery_id, event.type) == (body_event_id(BODY), "h-1", "h.type")
    assert not event.type_signed
    (event,) = verify(BODY, headers, **HMAC_OPTIONS, id_field="data.id", type_field="data.kind").events
    assert (event.id, event.type) == ("42", "order")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"^header: required"),
        ({"header": ""}, r"^header: expected a non-empty string"),
        ({"header": "X", "algorithm": "md5"}, r"^algorithm: expected one of sha1, sha256, sha512"),
        ({"header": "X", "encoding": "base32"}, r"^encoding: expected one of hex, base64"),
        ({"header": "X", "prefix": 5}, r"^prefix: expected a string"),
        (
            {"header": "X", "template": "{timestamp}.{body}"},
            r"^template: \{timestamp\} needs timestamp_header",
        ),
        (
            {"header": "X", "timestamp_header": "T", "template": "{body}"},
            r"^template: must contain \{timestamp\}",
        ),
        ({"header": "X", "template": "no body"}, r"^template: must contain \{body\} exactly once"),
        ({"header": "X", "template": "{body}{body}"}, r"^template: must contain \{body\} exactly once"),
        ({"header": "X", "template": "{id}.{body}"}, r"^template: only \{body\} and \{timestamp\}"),
        ({"header": "X", "id_header": "I", "id_field": "id"}, r"^id_header, id_field: set one, not both"),
        ({"header": "X", "type_header": "T", "type_field": "t"}, r"^type_header, type_field: set one"),
        ({"header": "X", "id_field": ["id"]}, r"^id_field: expected a non-empty string"),
        ({"header": "X", "hash": "sha256"}, r"^hash: unknown option for scheme 'hmac'"),
    ],
)
def test_options_are_validated_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message):
        build_scheme("hmac", [SECRET], options=options)


def test_tolerance_needs_a_timestamp_header() -> None:
    with pytest.raises(SchemeConfigError, match=r"^tolerance: only meaningful with timestamp_header"):
        build_scheme("hmac", [SECRET], tolerance=60, options={"header": "X"})
    with pytest.raises(TimestampOutOfTolerance, match="61 s in the past; tolerance is 60 s"):
        verify(BODY, hmac_headers(BODY, SECRET), now=NOW + 61, tolerance=60, **HMAC_OPTIONS)


@pytest.mark.parametrize("missing", ["X-Signature", "X-Timestamp"])
def test_missing_headers(missing: str) -> None:
    headers = hmac_headers(BODY, SECRET)
    del headers[missing]
    with pytest.raises(SignatureMissing, match=missing):
        verify(BODY, headers, **HMAC_OPTIONS)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Signature", "a" * 64),  # prefix missing
        ("X-Signature", "sha256=" + "q" * 64),
        ("X-Signature", "sha256=" + "a" * 62),
        ("X-Signature", "sha256=" + "ø" * 64),
        ("X-Timestamp", "17e8"),
        ("X-Timestamp", "nan"),
        ("X-Timestamp", "-1"),
    ],
)
def test_malformed_headers(name: str, value: str) -> None:
    with pytest.raises(SignatureMalformed):
        verify(BODY, {**hmac_headers(BODY, SECRET), name: value}, **HMAC_OPTIONS)


@pytest.mark.parametrize(("shift", "direction"), [(301, "past"), (-301, "future")])
def test_stale_and_future(shift: int, direction: str) -> None:
    with pytest.raises(TimestampOutOfTolerance, match=direction):
        verify(BODY, hmac_headers(BODY, SECRET), now=NOW + shift, **HMAC_OPTIONS)


def test_timestamp_is_signed() -> None:
    headers = {**hmac_headers(BODY, SECRET), "X-Timestamp": str(NOW + 1)}
    with pytest.raises(SignatureInvalid):
        verify(BODY, headers, **HMAC_OPTIONS)


@pytest.mark.parametrize(
    "body", [b"plain text", b'{"type": "x"}', b'{"id": "1", "type": ""}', b'{"id": true, "type": "x"}']
)
def test_verified_but_unusable_body(body: bytes) -> None:
    with pytest.raises(PayloadError):
        verify(body, hmac_headers(body, SECRET), **HMAC_OPTIONS)


def test_missing_id_header_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="X-Event-Id"):
        verify(BODY, hmac_headers(BODY, SECRET), **HMAC_OPTIONS, id_header="X-Event-Id")
