"""Standard Webhooks, signed with the reference ``standardwebhooks`` library and cross-checked with it."""

import base64
import json
import time
from datetime import UTC, datetime

import pytest
import standardwebhooks
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from effectgate.gateway.signatures import (
    PayloadError,
    SchemeConfigError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    Verified,
    build_scheme,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER = "whsec_" + base64.b64encode(b"another secret of 24 byte").decode()
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
BODY = json.dumps({"type": "invoice.paid", "data": {"id": "in_1"}})


def signed(body: str = BODY, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    signature = standardwebhooks.Webhook(secret).sign(MSG_ID, datetime.fromtimestamp(ts, tz=UTC), body)
    return {"webhook-id": MSG_ID, "webhook-timestamp": str(ts), "webhook-signature": signature}


def reference_accepts(body: str, headers: dict[str, str], secret: str = SECRET) -> bool:
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def verify(
    headers: dict[str, str],
    body: str | bytes = BODY,
    secrets: tuple[str, ...] = (SECRET,),
    now: float | None = None,
) -> Verified:
    raw = body.encode() if isinstance(body, str) else body
    return build_scheme("standard-webhooks", secrets).verify(raw, headers, now=now)


def test_signed_by_the_reference_library_is_accepted_by_both() -> None:
    headers = signed()
    assert reference_accepts(BODY, headers)
    verified = verify(headers)
    (event,) = verified.events
    assert (event.id, event.type, event.payload) == (MSG_ID, "invoice.paid", json.loads(BODY))
    assert verified.secret_index == 0


def test_published_vector_from_the_reference_library() -> None:
    # libraries/python/tests/test_webhooks.py::test_sign_function in standard-webhooks/standard-webhooks.
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    # The vector's body has no "type": getting past the signature to the payload check proves it matched.
    with pytest.raises(PayloadError, match="'type'"):
        verify(headers, '{"test": 2432232314}', now=1614265330)


@pytest.mark.parametrize(
    ("body", "secret", "age"),
    [
        (BODY.replace("paid", "voided"), SECRET, 0),
        (BODY, OTHER, 0),
        (BODY, SECRET, 301),
        (BODY, SECRET, -301),
    ],
    ids=["tampered-body", "wrong-secret", "stale", "future"],
)
def test_both_the_reference_and_we_reject(body: str, secret: str, age: int) -> None:
    headers = signed(BODY, secret, timestamp=int(time.time()) - age)
    assert not reference_accepts(body, headers)
    with pytest.raises(SignatureInvalid if age == 0 else TimestampOutOfTolerance):
        verify(headers, body)


def test_svix_headers_and_any_case_are_accepted() -> None:
    headers = {k.replace("webhook", "Svix").upper(): v for k, v in signed().items()}
    assert verify(headers).events[0].id == MSG_ID


@pytest.mark.parametrize(
    "secret", [SECRET.removeprefix("whsec_"), "whsec_" + base64.b64encode(b"x" * 32).decode().rstrip("=")]
)
def test_secret_without_prefix_or_padding_is_base64_like_the_reference(secret: str) -> None:
    headers = signed(secret=secret)
    assert verify(headers, secrets=(secret,)).secret_index == 0


def test_rotation_and_a_list_with_other_versions() -> None:
    headers = signed()
    junk = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
    headers["webhook-signature"] = f"{junk} v2,abc= {headers['webhook-signature']} {junk}"
    assert reference_accepts(BODY, headers)
    assert verify(headers, secrets=(OTHER, SECRET)).secret_index == 1


def ed25519_keys() -> tuple[Ed25519PrivateKey, str]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, "whpk_" + base64.b64encode(raw).decode()


def v1a_headers(private: Ed25519PrivateKey, body: str = BODY, ts: int = 1_700_000_000) -> dict[str, str]:
    # Per the spec: Ed25519 over the same "<id>.<timestamp>.<body>" content, base64, version "v1a".
    signature = private.sign(f"{MSG_ID}.{ts}.".encode() + body.encode())
    return {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(ts),
        "webhook-signature": "v1a," + base64.b64encode(signature).decode(),
    }


def test_ed25519_v1a_with_a_mixed_secret_list() -> None:
    private, public = ed25519_keys()
    headers = v1a_headers(private)
    assert verify(headers, secrets=(SECRET, public), now=1_700_000_000).secret_index == 1
    _, stranger = ed25519_keys()
    with pytest.raises(SignatureInvalid):
        verify(headers, secrets=(SECRET, stranger), now=1_700_000_000)
    with pytest.raises(SignatureInvalid):
        verify(headers, BODY + " ", secrets=(public,), now=1_700_000_000)


def test_v1_and_v1a_side_by_side() -> None:
    private, public = ed25519_keys()
    ts = 1_700_000_000
    headers = signed(timestamp=ts)
    headers["webhook-signature"] += " " + v1a_headers(private, ts=ts)["webhook-signature"]
    assert verify(headers, secrets=(public,), now=ts).secret_index == 0
    assert verify(headers, secrets=(OTHER, SECRET), now=ts).secret_index == 1


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("whsec_not*base64", r"^secrets\[0\]: not valid base64"),
        ("whsec_", r"^secrets\[0\]: decodes to an empty key"),
        ("whpk_" + base64.b64encode(b"short").decode(), r"^secrets\[0\]: whpk_ key must be 32 bytes"),
        ("whsk_" + base64.b64encode(b"k" * 64).decode(), r"^secrets\[0\]: whsk_ is a private signing key"),
    ],
)
def test_bad_keys_are_refused_at_construction(secret: str, message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message):
        build_scheme("standard-webhooks", [secret])


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_missing_header(missing: str) -> None:
    headers = signed()
    del headers[missing]
    with pytest.raises(SignatureMissing, match=missing):
        verify(headers)


@pytest.mark.parametrize(
    "timestamp", ["hello", "", " 1700000000", "1700000000.5", "nan", "-1", "1e9", "9" * 400]
)
def test_malformed_timestamp(timestamp: str) -> None:
    headers = {**signed(timestamp=1_700_000_000), "webhook-timestamp": timestamp}
    expected = SignatureMissing if timestamp == "" else SignatureMalformed
    with pytest.raises(expected):
        verify(headers, now=1_700_000_000)


@pytest.mark.parametrize(
    "signature",
    [
        "v1",
        "v1,",
        "v1,!!!!",
        "v1,YWJj",
        "v1a,YWJj",
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE",
        "  ",
        "v1,ü",
    ],
)
def test_malformed_signature(signature: str) -> None:
    headers = {**signed(timestamp=1_700_000_000), "webhook-signature": signature}
    expected = SignatureMissing if not signature.strip() else SignatureMalformed
    with pytest.raises(expected):
        verify(headers, now=1_700_000_000)


def test_only_unknown_versions_is_unsupported() -> None:
    headers = {**signed(timestamp=1_700_000_000), "webhook-signature": "v2,abc v3,def"}
    with pytest.raises(UnsupportedSignatureVersion):
        verify(headers, now=1_700_000_000)


@pytest.mark.parametrize("body", ["not json", '{"data": {}}', '{"type": null}', "[]"])
def test_verified_but_unusable_body(body: str) -> None:
    with pytest.raises(PayloadError):
        verify(signed(body), body)
