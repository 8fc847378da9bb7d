"""Each scheme's ``sign`` against its own ``verify``, and against the providers' own libraries.

A signer and its verifier written side by side could share a mistake; so every signer is also checked
by a library no one here wrote (``stripe``, ``standardwebhooks``, ``svix``, ``twilio``, ``Adyen``) or a
provider's published example, in both directions where the library signs too.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
import stripe
from Adyen.util import generate_notification_sig, is_valid_hmac_notification
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook as StandardWebhook
from svix.webhooks import Webhook as SvixWebhook
from twilio.request_validator import RequestValidator

from effectgate.gateway.signatures import (
    PayloadError,
    Scheme,
    SignatureError,
    Signed,
    Signer,
    SigningError,
    TimestampOutOfTolerance,
    build_scheme,
    standard_webhooks,
)
from effectgate.gateway.signatures import adyen as adyen_scheme
from effectgate.gateway.signatures import github as github_scheme
from tests.unit.gateway.signatures.signing import EVENT_BODY, HMAC_OPTIONS, NOW, SW_SECRET, TWILIO_URL

SIGNING_KEY, PUBLIC_KEY = standard_webhooks.new_ed25519_keys()
ADYEN_KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"
OTHER = {"standard-webhooks": "whsec_b3RoZXIgc2VjcmV0IG9mIGVub3VnaCBsZW5ndGg=", "adyen": "00" * 32}


def scheme(name: str, secret: str, **options: Any) -> Any:
    """A built scheme whose ``sign`` the tests call: every scheme but PayPal's is a ``Signer``."""
    built: Scheme = build_scheme(name, [secret], options=options)
    assert isinstance(built, Signer)
    return built


# name, secret, options, what sign needs beyond the body
SIGNABLE: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("stripe", "whsec_stripe_test", {}, {}),
    ("github", "gh-secret", {}, {"event_type": "issues.opened"}),
    ("standard-webhooks", SW_SECRET, {}, {}),
    ("standard-webhooks", PUBLIC_KEY, {}, {"signing_key": SIGNING_KEY}),
    ("shopify", "shpss_secret", {}, {"event_type": "orders/create"}),
    ("slack", "slack-signing-secret", {}, {}),
    ("hmac", "generic-secret", HMAC_OPTIONS, {}),
    ("hmac", "generic-secret", {"header": "X-Sig", "algorithm": "sha512", "encoding": "base64"}, {}),
    (
        "hmac",
        "generic-secret",
        {
            "header": "X-Sig",
            "algorithm": "sha1",
            "timestamp_header": "X-Ts",
            "template": "v1:{timestamp}:{body}:end",
            "id_header": "X-Id",
            "type_header": "X-Type",
        },
        {"event_type": "thing.happened"},
    ),
    ("twilio", "twilio-token", {"url": TWILIO_URL}, {}),
    ("twilio", "twilio-shared-key", {"url": TWILIO_URL, "shared_key": "webhooks_sharedkey_1"}, {}),
]
IDS = [f"{name}-{i}" for i, (name, *_rest) in enumerate(SIGNABLE)]


@pytest.mark.parametrize(("name", "secret", "options", "extra"), SIGNABLE, ids=IDS)
def test_sign_then_verify_with_the_first_secret(
    name: str, secret: str, options: dict[str, Any], extra: dict[str, Any]
) -> None:
    signed = scheme(name, secret, **options).sign(EVENT_BODY, event_id="evt_1", now=NOW, **extra)
    assert signed.body == EVENT_BODY
    assert signed.headers["Content-Type"] == "application/json"
    # Built with the signing secret second, as during a rotation: the verifier still finds it.
    rotated = build_scheme(name, [OTHER.get(name, "an-older-secret"), secret], options=options)
    verified = rotated.verify(signed.body, signed.headers, now=NOW)
    assert verified.secret_index == 1
    [event] = verified.events
    assert event.payload == json.loads(EVENT_BODY)


