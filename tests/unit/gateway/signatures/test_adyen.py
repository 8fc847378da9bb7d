"""Adyen: Adyen's published vectors, and its own library (``Adyen.util``) as the signer and the judge."""

from __future__ import annotations

import base64
import copy
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from Adyen.util import generate_notification_sig, is_valid_hmac_notification
from hypothesis import given, settings
from hypothesis import strategies as st

from effectgate.gateway.signatures import (
    PayloadError,
    SchemeConfigError,
    SignatureError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    VerificationError,
    Verified,
    build_scheme,
)

VECTORS = json.loads((Path(__file__).parents[3] / "data" / "adyen_hmac_vectors.json").read_text())["vectors"]
KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
OTHER_KEY = "74F490DD33F7327BAECC88B2947C011FC02D014A473AAA33A8EC93E4DC069174"


def item(
    psp: str = "7914073381342284", event: str = "AUTHORISATION", key: str = KEY, **fields: Any
) -> dict[str, Any]:
    """A notification item signed by the Adyen library."""
    unsigned = {
        "pspReference": psp,
        "merchantReference": "order-1001",
        "merchantAccountCode": "TestMerchant",
        "amount": {"currency": "EUR", "value": 1130},
        "eventCode": event,
        "success": "true",
        **fields,
    }
    signature = generate_notification_sig(unsigned, key).decode()
    return {**unsigned, "additionalData": {"hmacSignature": signature}}


def notification(*items: dict[str, Any]) -> bytes:
    return json.dumps(
        {"live": "false", "notificationItems": [{"NotificationRequestItem": i} for i in items]}
    ).encode()


def verify(body: bytes, keys: tuple[str, ...] = (KEY,)) -> Verified:
    return build_scheme("adyen", list(keys)).verify(body, {"Content-Type": "application/json"})


def adyen_accepts(one: dict[str, Any], key: str = KEY) -> bool:
    try:
        return bool(is_valid_hmac_notification(one, key))
    except (ValueError, KeyError, TypeError):
        return False


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_adyens_published_vectors(vector: dict[str, Any]) -> None:
    verified = verify(notification(vector["item"]), keys=(vector["hmac_key"],))
    (event,) = verified.events
    assert event.id == f"{vector['item']['pspReference']}:AUTHORISATION"
    assert event.type == "AUTHORISATION"
    assert event.payload == vector["item"]
    assert verified.acknowledgement == b"[accepted]"


def test_an_item_signed_by_the_adyen_library_is_accepted_by_both() -> None:
    one = item()
    assert adyen_accepts(one)
    assert verify(notification(one)).secret_index == 0


def test_a_batch_becomes_one_event_per_item() -> None:
    body = notification(item("A1"), item("A1", "CAPTURE"), item("B2", "REFUND"))
    assert [(e.id, e.type) for e in verify(body).events] == [
        ("A1:AUTHORISATION", "AUTHORISATION"),
        ("A1:CAPTURE", "CAPTURE"),
        ("B2:REFUND", "REFUND"),
    ]


def test_one_bad_item_fails_the_whole_delivery() -> None:
    bad = item("B2")
    bad["amount"] = {"currency": "EUR", "value": 1}
    assert not adyen_accepts(bad)
    with pytest.raises(SignatureInvalid, match="item 2 of 3: hmacSignature matches none of the 1 configured"):
        verify(notification(item("A1"), bad, item("C3")))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pspReference", "7914073381342285"),
        ("merchantReference", "order-1002"),
        ("merchantAccountCode", "OtherMerchant"),
        ("eventCode", "CANCELLATION"),
        ("success", "false"),
        ("originalReference", "8313842560770001"),
        ("amount", {"currency": "USD", "value": 1130}),
        ("amount", {"currency": "EUR", "value": 1131}),
    ],
)
def test_every_signed_field_is_covered_and_adyen_agrees(field: str, value: Any) -> None:
    tampered = {**item(), field: value}
    assert not adyen_accepts(tampered)
    with pytest.raises(SignatureInvalid):
        verify(notification(tampered))


def test_unsigned_fields_may_change_and_re_encoding_is_harmless() -> None:
    changed = {**item(), "reason": "edited by a proxy", "eventDate": "2030-01-01T00:00:00Z"}
    assert adyen_accepts(changed)
    assert verify(notification(changed)).secret_index == 0
    pretty = json.dumps(json.loads(notification(item())), indent=4, sort_keys=True).encode()
    assert verify(pretty).secret_index == 0


def test_key_rotation_reports_the_matching_position() -> None:
    assert verify(notification(item(key=OTHER_KEY)), keys=(KEY, OTHER_KEY)).secret_index == 1
    with pytest.raises(SignatureInvalid, match="none of the 2 configured HMAC key"):
        verify(notification(item(key=OTHER_KEY)), keys=(KEY, KEY.lower()))


def test_a_lowercase_hex_key_is_the_same_key() -> None:
    assert verify(notification(item()), keys=(KEY.lower(),)).secret_index == 0


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"not json", SignatureMalformed, "not JSON"),
        (b"\xff", SignatureMalformed, "not JSON"),
        (b'{"live": NaN}', SignatureMalformed, "not JSON"),
        (b"[]", SignatureMissing, "no notificationItems"),
        (b'{"notificationItems": []}', SignatureMissing, "no notificationItems"),
        (b'{"notificationItems": {}}', SignatureMissing, "no notificationItems"),
        (b'{"notificationItems": [1]}', SignatureMalformed, "item 1 of 1 is not a NotificationRequestItem"),
        (b'{"notificationItems": [{"NotificationRequestItem": []}]}', SignatureMalformed, "not a Notif"),
    ],
)
def test_bodies_that_carry_nothing_to_verify(body: bytes, error: type[SignatureError], message: str) -> None:
    with pytest.raises(error, match=message):
        verify(body)


