"""``effectgate send`` without a network: example events, event files, signing and the errors it names."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from effectgate.gateway.cli import send
from effectgate.gateway.config import Config, parse
from effectgate.gateway.config.gateway import GatewayConfig
from effectgate.gateway.examples import EXAMPLE_TYPES, UnknownScheme, example
from effectgate.gateway.signatures import body_event_id, standard_webhooks

SIGNING_KEY, PUBLIC_KEY = standard_webhooks.new_ed25519_keys()
ENV = {
    "STRIPE": "whsec_unit",
    "GITHUB": "gh-unit",
    "STANDARD": "whsec_" + "c2VjcmV0IG9mIGEgZmV3IGJ5dGVzIQ==",
    "STANDARD_PK": PUBLIC_KEY,
    "SHOPIFY": "shpss_unit",
    "SLACK": "slack-unit",
    "HMAC": "hmac-unit",
    "TWILIO": "twilio-unit",
    "ADYEN": "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
    "PAYPAL": "8PT597110X687430LKGECATA",
}
TOML = """
[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE"]
[sources.github]
scheme = "github"
secrets = ["GITHUB"]
[sources.standard]
scheme = "standard-webhooks"
secrets = ["STANDARD"]
[sources.standard_ed25519]
scheme = "standard-webhooks"
secrets = ["STANDARD_PK"]
[sources.shopify]
scheme = "shopify"
secrets = ["SHOPIFY"]
[sources.slack]
scheme = "slack"
secrets = ["SLACK"]
[sources.hmac]
scheme = "hmac"
secrets = ["HMAC"]
options = { header = "X-Signature", prefix = "sha256=", timestamp_header = "X-Timestamp" }
[sources.twilio]
scheme = "twilio"
secrets = ["TWILIO"]
options = { url = "https://hooks.example.test/webhooks/twilio" }
[sources.adyen]
scheme = "adyen"
secrets = ["ADYEN"]
[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL"]
options = { confirm = "off" }
"""
CONFIG: Config = parse(TOML, path="unit.toml", env=ENV)
URL = "http://127.0.0.1:8000"
SOURCE_OF = {
    "stripe": "stripe",
    "github": "github",
    "standard-webhooks": "standard",
    "shopify": "shopify",
    "slack": "slack",
    "hmac": "hmac",
    "twilio": "twilio",
    "adyen": "adyen",
}
CASES = [(scheme, t) for scheme, types in EXAMPLE_TYPES.items() if scheme != "paypal" for t in types]


def signed(source_name: str, delivery: send.Unsigned, signing_key: str | None = None) -> send.Outgoing:
    source = send.find_source(CONFIG, source_name)
    return send.sign(source, delivery, url=URL, signing_key=signing_key, where="the example")


@pytest.mark.parametrize(("scheme", "event_type"), CASES, ids=[f"{s}:{t}" for s, t in CASES])
def test_every_example_is_verified_by_its_scheme_with_the_id_and_type_it_names(
    scheme: str, event_type: str
) -> None:
    source = send.find_source(CONFIG, SOURCE_OF[scheme])
    delivery = send.example_delivery(source, event_type, None)
    outgoing = signed(source.name, delivery)
    assert outgoing.url == f"{URL}/webhooks/{source.name}"
    verified = source.scheme.verify(outgoing.body, outgoing.headers)
    if event_type == "url_verification":
        assert verified.challenge is not None and not verified.events
        return
    [event] = verified.events
    expected_id = f"{delivery.event_id}:{event_type}" if scheme == "adyen" else delivery.event_id
    if not source.scheme.covers.id:
        # The provider's id header is unsigned: the event is identified by its signed body.
        expected_id = body_event_id(outgoing.body)
    if scheme != "adyen":
        assert outgoing.event_id == expected_id
    expected_type = "twilio.request" if scheme == "twilio" and "." in event_type else event_type
    assert (event.id, event.type) == (expected_id, expected_type)


@pytest.mark.parametrize("scheme", list(EXAMPLE_TYPES))
def test_an_example_is_a_function_of_its_type_and_id_and_fresh_ids_differ(scheme: str) -> None:
    assert example(scheme, None, "id-1") == example(scheme, None, "id-1")
    assert example(scheme, None, "id-1").body != example(scheme, None, "id-2").body
    assert example(scheme).event_id != example(scheme).event_id
    assert example(scheme).event_type == EXAMPLE_TYPES[scheme][0]


def test_any_other_type_gets_a_generic_body_of_the_providers_shape() -> None:
    body = json.loads(example("stripe", "customer.created", "evt_x").body)
    assert (body["id"], body["type"], body["data"]["object"]["object"]) == (
        "evt_x",
        "customer.created",
        "customer",
    )
    with pytest.raises(UnknownScheme):
        example("carrier-pigeon")


def test_the_stripe_example_carries_an_order_the_example_handler_keys_on() -> None:
    body = json.loads(example("stripe", "payment_intent.succeeded", "evt_1").body)
    assert body["data"]["object"]["metadata"]["order_id"]
    other = json.loads(example("stripe", "payment_intent.succeeded", "evt_2").body)
    assert other["data"]["object"]["metadata"]["order_id"] != body["data"]["object"]["metadata"]["order_id"]


def test_ed25519_examples_need_the_private_key_flag() -> None:
    source = send.find_source(CONFIG, "standard_ed25519")
    delivery = send.example_delivery(source, None, "msg_1")
    with pytest.raises(
        send.SendError,
        match=r"^--source standard_ed25519: --signing-key-env: required, the first secret is a whpk_",
    ):
        signed("standard_ed25519", delivery)
    outgoing = signed("standard_ed25519", delivery, signing_key=SIGNING_KEY)
    assert outgoing.headers["webhook-signature"].startswith("v1a,")
    assert source.scheme.verify(outgoing.body, outgoing.headers).events[0].id == "msg_1"


def test_paypal_is_refused_plainly() -> None:
    source = send.find_source(CONFIG, "paypal")
    with pytest.raises(send.SendError, match=r"^--source paypal: PayPal cannot be signed locally"):
        signed("paypal", send.example_delivery(source, None, None))


# --- event files ------------------------------------------------------------------------------


def test_a_json_file_is_sent_byte_for_byte_with_its_type(tmp_path: Path) -> None:
    path = tmp_path / "event.json"
    path.write_bytes(b'{"id": "evt_f", "type": "charge.refunded"}\n')
    delivery = send.file_delivery(CONFIG.sources["stripe"], str(path), event_type=None, event_id=None)
    assert (delivery.body, delivery.event_type) == (path.read_bytes(), "charge.refunded")
    outgoing = signed("stripe", delivery)
    assert outgoing.body == path.read_bytes()
    assert CONFIG.sources["stripe"].scheme.verify(outgoing.body, outgoing.headers).events[0].id == "evt_f"


def test_a_twilio_form_file_is_signed_as_a_form(tmp_path: Path) -> None:
    path = tmp_path / "status.form"
    path.write_text("MessageSid=SM9&SmsStatus=undelivered&To=%2B15558675310\n")
    delivery = send.file_delivery(CONFIG.sources["twilio"], str(path), event_type=None, event_id="SM9")
    assert delivery.content_type == "application/x-www-form-urlencoded"
    outgoing = signed("twilio", delivery)
    assert dict(parse_qsl(outgoing.body.decode()))["To"] == "+15558675310"
    [event] = CONFIG.sources["twilio"].scheme.verify(outgoing.body, outgoing.headers).events
    assert (event.id, event.delivery_id, event.type) == (body_event_id(outgoing.body), "SM9", "undelivered")


def test_a_twilio_json_file_is_signed_with_its_body_hash(tmp_path: Path) -> None:
    path = tmp_path / "event.json"
    path.write_text('{"MessageSid": "SM8"}')
    delivery = send.file_delivery(CONFIG.sources["twilio"], str(path), event_type=None, event_id=None)
    outgoing = signed("twilio", delivery)
    assert outgoing.headers["Content-Type"] == "application/json"
    [event] = CONFIG.sources["twilio"].scheme.verify(outgoing.body, outgoing.headers).events
    assert event.id == outgoing.event_id == body_event_id(outgoing.body)
    assert event.delivery_id == outgoing.headers["I-Twilio-Idempotency-Token"]


@pytest.mark.parametrize(
    ("source", "content", "message"),
    [
        ("stripe", None, "^--event-file {path}: cannot read: No such file or directory$"),
        ("stripe", b"id=1", "^--event-file {path}: not valid JSON: "),
        ("stripe", b"\xff", "^--event-file {path}: not valid JSON: "),
        ("twilio", b"\xff\xfe", "^--source twilio: --event-file {path}: not form-encoded UTF-8"),
        (
            "adyen",
            b'{"live": "false"}',
            "^--source adyen: --event-file {path}: body has no notificationItems",
        ),
        ("github", b'{"action": "opened"}', "^--source github: --event-type: required, this scheme sends"),
    ],
)
def test_file_mistakes_name_the_file_or_the_flag(
    tmp_path: Path, source: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / "event.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(send.SendError, match=message.format(path=path)):
        delivery = send.file_delivery(CONFIG.sources[source], str(path), event_type=None, event_id=None)
        send.sign(CONFIG.sources[source], delivery, url=URL, signing_key=None, where=f"--event-file {path}")


# --- where to, and with what ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("gateway.internal", "http://gateway.internal:8000"),
    ],
)
def test_the_default_url_is_the_configured_listen_address(host: str, url: str) -> None:
    assert send.default_url(GatewayConfig(host=host, port=8000)) == url


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://x", "http://", "http://h:99999"])
def test_a_bad_url_names_the_flag(url: str) -> None:
    with pytest.raises(send.SendError, match=r"^--url: "):
        send.check_url(url)


def test_an_unknown_source_lists_the_configured_ones() -> None:
    with pytest.raises(
        send.SendError, match=r"^--source: no source named 'nope' in unit.toml; configured: adyen, github"
    ):
        send.find_source(CONFIG, "nope")


def test_the_signing_key_comes_from_the_named_variable() -> None:
    assert send.signing_key_from(None) is None
    assert send.signing_key_from("K", {"K": SIGNING_KEY + "\n"}) == SIGNING_KEY
    with pytest.raises(send.SendError, match=r"^--signing-key-env: environment variable K is not set"):
        send.signing_key_from("K", {})


@pytest.mark.parametrize("value", ["", "évt", "a b", "a\nb", "x" * 201])
def test_an_id_or_type_that_cannot_travel_in_a_header_names_the_flag(value: str) -> None:
    with pytest.raises(send.SendError, match=r"^--event-id: expected 1-200 printable ASCII characters"):
        send.check_token("--event-id", value)


def test_a_body_type_that_cannot_travel_in_a_header_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "event.json"
    path.write_text('{"type": "line\\nbreak"}')
    delivery = send.file_delivery(CONFIG.sources["github"], str(path), event_type=None, event_id=None)
    assert delivery.event_type is None