@settings(max_examples=40, deadline=None, database=None)
@given(body=st.binary(max_size=300), flip=st.integers(min_value=0))
@pytest.mark.parametrize(("name", "secret", "options", "extra"), SIGNABLE, ids=IDS)
def test_any_body_signed_is_authentic_and_any_changed_byte_is_not(
    name: str, secret: str, options: dict[str, Any], extra: dict[str, Any], body: bytes, flip: int
) -> None:
    built = scheme(name, secret, **options)
    signed = built.sign(body, event_id="evt_1", now=NOW, **extra)
    try:
        built.verify(signed.body, signed.headers, now=NOW)
    except PayloadError:
        pass  # authentic, only not an event: the signature was accepted
    if not body:
        return
    tampered = bytearray(body)
    tampered[flip % len(body)] ^= 0x01
    with pytest.raises(SignatureError):
        built.verify(bytes(tampered), signed.headers, now=NOW)


@pytest.mark.parametrize(
    ("name", "secret", "options"),
    [
        ("stripe", "whsec_x", {}),
        ("slack", "s", {}),
        ("standard-webhooks", SW_SECRET, {}),
        ("hmac", "s", HMAC_OPTIONS),
    ],
)
def test_the_signed_timestamp_is_the_clock_given(name: str, secret: str, options: dict[str, Any]) -> None:
    built = scheme(name, secret, **options)
    signed = built.sign(EVENT_BODY, now=NOW - 3600)
    with pytest.raises(TimestampOutOfTolerance):
        built.verify(signed.body, signed.headers, now=NOW)
    built.verify(signed.body, signed.headers, now=NOW - 3600)


def test_a_header_carried_event_id_is_fresh_unless_given() -> None:
    built = scheme("github", "gh-secret")
    first, second = (built.sign(b"{}", event_type="push", now=NOW) for _ in range(2))
    assert first.headers["X-GitHub-Delivery"] != second.headers["X-GitHub-Delivery"]
    given_id = built.sign(b"{}", event_type="push", event_id="d-1", now=NOW)
    assert built.verify(given_id.body, given_id.headers, now=NOW).events[0].delivery_id == "d-1"


@pytest.mark.parametrize(
    ("name", "secret", "header"), [("github", "s", "X-GitHub-Event"), ("shopify", "s", "X-Shopify-Topic")]
)
def test_a_type_sent_in_a_header_is_required(name: str, secret: str, header: str) -> None:
    with pytest.raises(
        SigningError, match=f"^event_type: required, this scheme sends the event type in {header}$"
    ):
        scheme(name, secret).sign(b"{}", now=NOW)


def test_github_sends_the_event_name_and_verifies_the_action_from_the_body() -> None:
    built = scheme("github", "s")
    signed = built.sign(b'{"action": "opened"}', event_type="issues.opened", now=NOW)
    assert signed.headers["X-GitHub-Event"] == "issues"
    assert built.verify(signed.body, signed.headers).events[0].type == "issues.opened"


# --- the providers' own libraries and examples ----------------------------------------------------


def test_stripe_library_accepts_ours_and_signs_the_same() -> None:
    body = json.dumps({"id": "evt_1", "type": "payment_intent.succeeded"}, indent=2).encode()
    signed = scheme("stripe", "whsec_lib").sign(body, now=NOW)
    header = signed.headers["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(body.decode(), header, "whsec_lib", tolerance=None)
    assert header == stripe.WebhookSignature.generate_signature_header(
        body.decode(), "whsec_lib", timestamp=NOW
    )


def test_standard_webhooks_and_svix_libraries_accept_ours_and_sign_the_same() -> None:
    body = b'{"type": "invoice.paid", "data": {"id": "in_1"}}'
    signed = scheme("standard-webhooks", SW_SECRET).sign(body, event_id="msg_1")  # now: they check it
    StandardWebhook(SW_SECRET).verify(body, signed.headers)
    SvixWebhook(SW_SECRET).verify(body, signed.headers)
    timestamp = datetime.fromtimestamp(int(signed.headers["webhook-timestamp"]), UTC)
    assert signed.headers["webhook-signature"] == StandardWebhook(SW_SECRET).sign(
        "msg_1", timestamp, body.decode()
    )


def test_ed25519_v1a_is_checked_by_the_public_key_itself() -> None:
    body = b'{"type": "user.created"}'
    signed = scheme("standard-webhooks", PUBLIC_KEY).sign(
        body, event_id="msg_2", signing_key=SIGNING_KEY, now=NOW
    )
    version, signature = signed.headers["webhook-signature"].split(",")
    assert version == "v1a"
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(PUBLIC_KEY.removeprefix("whpk_")))
    public.verify(base64.b64decode(signature), f"msg_2.{NOW}.".encode() + body)  # raises if wrong