def without_signature(one: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in one.items() if k != "additionalData"}


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (without_signature, SignatureMissing, "additionalData.hmacSignature is missing"),
        (lambda i: {**i, "additionalData": {}}, SignatureMissing, "hmacSignature is missing"),
        (lambda i: {**i, "additionalData": "x"}, SignatureMissing, "hmacSignature is missing"),
        (lambda i: {**i, "additionalData": {"hmacSignature": ""}}, SignatureMissing, "missing"),
        (lambda i: {**i, "additionalData": {"hmacSignature": "abc"}}, SignatureMalformed, "not a base64"),
        (lambda i: {**i, "additionalData": {"hmacSignature": 7}}, SignatureMalformed, "not a base64"),
        (lambda i: {**i, "additionalData": {"hmacSignature": "YWJj"}}, SignatureMalformed, "not a base64"),
        (lambda i: {**i, "amount": 1130}, SignatureMalformed, "amount is not an object"),
        (
            lambda i: {**i, "amount": {"value": 11.3, "currency": "EUR"}},
            SignatureMalformed,
            "value is neither",
        ),
        (lambda i: {**i, "success": True}, SignatureMalformed, "success is neither"),
    ],
)
def test_items_that_cannot_be_verified(mutate: Any, error: type[SignatureError], message: str) -> None:
    with pytest.raises(error, match=message):
        verify(notification(mutate(item())))


def test_missing_fields_sign_as_empty_strings() -> None:
    # The Adyen library signs a missing originalReference or merchantReference as "" ...
    bare = without_signature(item())
    del bare["merchantReference"]
    signed = {**bare, "additionalData": {"hmacSignature": generate_notification_sig(bare, KEY).decode()}}
    assert verify(notification(signed)).secret_index == 0
    # ... and, by the same documented rule, an item without an amount signs value and currency as "".
    del bare["amount"]
    text = "7914073381342284::TestMerchant::::AUTHORISATION:true"
    digest = base64.b64encode(hmac.digest(bytes.fromhex(KEY), text.encode(), "sha256")).decode()
    assert verify(notification({**bare, "additionalData": {"hmacSignature": digest}})).secret_index == 0


def test_an_authentic_item_without_its_ids_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="pspReference"):
        verify(notification(item(psp="")))


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("not-hex-at-all", r"^secrets\[0\]: an Adyen HMAC key is hex"),
        ("ABC", r"^secrets\[0\]: an Adyen HMAC key is hex"),
        ("AB" * 16, r"^secrets\[0\]: an Adyen HMAC key has at least 64 hex digits"),
        ("é" * 64, r"^secrets\[0\]: an Adyen HMAC key is hex"),
    ],
)
def test_keys_that_are_not_adyen_keys_are_refused_without_echoing_them(secret: str, message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message) as caught:
        build_scheme("adyen", [secret])
    assert secret not in str(caught.value)


def test_adyen_signs_no_timestamp_so_takes_no_tolerance() -> None:
    with pytest.raises(SchemeConfigError, match="signs no timestamp"):
        build_scheme("adyen", [KEY], tolerance=300)


FIELD_TEXT = st.text(max_size=20)
ITEMS = st.fixed_dictionaries(
    {
        "pspReference": st.text(min_size=1, max_size=16),
        "eventCode": st.text(min_size=1, max_size=16),
        "amount": st.fixed_dictionaries({"value": st.integers(-(10**12), 10**12), "currency": FIELD_TEXT}),
    },
    optional={
        "originalReference": FIELD_TEXT,
        "merchantAccountCode": FIELD_TEXT,
        "merchantReference": FIELD_TEXT,
        "success": st.sampled_from(["true", "false"]),
        "reason": FIELD_TEXT,
    },
)


@settings(max_examples=150, deadline=None, database=None)
@given(one=ITEMS, tamper=st.sampled_from([None, "merchantReference", "eventCode", "pspReference"]))
def test_agrees_with_the_adyen_library_both_ways(one: dict[str, Any], tamper: str | None) -> None:
    signed = {**one, "additionalData": {"hmacSignature": generate_notification_sig(one, KEY).decode()}}
    if tamper is not None:
        signed[tamper] = str(signed.get(tamper, "")) + "x"
    theirs = adyen_accepts(copy.deepcopy(signed))
    try:
        verify(notification(signed))
        ours = True
    except SignatureInvalid:
        ours = False
    assert ours == theirs == (tamper is None)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    body=st.one_of(
        st.binary(max_size=200),
        JSONISH.map(lambda d: json.dumps(d).encode()),
        st.lists(st.one_of(ITEMS, JSONISH), max_size=3).map(
            lambda items: json.dumps(
                {"notificationItems": [{"NotificationRequestItem": i} for i in items]}
            ).encode()
        ),
    )
)
def test_any_body_gives_a_typed_result(body: bytes) -> None:
    try:
        verify(body)
    except VerificationError as exc:
        assert exc.code and isinstance(exc.detail, str)
