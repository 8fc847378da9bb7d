"""Stripe, signed with the ``stripe`` library's own helper and cross-checked against its verifier."""

import json
import time

import pytest
import stripe
from starlette.datastructures import Headers

from effectgate.gateway.signatures import (
    PayloadError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    Verified,
    build_scheme,
)
from tests.unit.gateway.signatures.signing import hex_mac

SECRET = "whsec_test_secret_abc123"
OLD_SECRET = "whsec_old_secret_xyz789"
# Stripe sends its events pretty-printed, which is what makes proxy re-encoding visible.
BODY = json.dumps(
    {"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": "payment_intent.succeeded", "data": {}},
    indent=2,
)


def stripe_header(body: str = BODY, secret: str = SECRET, timestamp: int | None = None) -> str:
    # The library's own test helper: "t=<timestamp>,v1=<hex>".
    header: str = stripe.WebhookSignature.generate_signature_header(body, secret, timestamp=timestamp)
    return header


def stripe_accepts(body: str, header: str, secret: str = SECRET) -> bool:
    try:
        stripe.Webhook.construct_event(body, header, secret)
    except stripe.SignatureVerificationError:
        return False
    return True


def verify(
    header: str, body: str = BODY, secrets: tuple[str, ...] = (SECRET,), now: float | None = None
) -> Verified:
    return build_scheme("stripe", secrets).verify(body.encode(), {"Stripe-Signature": header}, now=now)


def test_a_header_made_by_stripe_is_accepted_by_both() -> None:
    header = stripe_header()
    assert stripe_accepts(BODY, header)
    verified = verify(header)
    (event,) = verified.events
    assert event.id == "evt_1NG8Du2eZvKYlo2CUI79vXWy"
    assert event.type == "payment_intent.succeeded"
    assert event.payload == json.loads(BODY)
    assert verified.secret_index == 0
    assert verified.challenge is None


def test_header_names_are_case_insensitive_and_starlette_headers_work() -> None:
    header = stripe_header()
    scheme = build_scheme("stripe", [SECRET])
    for headers in ({"STRIPE-SIGNATURE": header}, {"stripe-signature": header}):
        scheme.verify(BODY.encode(), headers)
    starlette = Headers(raw=[(b"stripe-signature", header.encode("latin-1"))])
    assert scheme.verify(BODY.encode(), starlette).events[0].type == "payment_intent.succeeded"


@pytest.mark.parametrize(
    ("body", "secret", "age"),
    [
        (BODY.replace("succeeded", "failed"), SECRET, 0),
        (BODY, "whsec_somebody_else", 0),
        (BODY, SECRET, 301),
    ],
    ids=["tampered-body", "wrong-secret", "stale"],
)
def test_both_stripe_and_we_reject(body: str, secret: str, age: int) -> None:
    header = stripe_header(BODY, secret, timestamp=int(time.time()) - age)
    assert not stripe_accepts(body, header)
    with pytest.raises(SignatureInvalid if age == 0 else TimestampOutOfTolerance):
        verify(header, body)


def test_rotation_second_secret_matches_with_index_1() -> None:
    header = stripe_header(secret=SECRET)
    assert verify(header, secrets=(OLD_SECRET, SECRET)).secret_index == 1
    assert verify(header, secrets=(SECRET, OLD_SECRET)).secret_index == 0


def test_two_v1_entries_where_only_the_second_is_valid() -> None:
    t = int(time.time())
    good = hex_mac(SECRET, f"{t}.{BODY}".encode())
    bad = hex_mac(OLD_SECRET, f"{t}.{BODY}".encode())
    header = f"t={t},v1={bad},v1={good}"
    assert stripe_accepts(BODY, header)
    assert verify(header).secret_index == 0


def test_v0_and_unknown_schemes_are_ignored_next_to_v1() -> None:
    t = int(time.time())
    header = f"t={t},v0={'0' * 64},v1={hex_mac(SECRET, f'{t}.{BODY}'.encode())},scheme2=x"
    assert verify(header).secret_index == 0


def test_timestamp_tolerance_is_300_seconds_both_ways() -> None:
    t = 1_700_000_000
    header = stripe_header(timestamp=t)
    verify(header, now=t + 300)
    verify(header, now=t - 300)
    with pytest.raises(TimestampOutOfTolerance, match="301 s in the past; tolerance is 300 s"):
        verify(header, now=t + 301)
    with pytest.raises(TimestampOutOfTolerance, match="301 s in the future"):
        verify(header, now=t - 301)


def test_a_nan_clock_fails_closed() -> None:
    with pytest.raises(TimestampOutOfTolerance):
        verify(stripe_header(timestamp=1_700_000_000), now=float("nan"))


@pytest.mark.parametrize("value", ["", None])
def test_missing_or_empty_header(value: str | None) -> None:
    headers = {} if value is None else {"Stripe-Signature": value}
    with pytest.raises(SignatureMissing, match="Stripe-Signature header is missing"):
        build_scheme("stripe", [SECRET]).verify(BODY.encode(), headers)


GOOD_HEX = "a" * 64


@pytest.mark.parametrize(
    "header",
    [
        f"v1={GOOD_HEX}",  # no t=
        "t=1700000000",  # no signature at all
        f"t=1700000000,t=1700000001,v1={GOOD_HEX}",  # ambiguous timestamp
        f"t=abc,v1={GOOD_HEX}",
        f"t=,v1={GOOD_HEX}",
        f"t=nan,v1={GOOD_HEX}",
        f"t=NaN,v1={GOOD_HEX}",
        f"t=inf,v1={GOOD_HEX}",
        f"t=1.7e9,v1={GOOD_HEX}",
        f"t=-1700000000,v1={GOOD_HEX}",
        f"t=+1700000000,v1={GOOD_HEX}",
        f"t={'9' * 5000},v1={GOOD_HEX}",  # huge: int() would refuse it with ValueError
        f"t=\u0661\u0667\u0660\u0660,v1={GOOD_HEX}",  # Arabic-Indic digits: isdigit() but not ASCII
        f"t=1700000000,v1={'z' * 64}",  # non-hex
        f"t=1700000000,v1={'a' * 63}",  # odd length
        f"t=1700000000,v1={'a' * 40}",  # a SHA-1 length digest
        "t=1700000000,v1=é" + "a" * 63,
        f"t=1700000000,v1={GOOD_HEX},garbage",  # an item without "="
        "garbage",
        ",",
    ],
)
def test_malformed_headers(header: str) -> None:
    with pytest.raises(SignatureMalformed):
        verify(header, now=1_700_000_000)


def test_only_other_schemes_is_unsupported_version() -> None:
    with pytest.raises(UnsupportedSignatureVersion):
        verify(f"t=1700000000,v0={GOOD_HEX}", now=1_700_000_000)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"type": "x"}',
        b'{"id": "evt_1"}',
        b'{"id": "evt_1", "type": 5}',
        b'{"id": "", "type": "x"}',
        b"[1, 2]",
        b'{"id": "evt_1", "type": "x", "amount": NaN}',
        b'\xff\xfe{"id": "evt_1"}',
        b"[" * 100_000,
    ],
)
def test_verified_but_unusable_body_is_a_payload_error(body: bytes) -> None:
    t = 1_700_000_000
    header = f"t={t},v1={hex_mac(SECRET, f'{t}.'.encode() + body)}"
    with pytest.raises(PayloadError):
        build_scheme("stripe", [SECRET]).verify(body, {"Stripe-Signature": header}, now=t)
