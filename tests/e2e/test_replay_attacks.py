"""A captured delivery, replayed with every unsigned header rewritten, never becomes a second effect.

One real gateway process with a source per scheme. Each test sends one genuine delivery (signed with the
provider's own library where one exists: ``stripe``, ``svix``, ``twilio``, ``Adyen``; the test PKI for
PayPal), then replays the same signed bytes with each header the signature does not cover rewritten, and
counts effects and jobs in the ledger: a replay adds none (so no downstream call can follow). A header the
signature does cover, rewritten, is a 401. A topic swap does not pass a ``require`` guard.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
import pytest
import stripe
from Adyen.util import generate_notification_sig
from svix.webhooks import Webhook as SvixWebhook
from twilio.request_validator import RequestValidator

from effectgate.gateway.signatures import body_event_id
from tests.unit.gateway.signatures.paypal_pki import Pki, iso
from tests.unit.gateway.signatures.signing import hex_mac, hmac_headers, shopify_headers, slack_headers

from .processes import Process, free_port
from .schemes import CERT_PATH, SECRETS
from .schemes_cert_server import serve_certificates

CONFIG = """
[handlers]
modules = ["tests.e2e.attack_handlers"]

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[sources.github]
scheme = "github"
secrets = ["GITHUB_SECRET"]

[sources.bare]
scheme = "github"
secrets = ["GITHUB_SECRET"]

[sources.standard]
scheme = "standard-webhooks"
secrets = ["SVIX_SECRET"]

[sources.shopify]
scheme = "shopify"
secrets = ["SHOPIFY_SECRET"]

[sources.slack]
scheme = "slack"
secrets = ["SLACK_SECRET"]

[sources.hmac]
scheme = "hmac"
secrets = ["HMAC_SECRET"]
options = {{ header = "X-Signature", prefix = "sha256=", timestamp_header = "X-Timestamp" }}

[sources.hmac_headers]
scheme = "hmac"
secrets = ["HMAC_SECRET"]
options = {{ header = "X-Signature", prefix = "sha256=", id_header = "X-Event-Id", type_header = "X-Event-Type" }}

[sources.twilio]
scheme = "twilio"
secrets = ["TWILIO_SECRET"]
options = {{ url = "http://127.0.0.1:{port}/webhooks/twilio" }}

[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ cert_url_bases = ["{cert_url_base}"], ca_bundle = "{ca_file}", fetch_ca_bundle = "{ca_file}", confirm = "off" }}

