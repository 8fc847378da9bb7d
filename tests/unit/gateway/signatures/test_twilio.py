"""Twilio, against Twilio's published validator vectors (tests/data/twilio_request_validator_vectors.json)."""

import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from effectgate.gateway.signatures import (
    SchemeConfigError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    Verified,
    body_event_id,
    build_scheme,
    twilio,
)
from tests.unit.gateway.signatures.signing import b64_mac

VECTORS = json.loads(
    (Path(__file__).parents[3] / "data" / "twilio_request_validator_vectors.json").read_text()
)
TOKEN = VECTORS["token"]
URL = VECTORS["url"]
PARAMS = VECTORS["form"]["params"]
FORM = urlencode(PARAMS).encode()
FORM_HEADERS = {
    "X-Twilio-Signature": VECTORS["form"]["signature"],
    "Content-Type": "application/x-www-form-urlencoded",
}
JSON_BODY = VECTORS["json"]["body"].encode()
JSON_HEADERS = {
    "X-Twilio-Signature": VECTORS["json"]["signature"],
    "Content-Type": "application/json",
    "I-Twilio-Idempotency-Token": "idem-7",
}


def verify(body: bytes, headers: dict[str, str], url: str = URL, **options: Any) -> Verified:
    return build_scheme("twilio", [TOKEN], options={"url": url, **options}).verify(body, headers)


def test_form_vector() -> None:
    (event,) = verify(FORM, FORM_HEADERS).events
    assert (event.id, event.type) == (body_event_id(FORM), "twilio.request")
    assert event.payload == PARAMS


def test_form_parameter_order_in_the_body_does_not_matter() -> None:
    body = urlencode(dict(reversed(PARAMS.items()))).encode()
    assert verify(body, FORM_HEADERS).secret_index == 0


def test_duplicate_parameters_vector() -> None:
    body = VECTORS["duplicate_params"]["body"].encode()
    headers = {
        **FORM_HEADERS,
        "X-Twilio-Signature": VECTORS["duplicate_params"]["signature"],
        "I-Twilio-Idempotency-Token": "i",
    }
    (event,) = verify(body, headers).events
    assert event.payload == {"Sid": "CA123", "SidAccount": "AC123", "Digits": ["5678", "1234"]}


@pytest.mark.parametrize(
    ("url", "signature"),
    [(v["url"], v["signature"]) for v in VECTORS["url_port_variants"]],
    ids=[v["note"] for v in VECTORS["url_port_variants"]],
)
def test_url_port_variants(url: str, signature: str) -> None:
    assert verify(FORM, {**FORM_HEADERS, "X-Twilio-Signature": signature}, url=url).secret_index == 0


def test_json_body_vector_with_body_sha256() -> None:
    assert hashlib.sha256(JSON_BODY).hexdigest() == VECTORS["json"]["body_sha256"]
    (event,) = verify(JSON_BODY, JSON_HEADERS).events
    assert (event.id, event.delivery_id, event.type, event.payload) == (
        body_event_id(JSON_BODY),
        "idem-7",
        "twilio.request",
        {"property": "value", "boolean": True},
    )
    with pytest.raises(SignatureInvalid):
        verify(JSON_BODY.replace(b"true", b"false"), JSON_HEADERS)


def test_type_from_option_or_sms_status() -> None:
    assert verify(FORM, FORM_HEADERS, event_type="voice.gather").events[0].type == "voice.gather"
    body = b"MessageSid=SM1&SmsStatus=delivered"
    headers = {**FORM_HEADERS, "X-Twilio-Signature": sign(URL + "MessageSidSM1SmsStatusdelivered")}
    (event,) = verify(body, headers).events
    assert (event.id, event.type) == (body_event_id(body), "delivered")


def sign(text: str, token: str = TOKEN) -> str:
    return b64_mac(token.encode(), text.encode(), "sha1")


def test_missing_signature() -> None:
    with pytest.raises(SignatureMissing, match="X-Twilio-Signature"):
        verify(FORM, {"Content-Type": "application/x-www-form-urlencoded"})


@pytest.mark.parametrize("value", ["RSOYDt4T1cUTdK1PDd93/VVr8B8", "not-base64!", "YWJj", "é" * 28])
def test_malformed_signature(value: str) -> None:
    with pytest.raises(SignatureMalformed):
        verify(FORM, {**FORM_HEADERS, "X-Twilio-Signature": value})


@pytest.mark.parametrize(
    "body", [FORM + b"&Extra=1", FORM.replace(b"1234", b"4321"), b"%ff=1", b"\xff\xfe", b"a=1&" * 1001]
)
def test_invalid_signature(body: bytes) -> None:
    with pytest.raises(SignatureInvalid):
        verify(body, FORM_HEADERS)


def test_a_body_without_a_sid_still_has_a_signed_id() -> None:
    # The id no longer comes from MessageSid/CallSid or the unsigned token header, but from the body.
    body = b"Sid=CA123&SidAccount=AC123&Digits=5678&Digits=1234"
    (event,) = verify(body, {**FORM_HEADERS, "X-Twilio-Signature": "IK+Dwps556ElfBT0I3Rgjkr1wJU="}).events
    assert (event.id, event.delivery_id) == (body_event_id(body), None)


def test_the_signature_not_the_content_type_decides_the_reading() -> None:
    # Each vector sent with the other Content-Type is read as it was signed.
    (form,) = verify(FORM, {**FORM_HEADERS, "Content-Type": "application/json"}).events
    assert (form.id, form.payload) == (body_event_id(FORM), verify(FORM, FORM_HEADERS).events[0].payload)
    (js,) = verify(JSON_BODY, {**JSON_HEADERS, "Content-Type": "application/x-www-form-urlencoded"}).events
    assert js.payload == {"property": "value", "boolean": True}


def test_a_form_spelling_a_json_signature_is_refused() -> None:
    # Twilio signs a JSON body as url?bodySHA256=<hex>; a form whose one parameter name is
    # "?bodySHA256=<hex>" concatenates to the same string, so a captured JSON signature would vouch for it.
    suffix = twilio.json_url(URL, JSON_BODY)[len(URL) :]  # "?bodySHA256=<hex>", or "&…" after a query
    forged = urlencode({suffix: ""}).encode()
    headers = {**JSON_HEADERS, "Content-Type": "application/x-www-form-urlencoded"}
    with pytest.raises(SignatureInvalid):
        verify(forged, headers)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"^url: required"),
        ({"url": "/relative"}, r"^url: expected an absolute http"),
        ({"url": "ftp://x/"}, r"^url: expected an absolute http"),
        ({"url": "https://x:notaport/"}, r"^url: not a valid URL"),
        ({"url": URL, "event_type": ""}, r"^event_type: expected a non-empty string"),
    ],
)
def test_options_are_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message):
        build_scheme("twilio", [TOKEN], options=options)
