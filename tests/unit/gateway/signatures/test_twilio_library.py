"""Twilio, with the ``twilio`` package's ``RequestValidator`` as the reference signer and judge."""

from __future__ import annotations

import hashlib
import json
from urllib.parse import parse_qs, urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twilio.request_validator import RequestValidator

from effectgate.gateway.signatures import (
    SignatureInvalid,
    SignatureMalformed,
    UnsupportedSignatureVersion,
    VerificationError,
    body_event_id,
    build_scheme,
)

TOKEN = "twilio-auth-token-0123456789abcdef"
SHARED_KEY = "twilio-shared-key-secret"
URL = "https://hooks.example.test/webhooks/twilio?tenant=acme"
FORM = {"MessageSid": "SM1", "SmsStatus": "delivered", "To": "+15558675309", "Body": "Hé & bye=1"}
SHA256_SETTINGS = "key=webhooks_sharedkey_123,algorithm=HMAC_SHA256"


def form_headers(
    params: dict[str, str], token: str = TOKEN, url: str = URL, algorithm: str | None = None
) -> dict[str, str]:
    headers = {
        "X-Twilio-Signature": RequestValidator(token).compute_signature(url, params, algorithm),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    if algorithm:
        headers["X-Twilio-Webhooks-Signature-Settings"] = f"key=webhooks_sharedkey_123,algorithm={algorithm}"
    return headers


def json_headers(body: bytes, token: str = TOKEN) -> dict[str, str]:
    signed_url = f"{URL}&bodySHA256={hashlib.sha256(body).hexdigest()}"
    return {
        "X-Twilio-Signature": RequestValidator(token).compute_signature(signed_url, {}),
        "Content-Type": "application/json",
        "I-Twilio-Idempotency-Token": "idem-1",
    }


def ours(body: bytes, headers: dict[str, str], secrets: tuple[str, ...] = (TOKEN,)) -> bool:
    try:
        build_scheme("twilio", list(secrets), options={"url": URL}).verify(body, headers)
    except SignatureInvalid:
        return False
    return True


def theirs(body: bytes, headers: dict[str, str], token: str = TOKEN) -> bool:
    validator = RequestValidator(token)
    algorithm = None
    if "X-Twilio-Webhooks-Signature-Settings" in headers:
        algorithm = headers["X-Twilio-Webhooks-Signature-Settings"].rsplit("=", 1)[1]
    if headers["Content-Type"] == "application/json":
        signed_url = f"{URL}&bodySHA256={hashlib.sha256(body).hexdigest()}"
        return bool(validator.validate(signed_url, body.decode(), headers["X-Twilio-Signature"], algorithm))
    params = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
    return bool(validator.validate(URL, params, headers["X-Twilio-Signature"], algorithm))


def test_a_form_signed_by_twilio_is_accepted_by_both() -> None:
    body = urlencode(FORM).encode()
    headers = form_headers(FORM)
    assert theirs(body, headers) and ours(body, headers)
    (event,) = build_scheme("twilio", [TOKEN], options={"url": URL}).verify(body, headers).events
    assert (event.id, event.type, event.payload) == (body_event_id(body), "delivered", FORM)


def test_a_json_body_signed_by_twilio_is_accepted_by_both() -> None:
    body = json.dumps({"event": "com.twilio.messaging.message.delivered", "sid": "SM2"}).encode()
    headers = json_headers(body)
    assert theirs(body, headers) and ours(body, headers)


def test_sharedkey_hmac_sha256_signed_by_twilio_is_accepted_by_both() -> None:
    body = urlencode(FORM).encode()
    headers = form_headers(FORM, token=SHARED_KEY, algorithm="HMAC_SHA256")
    assert theirs(body, headers, token=SHARED_KEY)
    assert ours(body, headers, secrets=(TOKEN, SHARED_KEY))
    verified = build_scheme("twilio", [TOKEN, SHARED_KEY], options={"url": URL}).verify(body, headers)
    assert verified.secret_index == 1
    # A SHA-1 signature under a header claiming SHA-256 is the wrong size: malformed, not accepted.
    with pytest.raises(SignatureMalformed):
        build_scheme("twilio", [TOKEN], options={"url": URL}).verify(
            body, {**form_headers(FORM), "X-Twilio-Webhooks-Signature-Settings": SHA256_SETTINGS}
        )


def test_an_unknown_algorithm_is_unsupported_and_named() -> None:
    body = urlencode(FORM).encode()
    headers = {**form_headers(FORM), "X-Twilio-Webhooks-Signature-Settings": "key=k,algorithm=HMAC_SHA3"}
    with pytest.raises(UnsupportedSignatureVersion, match="'HMAC_SHA3'; supported: HMAC_SHA1, HMAC_SHA256"):
        build_scheme("twilio", [TOKEN], options={"url": URL}).verify(body, headers)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (urlencode({**FORM, "Body": "changed"}).encode(), form_headers(FORM)),
        (urlencode({**FORM, "Extra": "1"}).encode(), form_headers(FORM)),
        (urlencode(FORM).encode(), form_headers(FORM, token="someone-else")),
        (urlencode(FORM).encode(), form_headers(FORM, url=URL.replace("acme", "other"))),
        (b'{"sid": "SM3"}', json_headers(b'{"sid": "SM2"}')),
    ],
    ids=["changed-value", "extra-param", "other-token", "other-url", "json-other-body"],
)
def test_what_we_reject_twilio_rejects_too(body: bytes, headers: dict[str, str]) -> None:
    assert not ours(body, headers)
    assert not theirs(body, headers)


PARAMS = st.dictionaries(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    max_size=5,
)


@settings(max_examples=150, deadline=None, database=None)
@given(params=PARAMS, tamper=st.booleans(), algorithm=st.sampled_from([None, "HMAC_SHA256"]))
def test_twilio_and_we_agree_on_any_form(params: dict[str, str], tamper: bool, algorithm: str | None) -> None:
    headers = form_headers(params, algorithm=algorithm)
    body = urlencode({**params, "Tampered": "1"} if tamper else params).encode()
    try:
        mine = ours(body, headers)
    except VerificationError as exc:  # authentic, but no MessageSid/CallSid to name the event by
        assert exc.code == "malformed_payload"
        mine = True
    assert mine == theirs(body, headers) == (not tamper)