def test_an_ed25519_signing_key_in_libsodiums_64_byte_form_is_accepted() -> None:
    private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(SIGNING_KEY.removeprefix("whsk_")))
    public = private.public_key().public_bytes_raw()
    long_form = "whsk_" + base64.b64encode(private.private_bytes_raw() + public).decode()
    built = scheme("standard-webhooks", PUBLIC_KEY)
    signed = built.sign(b'{"type": "t"}', signing_key=long_form, now=NOW)
    built.verify(signed.body, signed.headers, now=NOW)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "^signing_key: required, the first secret is a whpk_ public key"),
        (
            standard_webhooks.new_ed25519_keys()[0],
            "^signing_key: is not the private half of the first configured",
        ),
        ("whpk_" + "A" * 43, "^signing_key: expected whsk_"),
        ("whsk_not base64!", "^signing_key: not valid base64$"),
        (
            "whsk_" + base64.b64encode(b"short").decode(),
            "^signing_key: an Ed25519 private key is 32 or 64 bytes, got 5$",
        ),
        (
            "whsk_" + base64.b64encode(bytes(64)).decode(),
            "^signing_key: its last 32 bytes are not the public key",
        ),
    ],
    # Named: a fresh key in an id would differ between the suite's parallel workers.
    ids=["missing", "another-key", "public-key", "not-base64", "short", "wrong-public-half"],
)
def test_a_missing_or_wrong_ed25519_signing_key_is_named(key: str | None, message: str) -> None:
    with pytest.raises(SigningError, match=message) as caught:
        scheme("standard-webhooks", PUBLIC_KEY).sign(b"{}", signing_key=key, now=NOW)
    if key is not None:
        assert key.removeprefix("whsk_") not in str(caught.value)


def test_a_signing_key_is_refused_where_the_configured_secret_signs() -> None:
    with pytest.raises(SigningError, match=r"^signing_key: scheme 'stripe' signs with its configured secret"):
        scheme("stripe", "whsec_x").sign(b"{}", signing_key=SIGNING_KEY)


def test_github_documented_example() -> None:
    # https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries#testing-the-webhook-payload-validation
    assert github_scheme.signature_header(b"Hello, World!", "It's a Secret to Everybody") == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


FORM = {"MessageSid": "SM1", "SmsStatus": "delivered", "To": "+15558675309", "Body": "Hé & bye=1"}


@pytest.mark.parametrize("shared_key", [None, "webhooks_sharedkey_1"])
def test_twilio_validator_accepts_our_form_signature(shared_key: str | None) -> None:
    options = {"url": TWILIO_URL} | ({"shared_key": shared_key} if shared_key else {})
    body = urlencode(FORM).encode()
    signed = scheme("twilio", "tok", **options).sign(body, content_type="application/x-www-form-urlencoded")
    algorithm = "HMAC_SHA256" if shared_key else None
    if shared_key:
        assert (
            signed.headers["X-Twilio-Webhooks-Signature-Settings"]
            == f"key={shared_key},algorithm=HMAC_SHA256"
        )
    else:
        assert "X-Twilio-Webhooks-Signature-Settings" not in signed.headers
    validator = RequestValidator("tok")
    assert validator.validate(
        TWILIO_URL, dict(parse_qsl(body.decode())), signed.headers["X-Twilio-Signature"], algorithm
    )
    assert signed.headers["X-Twilio-Signature"] == validator.compute_signature(TWILIO_URL, FORM, algorithm)


