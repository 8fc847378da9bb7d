import json

import pytest

from effectgate.gateway.signatures import (
    PayloadError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    Verified,
    body_event_id,
    build_scheme,
)
from tests.unit.gateway.signatures.signing import shopify_headers

SECRET = "shpss_0123456789abcdef"
BODY = json.dumps({"id": 820982911946154508, "email": "jon@example.com"}).encode()


def verify(body: bytes, headers: dict[str, str], secrets: tuple[str, ...] = (SECRET,)) -> Verified:
    return build_scheme("shopify", secrets).verify(body, headers)


def test_accepted_with_id_and_topic_from_headers() -> None:
    verified = verify(BODY, shopify_headers(BODY, SECRET))
    (event,) = verified.events
    assert (event.id, event.delivery_id, event.type) == (
        body_event_id(BODY),
        "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        "orders/create",
    )
    assert not event.type_signed
    assert event.payload["id"] == 820982911946154508
    assert verified.secret_index == 0


def test_event_id_header_is_the_fallback() -> None:
    headers = shopify_headers(BODY, SECRET)
    del headers["X-Shopify-Webhook-Id"]
    headers["x-shopify-event-id"] = "evt-98"
    assert verify(BODY, headers).events[0].delivery_id == "evt-98"


def test_rotation() -> None:
    assert verify(BODY, shopify_headers(BODY, SECRET), secrets=("old", SECRET)).secret_index == 1


def test_missing_signature() -> None:
    headers = shopify_headers(BODY, SECRET)
    del headers["X-Shopify-Hmac-Sha256"]
    with pytest.raises(SignatureMissing, match="X-Shopify-Hmac-Sha256"):
        verify(BODY, headers)


@pytest.mark.parametrize(
    "value",
    [
        "not base64!",
        "YWJj",  # valid base64, 3 bytes
        "a" * 64,  # hex where base64 is expected
        "3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3",  # unpadded
        "3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3q2+7w3=" + "=",
        "ë" * 44,
    ],
)
def test_malformed_signature(value: str) -> None:
    with pytest.raises(SignatureMalformed):
        verify(BODY, {**shopify_headers(BODY, SECRET), "X-Shopify-Hmac-Sha256": value})


@pytest.mark.parametrize(
    ("body", "secret"), [(BODY + b"\n", SECRET), (BODY, "other")], ids=["tampered", "wrong-secret"]
)
def test_invalid_signature(body: bytes, secret: str) -> None:
    with pytest.raises(SignatureInvalid):
        verify(body, shopify_headers(BODY, secret))


@pytest.mark.parametrize("missing", ["X-Shopify-Webhook-Id", "X-Shopify-Topic"])
def test_missing_id_or_topic_is_a_payload_error(missing: str) -> None:
    headers = shopify_headers(BODY, SECRET)
    del headers[missing]
    with pytest.raises(PayloadError):
        verify(BODY, headers)


def test_non_json_body_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        verify(b"<xml/>", shopify_headers(b"<xml/>", SECRET))