[sources.adyen]
scheme = "adyen"
secrets = ["ADYEN_HMAC_KEY"]
"""


class Gateway:
    def __init__(self, url: str, db_url: str, pki: Pki, cert_url: str) -> None:
        self.url, self.db_url, self.pki, self.cert_url = url, db_url, pki, cert_url

    def post(self, source: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{self.url}/webhooks/{source}", content=body, headers=headers, timeout=10)

    def count(self, sql: str, *params: Any) -> int:
        with psycopg.connect(self.db_url) as conn:
            row = conn.execute(sql, params).fetchone()
            assert row is not None
            return int(row[0])

    def effects_and_jobs(self, source: str) -> tuple[int, int]:
        return (
            self.count("SELECT count(*) FROM effects WHERE source = %s", source),
            self.count(
                "SELECT count(*) FROM jobs j JOIN effects e ON e.id = j.effect_id WHERE e.source = %s", source
            ),
        )


@pytest.fixture(scope="module")
def gateway(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("attacks")
    pki = Pki.around(time.time())
    ca_file = pki.write_root(tmp)
    tls_chain, tls_key = pki.tls_server("127.0.0.1")
    with serve_certificates({CERT_PATH: pki.chain_pem}, tls_chain, tls_key, tmp) as certs:
        port = free_port()
        path = tmp / "effectgate.toml"
        cert_url_base = certs.base_url + "/v1/notifications/certs/"
        path.write_text(CONFIG.format(port=port, ca_file=ca_file, cert_url_base=cert_url_base))
        env = {"DATABASE_URL": module_db_url, **SECRETS}
        process = Process(
            ["serve", "--config", str(path), "--no-migrate", "--port", str(port)], env, tmp / "gateway.log"
        )
        try:
            process.wait_http(f"http://127.0.0.1:{port}/readyz")
            yield Gateway(f"http://127.0.0.1:{port}", module_db_url, pki, certs.base_url + CERT_PATH)
        finally:
            process.stop()


def now() -> int:
    return int(time.time())


def replay_with_rewrites(
    gateway: Gateway,
    source: str,
    body: bytes,
    headers: dict[str, str],
    unsigned: dict[str, list[str]],
    signed: dict[str, str] | None = None,
) -> None:
    """Send the genuine delivery, then the same bytes with each unsigned header rewritten (each value, then
    all at once): every replay is a 200 whose effects are all duplicates (or skipped by a require), and
    the ledger holds exactly the effects and jobs of the first delivery. A rewritten signed header is 401."""
    first = gateway.post(source, body, headers)
    assert first.status_code == 202, first.text
    claimed = gateway.effects_and_jobs(source)
    assert claimed[0] >= 1 and claimed[0] == claimed[1]
    variants = [{**headers, name: value} for name, values in unsigned.items() for value in values]
    variants.append({**headers, **{name: values[-1] for name, values in unsigned.items()}})
    for variant in variants:
        r = gateway.post(source, body, variant)
        assert r.status_code == 200, (variant, r.text)
        if source != "adyen":
            outcomes = {e["outcome"] for e in r.json()["effects"]}
            assert outcomes <= {"duplicate", "unmet_requirement"} and "duplicate" in outcomes, r.text
        assert gateway.effects_and_jobs(source) == claimed, variant
    for name, value in (signed or {}).items():
        r = gateway.post(source, body, {**headers, name: value})
        assert r.status_code == 401, (name, r.text)
        assert gateway.effects_and_jobs(source) == claimed, name


CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded"]


def test_stripe(gateway: Gateway) -> None:
    body = json.dumps({"id": "evt_attack_1", "type": "payment_intent.succeeded", "data": {}})
    header = stripe.WebhookSignature.generate_signature_header(body, SECRETS["STRIPE_SECRET"])
    replay_with_rewrites(
        gateway,
        "stripe",
        body.encode(),
        {"Stripe-Signature": header, "Content-Type": "application/json"},
        {"Content-Type": CONTENT_TYPES, "X-Request-Id": ["replayed-1"]},
    )


def test_github_delivery_id_and_event(gateway: Gateway) -> None:
    body = json.dumps({"action": "opened", "issue": {"number": 7}}).encode()
    headers = {
        "X-Hub-Signature-256": "sha256=" + hex_mac(SECRETS["GITHUB_SECRET"], body),
        "X-GitHub-Delivery": "attack-delivery-1",
        "X-GitHub-Event": "issues",
    }
    replay_with_rewrites(
        gateway,
        "github",
        body,
        headers,
        {
            "X-GitHub-Delivery": [str(uuid.uuid4()), str(uuid.uuid4())],
            "X-GitHub-Event": ["push", "pull_request"],
            "Content-Type": CONTENT_TYPES,
        },
    )


def test_standard_webhooks_signed_by_svix(gateway: Gateway) -> None:
    body = json.dumps({"type": "invoice.paid", "data": {"id": "in_attack"}})
    signature = SvixWebhook(SECRETS["SVIX_SECRET"]).sign("msg_attack_1", datetime.now(UTC), body)
    headers = {"svix-id": "msg_attack_1", "svix-timestamp": str(now()), "svix-signature": signature}
    # The message id is signed: rewriting it breaks the signature.
    replay_with_rewrites(
        gateway, "standard", body.encode(), headers, {"Content-Type": CONTENT_TYPES}, {"svix-id": "msg_other"}
    )


def test_shopify_webhook_id_and_topic(gateway: Gateway) -> None:
    body = json.dumps({"id": 4242, "financial_status": "pending", "total_price": "10.00"}).encode()
    headers = shopify_headers(body, SECRETS["SHOPIFY_SECRET"])
    replay_with_rewrites(
        gateway,
        "shopify",
        body,
        headers,
        {
            "X-Shopify-Webhook-Id": [str(uuid.uuid4()), str(uuid.uuid4())],
            "X-Shopify-Topic": ["orders/paid", "orders/updated"],
            "X-Shopify-Event-Id": ["evt-other"],
            "Content-Type": CONTENT_TYPES,
        },
    )


def test_slack(gateway: Gateway) -> None:
    body = json.dumps(
        {"type": "event_callback", "event_id": "Ev_attack_1", "event": {"type": "app_mention", "text": "x"}}
    ).encode()
    replay_with_rewrites(
        gateway,
        "slack",
        body,
        slack_headers(body, SECRETS["SLACK_SECRET"], t=now()),
        {"X-Slack-Retry-Num": ["1", "2"], "Content-Type": CONTENT_TYPES},
    )


def test_generic_hmac_with_ids_in_the_body(gateway: Gateway) -> None:
    body = json.dumps({"id": "gen_attack_1", "type": "thing.happened"}).encode()
    headers = hmac_headers(body, SECRETS["HMAC_SECRET"], t=now())
    replay_with_rewrites(gateway, "hmac", body, headers, {"Content-Type": CONTENT_TYPES})


def test_generic_hmac_with_id_and_type_headers(gateway: Gateway) -> None:
    body = json.dumps({"amount": 100}).encode()
    headers = {
        "X-Signature": "sha256=" + hex_mac(SECRETS["HMAC_SECRET"], body),
        "X-Event-Id": "h-attack-1",
        "X-Event-Type": "thing.happened",
    }
    replay_with_rewrites(
        gateway,
        "hmac_headers",
        body,
        headers,
        {"X-Event-Id": ["h-attack-2", "h-attack-3"], "X-Event-Type": ["thing.other"]},
    )


def test_twilio_form_token_and_content_type(gateway: Gateway) -> None:
    params = {"MessageSid": "SM_attack_1", "SmsStatus": "delivered", "To": "+15558675309"}
    signature = RequestValidator(SECRETS["TWILIO_SECRET"]).compute_signature(
        f"{gateway.url}/webhooks/twilio", params
    )
    headers = {
        "X-Twilio-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
        "I-Twilio-Idempotency-Token": "idem-attack-1",
    }
    replay_with_rewrites(
        gateway,
        "twilio",
        urlencode(params).encode(),
        headers,
        {
            "I-Twilio-Idempotency-Token": ["idem-attack-2", "idem-attack-3"],
            "Content-Type": ["application/json"],
        },
    )


def test_twilio_json_content_type(gateway: Gateway) -> None:
    body = json.dumps({"MessageSid": "SM_attack_2", "SmsStatus": "sent"}).encode()
    url = f"{gateway.url}/webhooks/twilio?bodySHA256={hashlib.sha256(body).hexdigest()}"
    signature = RequestValidator(SECRETS["TWILIO_SECRET"]).compute_signature(url, {})
    headers = {
        "X-Twilio-Signature": signature,
        "Content-Type": "application/json",
        "I-Twilio-Idempotency-Token": "idem-json-1",
    }
    replay_with_rewrites(
        gateway,
        "twilio",
        body,
        headers,
        {
            "I-Twilio-Idempotency-Token": ["idem-json-2"],
            "Content-Type": ["application/x-www-form-urlencoded"],
        },
    )


def test_paypal(gateway: Gateway) -> None:
    body = json.dumps({"id": "WH-attack-1", "event_type": "PAYMENT.CAPTURE.COMPLETED"}).encode()
    headers = gateway.pki.headers(
        body,
        webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"],
        time=iso(now()),
        transmission_id="t-attack",
        url=gateway.cert_url,
    )
    # The transmission id is signed (PayPal's weakness is the CRC32 of the body, issue 17 item 2).
    replay_with_rewrites(
        gateway,
        "paypal",
        body,
        headers,
        {"Content-Type": CONTENT_TYPES},
        {"PAYPAL-TRANSMISSION-ID": "t-other"},
    )


def test_adyen(gateway: Gateway) -> None:
    item = {
        "pspReference": "PSP_ATTACK_1",
        "merchantReference": "order-attack",
        "merchantAccountCode": "TestMerchant",
        "amount": {"currency": "EUR", "value": 1130},
        "eventCode": "AUTHORISATION",
        "success": "true",
    }
    signature = generate_notification_sig(item, SECRETS["ADYEN_HMAC_KEY"]).decode()
    body = json.dumps(
        {
            "live": "false",
            "notificationItems": [
                {"NotificationRequestItem": {**item, "additionalData": {"hmacSignature": signature}}}
            ],
        }
    ).encode()
    replay_with_rewrites(
        gateway, "adyen", body, {"Content-Type": "application/json"}, {"Content-Type": CONTENT_TYPES}
    )


# --- routing on an unsigned type ------------------------------------------------------------------


def test_a_shopify_topic_swap_does_not_pass_the_require_guard(gateway: Gateway) -> None:
    pending = json.dumps({"id": 9001, "financial_status": "pending"}).encode()
    created = {**shopify_headers(pending, SECRETS["SHOPIFY_SECRET"]), "X-Shopify-Topic": "orders/create"}
    assert gateway.post("shopify", pending, created).status_code == 202
    swapped = {**created, "X-Shopify-Topic": "orders/paid", "X-Shopify-Webhook-Id": str(uuid.uuid4())}
    r = gateway.post("shopify", pending, swapped)
    assert r.status_code == 200, r.text
    outcomes = {e["handler"]: e["outcome"] for e in r.json()["effects"]}
    assert outcomes == {"attack.shopify": "duplicate", "attack.shopify_paid": "unmet_requirement"}
    assert gateway.count("SELECT count(*) FROM effects WHERE handler = 'attack.shopify_paid'") == 0
    # The genuine paid order, under the same topic, passes.
    paid = json.dumps({"id": 9001, "financial_status": "paid"}).encode()
    genuine = {**shopify_headers(paid, SECRETS["SHOPIFY_SECRET"]), "X-Shopify-Topic": "orders/paid"}
    assert gateway.post("shopify", paid, genuine).status_code == 202
    assert gateway.count("SELECT count(*) FROM effects WHERE handler = 'attack.shopify_paid'") == 1


def test_a_github_event_swap_does_not_pass_the_require_guard(gateway: Gateway) -> None:
    # An issue closed, resent as a pull request closed: the deploy effect requires a merged pull request.
    body = json.dumps({"action": "closed", "issue": {"id": 77}, "pull_request": {"id": 77, "merged": False}})
    raw = body.encode()
    headers = {
        "X-Hub-Signature-256": "sha256=" + hex_mac(SECRETS["GITHUB_SECRET"], raw),
        "X-GitHub-Delivery": "issue-closed-1",
        "X-GitHub-Event": "issues",
    }
    assert gateway.post("github", raw, headers).status_code == 202
    swapped = {**headers, "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "pr-closed-1"}
    r = gateway.post("github", raw, swapped)
    assert r.status_code == 200, r.text
    assert {e["handler"]: e["outcome"] for e in r.json()["effects"]} == {
        "attack.github": "duplicate",
        "attack.github_merged": "unmet_requirement",
    }
    assert gateway.count("SELECT count(*) FROM effects WHERE handler = 'attack.github_merged'") == 0
    assert gateway.count("SELECT count(*) FROM effects WHERE event_id = %s", body_event_id(raw)) == 1


def test_an_unmatched_delivery_replayed_is_kept_once(gateway: Gateway) -> None:
    # Source "bare" has only a guarded effect: a body that fails its require is unmatched, and replaying it
    # under new delivery ids is counted on one row, never a row (with its payload) per request.
    body = json.dumps({"action": "closed", "pull_request": {"id": 5, "merged": False}}).encode()
    headers = {
        "X-Hub-Signature-256": "sha256=" + hex_mac(SECRETS["GITHUB_SECRET"], body),
        "X-GitHub-Event": "pull_request",
    }
    for n in range(5):
        r = gateway.post("bare", body, {**headers, "X-GitHub-Delivery": f"bare-{n}"})
        assert r.status_code == 200, r.text
        assert r.json()["effects"] == [{"handler": "attack.bare_merged", "outcome": "unmet_requirement"}]
    assert gateway.count("SELECT count(*) FROM deliveries WHERE source = 'bare'") == 1
    assert gateway.count("SELECT delivery_count FROM unmatched_deliveries WHERE source = 'bare'") == 5
    assert gateway.effects_and_jobs("bare") == (0, 0)