def test_twilio_validator_accepts_our_json_signature() -> None:
    body = b'{"MessageSid": "SM2", "status": "delivered"}'
    signed = scheme("twilio", "tok", url=TWILIO_URL).sign(body, event_id="idem-2")
    signed_url = f"{TWILIO_URL}&bodySHA256={__import__('hashlib').sha256(body).hexdigest()}"
    assert RequestValidator("tok").validate(signed_url, body.decode(), signed.headers["X-Twilio-Signature"])
    assert signed.headers["I-Twilio-Idempotency-Token"] == "idem-2"


def test_twilio_signs_the_configured_url_not_another() -> None:
    signed = scheme("twilio", "tok", url=TWILIO_URL).sign(b"{}")
    other = scheme("twilio", "tok", url="http://127.0.0.1:8000/webhooks/twilio")
    with pytest.raises(SignatureError):
        other.verify(signed.body, signed.headers)


def test_twilio_refuses_a_form_body_that_is_not_a_form() -> None:
    with pytest.raises(SigningError, match=r"^body: not form-encoded UTF-8"):
        scheme("twilio", "tok", url=TWILIO_URL).sign(
            b"\xff\xfe", content_type="application/x-www-form-urlencoded"
        )


def adyen_body(*codes: str) -> bytes:
    items = [
        {
            "NotificationRequestItem": {
                "pspReference": f"PSP{n}",
                "merchantAccountCode": "TestMerchant",
                "merchantReference": "order-1",
                "amount": {"currency": "EUR", "value": 1130},
                "eventCode": code,
                "success": "true",
            }
        }
        for n, code in enumerate(codes)
    ]
    return json.dumps({"live": "false", "notificationItems": items}).encode()


def test_adyen_signs_every_item_and_adyens_library_agrees() -> None:
    built = scheme("adyen", ADYEN_KEY)
    signed = built.sign(adyen_body("AUTHORISATION", "CAPTURE"))
    items = [w["NotificationRequestItem"] for w in json.loads(signed.body)["notificationItems"]]
    for item in items:
        assert is_valid_hmac_notification(item, ADYEN_KEY)
        unsigned = {k: v for k, v in item.items() if k != "additionalData"}
        assert (
            item["additionalData"]["hmacSignature"] == generate_notification_sig(unsigned, ADYEN_KEY).decode()
        )
        assert adyen_scheme.item_signature(unsigned, ADYEN_KEY) == item["additionalData"]["hmacSignature"]
    verified = built.verify(signed.body, signed.headers)
    assert [e.id for e in verified.events] == ["PSP0:AUTHORISATION", "PSP1:CAPTURE"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "^body: not JSON"),
        (b'{"live": "false"}', "^body: body has no notificationItems"),
        (
            b'{"notificationItems": [{"NotificationRequestItem": {"amount": 5}}]}',
            "^body: item 1 of 1: amount is not an object",
        ),
        (
            b'{"notificationItems": [{"NotificationRequestItem": {"additionalData": []}}]}',
            "^body: item 1 of 1: additionalData",
        ),
    ],
)
def test_adyen_names_what_in_the_body_cannot_be_signed(body: bytes, message: str) -> None:
    with pytest.raises(SigningError, match=message):
        scheme("adyen", ADYEN_KEY).sign(body)


def test_paypal_says_plainly_that_it_cannot_be_signed_locally() -> None:
    from tests.unit.gateway.signatures.signing import PAYPAL_WEBHOOK_ID, paypal_options

    paypal = build_scheme("paypal", [PAYPAL_WEBHOOK_ID], options=paypal_options())
    assert isinstance(paypal, Signer)
    with pytest.raises(
        SigningError, match=r"^PayPal cannot be signed locally: PayPal signs each delivery with"
    ):
        paypal.sign(EVENT_BODY)


def test_signed_is_what_is_sent() -> None:
    signed = scheme("slack", "s").sign(b"{}", content_type="application/json; charset=utf-8", now=NOW)
    assert signed == Signed(b"{}", {**signed.headers, "Content-Type": "application/json; charset=utf-8"})


# --- whatever is asked, sign returns Signed or raises SigningError -------------------------------

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
BODIES = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda items: json.dumps({"notificationItems": items}).encode(),
        st.lists(
            st.one_of(
                st.dictionaries(st.sampled_from(["NotificationRequestItem", "x"]), st.none() | st.integers()),
                st.fixed_dictionaries(
                    {
                        "NotificationRequestItem": st.dictionaries(
                            st.sampled_from(
                                ["pspReference", "amount", "eventCode", "success", "additionalData"]
                            ),
                            st.none()
                            | st.integers()
                            | st.text(max_size=5)
                            | st.lists(st.integers(), max_size=2)
                            | st.dictionaries(
                                st.sampled_from(["value", "currency"]), st.integers() | st.text(max_size=3)
                            ),
                        )
                    }
                ),
            ),
            max_size=3,
        ),
    ),
)
SIGNERS = [*SIGNABLE, ("adyen", ADYEN_KEY, {}, {})]


@settings(max_examples=150, deadline=None, database=None)
@given(
    body=BODIES,
    event_id=st.none() | ANY_TEXT,
    event_type=st.none() | ANY_TEXT,
    content_type=st.sampled_from(["application/json", "application/x-www-form-urlencoded", "text/plain"]),
    # Mostly the key the scheme expects (none, or the Ed25519 one), so the rest gets past that check.
    signing_key=st.sampled_from(["expected"] * 3 + ["any"]),
    any_key=ANY_TEXT | st.sampled_from(["whsk_" + "A" * 43, "whsk_\udc80", SIGNING_KEY]),
    now=st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(10**12), max_value=10**12),
)
@pytest.mark.parametrize(("name", "secret", "options", "extra"), SIGNERS, ids=[*IDS, "adyen"])
def test_sign_returns_signed_or_raises_signing_error_and_nothing_else(
    name: str,
    secret: str,
    options: dict[str, Any],
    extra: dict[str, Any],
    body: bytes,
    event_id: str | None,
    event_type: str | None,
    content_type: str,
    signing_key: str,
    any_key: str,
    now: float | None,
) -> None:
    built = scheme(name, secret, **options)
    key = extra.get("signing_key") if signing_key == "expected" else any_key
    try:
        signed = built.sign(
            body,
            event_id=event_id,
            event_type=event_type,
            content_type=content_type,
            signing_key=key,
            now=now,
        )
    except SigningError:
        return
    assert isinstance(signed, Signed)
    for name_, value in signed.headers.items():
        assert value.isascii() and value.isprintable(), (name_, value)


@pytest.mark.parametrize("value", ["", "caf\u00e9", "a\nb", "\udc80"])
def test_an_event_id_or_type_that_cannot_be_a_header_is_refused(value: str) -> None:
    with pytest.raises(SigningError, match=r"^event_id: expected non-empty printable ASCII text$"):
        scheme("github", "s").sign(b"{}", event_id=value, event_type="push")
    with pytest.raises(SigningError, match=r"^event_type: expected non-empty printable ASCII text$"):
        scheme("github", "s").sign(b"{}", event_id="d", event_type=value)


def test_adyen_item_signature_names_a_key_that_is_not_hex() -> None:
    with pytest.raises(SigningError, match=r"^hmac_key: an Adyen HMAC key is hex$"):
        adyen_scheme.item_signature({"pspReference": "1"}, "not hex")
