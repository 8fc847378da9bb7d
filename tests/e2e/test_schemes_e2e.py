"""Every scheme end to end: one real gateway process with a source per scheme, deliveries over HTTP.

Each delivery is signed the way its provider signs (the provider's own library where one exists:
``stripe``, ``svix``, ``twilio``, ``Adyen``), posted to ``POST /webhooks/{source}`` and must end as a
claimed effect in the ledger. PayPal's certificate is fetched by the gateway from a loopback HTTPS
server holding a certificate of the tests' own CA. The failures at the end check what an operator reads
back from ``signature_failures``: useful details, and never a secret or a signature.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
import pytest
import stripe
from Adyen.util import generate_notification_sig
from psycopg.rows import dict_row
from svix.webhooks import Webhook as SvixWebhook
from twilio.request_validator import RequestValidator

from effectgate.gateway.signatures import body_event_id
from tests.unit.gateway.signatures.crc_forge import FILLER, forge
from tests.unit.gateway.signatures.paypal_pki import Pki, iso
from tests.unit.gateway.signatures.signing import hex_mac, hmac_headers, shopify_headers, slack_headers

from .processes import Process, free_port, wait_until
from .schemes import CERT_PATH, SECRETS
from .schemes_cert_server import CertServer, serve_certificates

# A certificate no delivery named before: the concurrent deliveries below race to fetch it.
CONCURRENT_CERT_PATH = "/v1/notifications/certs/CERT-360caa42-fca2a594-race"


@dataclass
class Gateway:
    url: str
    db_url: str
    process: Process
    certs: CertServer
    pki: Pki

    def post(self, source: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{self.url}/webhooks/{source}", content=body, headers=headers, timeout=10)

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            return conn.execute(sql, params).fetchall()

    def effect(self, source: str, event_id: str) -> dict[str, Any]:
        key = f"{source}:{event_id}:schemes.{source}"
        [row] = self.rows("SELECT effect_key, handler FROM effects WHERE effect_key = %s", key)
        return row


def config(port: int, cert_url_base: str, ca_file: str) -> str:
    return f"""
[handlers]
modules = ["tests.e2e.schemes_handlers"]

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[sources.github]
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


@pytest.fixture(scope="module")
def gateway(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("schemes")
    pki = Pki.around(time.time())
    ca_file = pki.write_root(tmp)
    tls_chain, tls_key = pki.tls_server("127.0.0.1")
    served = {CERT_PATH: pki.chain_pem, CONCURRENT_CERT_PATH: pki.chain_pem}
    with serve_certificates(served, tls_chain, tls_key, tmp) as certs:
        port = free_port()
        path = tmp / "effectgate.toml"
        path.write_text(config(port, certs.base_url + "/v1/notifications/certs/", ca_file))
        env = {"DATABASE_URL": module_db_url, "EFFECTGATE_LOG_LEVEL": "INFO", **SECRETS}
        process = Process(
            ["serve", "--config", str(path), "--no-migrate", "--port", str(port)], env, tmp / "gateway.log"
        )
        try:
            process.wait_http(f"http://127.0.0.1:{port}/readyz")
            yield Gateway(f"http://127.0.0.1:{port}", module_db_url, process, certs, pki)
        finally:
            process.stop()


def now() -> int:
    return int(time.time())


# --- one accepted delivery per scheme ------------------------------------------------------------


def test_stripe(gateway: Gateway) -> None:
    body = json.dumps({"id": "evt_e2e_1", "type": "payment_intent.succeeded", "data": {}}, indent=2)
    header = stripe.WebhookSignature.generate_signature_header(body, SECRETS["STRIPE_SECRET"])
    r = gateway.post("stripe", body.encode(), {"Stripe-Signature": header})
    assert r.status_code == 202, r.text
    assert gateway.effect("stripe", "evt_e2e_1")["handler"] == "schemes.stripe"


def test_github(gateway: Gateway) -> None:
    body = json.dumps({"action": "opened", "issue": {"number": 1}}).encode()
    headers = {
        "X-Hub-Signature-256": "sha256=" + hex_mac(SECRETS["GITHUB_SECRET"], body),
        "X-GitHub-Delivery": "e2e-delivery-1",
        "X-GitHub-Event": "issues",
    }
    assert gateway.post("github", body, headers).status_code == 202
    # X-GitHub-Delivery is unsigned: the event is keyed on the signed body.
    gateway.effect("github", body_event_id(body))


def test_standard_webhooks_with_svix_headers_signed_by_svix(gateway: Gateway) -> None:
    body = json.dumps({"type": "invoice.paid", "data": {"id": "in_1"}})
    signature = SvixWebhook(SECRETS["SVIX_SECRET"]).sign("msg_e2e_1", datetime.now(UTC), body)
    headers = {"svix-id": "msg_e2e_1", "svix-timestamp": str(now()), "svix-signature": signature}
    assert gateway.post("standard", body.encode(), headers).status_code == 202
    gateway.effect("standard", "msg_e2e_1")


def test_shopify(gateway: Gateway) -> None:
    body = json.dumps({"id": 820982911946154508, "email": "jon@example.com"}).encode()
    headers = shopify_headers(body, SECRETS["SHOPIFY_SECRET"])
    assert gateway.post("shopify", body, headers).status_code == 202
    gateway.effect("shopify", body_event_id(body))


def test_slack_event_and_its_url_verification_challenge(gateway: Gateway) -> None:
    challenge = json.dumps(
        {"type": "url_verification", "token": "t", "challenge": "3eZbrw1aBm2rZgRN"}
    ).encode()
    r = gateway.post("slack", challenge, slack_headers(challenge, SECRETS["SLACK_SECRET"], t=now()))
    assert (r.status_code, r.json()) == (200, {"challenge": "3eZbrw1aBm2rZgRN"})

    body = json.dumps(
        {"type": "event_callback", "event_id": "Ev_e2e_1", "event": {"type": "app_mention", "text": "hi"}}
    ).encode()
    assert (
        gateway.post("slack", body, slack_headers(body, SECRETS["SLACK_SECRET"], t=now())).status_code == 202
    )
    gateway.effect("slack", "Ev_e2e_1")


def test_generic_hmac(gateway: Gateway) -> None:
    body = json.dumps({"id": "gen_e2e_1", "type": "thing.happened"}).encode()
    assert gateway.post("hmac", body, hmac_headers(body, SECRETS["HMAC_SECRET"], t=now())).status_code == 202
    gateway.effect("hmac", "gen_e2e_1")


def test_twilio_form_signed_by_twilios_validator(gateway: Gateway) -> None:
    params = {"MessageSid": "SM_e2e_1", "SmsStatus": "delivered", "To": "+15558675309"}
    signature = RequestValidator(SECRETS["TWILIO_SECRET"]).compute_signature(
        f"{gateway.url}/webhooks/twilio", params
    )
    headers = {"X-Twilio-Signature": signature, "Content-Type": "application/x-www-form-urlencoded"}
    body = urlencode(params).encode()
    assert gateway.post("twilio", body, headers).status_code == 202
    gateway.effect("twilio", body_event_id(body))


def test_paypal_with_its_certificate_fetched_once_over_loopback_https(gateway: Gateway) -> None:
    url = gateway.certs.base_url + CERT_PATH
    for n in (1, 2):
        body = json.dumps({"id": f"WH-e2e-{n}", "event_type": "PAYMENT.CAPTURE.COMPLETED"}).encode()
        headers = gateway.pki.headers(
            body, webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"], time=iso(now()), transmission_id=f"t-{n}", url=url
        )
        r = gateway.post("paypal", body, headers)
        assert r.status_code == 202, r.text
        gateway.effect("paypal", f"WH-e2e-{n}")
    assert gateway.certs.hits.count(CERT_PATH) == 1


def test_paypal_a_crc_forged_body_or_an_old_transmission_claims_nothing_on_a_running_gateway(
    gateway: Gateway,
) -> None:
    # The measurement, repeated against `serve`: a captured delivery's signature over a body forged
    # to its CRC32 (another event id and amount), and a transmission 20 days old.
    url = gateway.certs.base_url + CERT_PATH
    genuine = json.dumps(
        {
            "id": "WH-e2e-captured",
            "event_type": "PAYMENT.CAPTURE.COMPLETED",
            "resource": {"amount": {"currency_code": "USD", "value": "7.47"}},
        }
    ).encode()
    headers = gateway.pki.headers(
        genuine,
        webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"],
        time=iso(now()),
        transmission_id="t-captured",
        url=url,
    )
    assert gateway.post("paypal", genuine, headers).status_code == 202
    forged_ids = []
    for n, value in enumerate(("9999.00", "123456.00")):
        document = json.loads(genuine)
        document["id"] = f"WH-e2e-forged-{n}"
        document["resource"]["amount"]["value"] = value
        document["resource"]["note_to_payer"] = FILLER.decode()
        forged = forge(json.dumps(document).encode(), zlib.crc32(genuine))
        forged_ids.append(document["id"])
        r = gateway.post("paypal", forged, headers)
        assert (r.status_code, r.json().get("error")) == (401, "transmission_reused"), r.text
    old = json.dumps({"id": "WH-e2e-old", "event_type": "PAYMENT.CAPTURE.COMPLETED"}).encode()
    old_headers = gateway.pki.headers(
        old, webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"], time=iso(now() - 20 * 86_400), url=url
    )
    r = gateway.post("paypal", old, old_headers)
    assert (r.status_code, r.json().get("error")) == (401, "timestamp_out_of_tolerance")
    keys = [f"paypal:{event_id}:schemes.paypal" for event_id in [*forged_ids, "WH-e2e-old"]]
    assert gateway.rows("SELECT effect_key FROM effects WHERE effect_key = ANY(%s)", keys) == []
    gateway.effect("paypal", "WH-e2e-captured")


def test_paypal_concurrent_deliveries_naming_a_new_certificate_fetch_it_once(gateway: Gateway) -> None:
    url = gateway.certs.base_url + CONCURRENT_CERT_PATH

    def send(n: int) -> int:
        body = json.dumps({"id": f"WH-race-{n}", "event_type": "PAYMENT.CAPTURE.COMPLETED"}).encode()
        headers = gateway.pki.headers(
            body, webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"], time=iso(now()), transmission_id=f"r-{n}", url=url
        )
        return gateway.post("paypal", body, headers).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(send, range(16)))
    assert statuses == [202] * 16
    # One gateway process: one fetch, however many deliveries were waiting on it.
    assert gateway.certs.hits.count(CONCURRENT_CERT_PATH) == 1


def adyen_item(psp: str, event: str) -> dict[str, Any]:
    item = {
        "pspReference": psp,
        "merchantReference": "order-e2e",
        "merchantAccountCode": "TestMerchant",
        "amount": {"currency": "EUR", "value": 1130},
        "eventCode": event,
        "success": "true",
    }
    signature = generate_notification_sig(item, SECRETS["ADYEN_HMAC_KEY"]).decode()
    return {"NotificationRequestItem": {**item, "additionalData": {"hmacSignature": signature}}}


def test_adyen_batch_is_answered_accepted_with_one_effect_per_item(gateway: Gateway) -> None:
    body = json.dumps(
        {
            "live": "false",
            "notificationItems": [
                adyen_item("PSP_E2E_1", "AUTHORISATION"),
                adyen_item("PSP_E2E_1", "CAPTURE"),
            ],
        }
    ).encode()
    r = gateway.post("adyen", body, {"Content-Type": "application/json"})
    assert (r.status_code, r.content) == (202, b"[accepted]")
    assert r.headers["content-type"].startswith("text/plain")
    gateway.effect("adyen", "PSP_E2E_1:AUTHORISATION")
    gateway.effect("adyen", "PSP_E2E_1:CAPTURE")
    again = gateway.post("adyen", body, {"Content-Type": "application/json"})
    assert (again.status_code, again.content) == (200, b"[accepted]")


# --- what a failure leaves behind -----------------------------------------------------------------


def test_failure_details_help_the_operator_and_never_hold_a_secret_or_signature(gateway: Gateway) -> None:
    sent_signatures: list[str] = []

    def reject(source: str, body: bytes, headers: dict[str, str], code: str) -> None:
        sent_signatures.extend(v for k, v in headers.items() if "sig" in k.lower() or "hmac" in k.lower())
        r = gateway.post(source, body, headers)
        assert (r.status_code, r.json()["error"]) == (401, code), r.text

    stale = json.dumps({"id": "evt_stale", "type": "x"})
    header = stripe.WebhookSignature.generate_signature_header(
        stale, SECRETS["STRIPE_SECRET"], timestamp=now() - 3600
    )
    reject("stripe", stale.encode(), {"Stripe-Signature": header}, "timestamp_out_of_tolerance")

    pretty = json.dumps({"id": "evt_proxy", "type": "x", "data": {"amount": 1}}, indent=2)
    header = stripe.WebhookSignature.generate_signature_header(pretty, SECRETS["STRIPE_SECRET"])
    compact = json.dumps(json.loads(pretty)).encode()
    reject("stripe", compact, {"Stripe-Signature": header}, "signature_invalid")

    body = b'{"action": "closed"}'
    wrong = {
        "X-Hub-Signature-256": "sha256=" + hex_mac("not-the-secret", body),
        "X-GitHub-Delivery": "d",
        "X-GitHub-Event": "issues",
    }
    reject("github", body, wrong, "signature_invalid")

    body = b'{"type": "event_callback"}'
    v1 = {**slack_headers(body, SECRETS["SLACK_SECRET"], t=now())}
    v1["X-Slack-Signature"] = v1["X-Slack-Signature"].replace("v0=", "v1=")
    reject("slack", body, v1, "signature_version_unsupported")

    body = b'{"id": "WH-evil", "event_type": "X"}'
    evil = gateway.pki.headers(
        body, webhook_id=SECRETS["PAYPAL_WEBHOOK_ID"], time=iso(now()), url="https://evil.example/cert.pem"
    )
    reject("paypal", body, evil, "certificate_untrusted")

    expected = {
        ("stripe", "timestamp_out_of_tolerance"),
        ("stripe", "signature_invalid"),
        ("github", "signature_invalid"),
        ("slack", "signature_version_unsupported"),
        ("paypal", "certificate_untrusted"),
    }

    def failures_now() -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (row["source"], row["reason"]): row
            for row in gateway.rows("SELECT * FROM signature_failures WHERE source <> 'adyen'")
        }

    def written() -> bool:
        # Counted in memory and flushed every couple of seconds; the re-encoding diagnosis runs after
        # the answer, off the request path, and arrives in a later flush.
        now_failures = failures_now()
        return (
            expected <= now_failures.keys()
            and now_failures["stripe", "signature_invalid"]["hint"] is not None
        )

    wait_until(written, what="the failed verifications and the diagnosis to be flushed")
    failures = failures_now()
    detail = {key: row["last_detail"] for key, row in failures.items()}
    # The gateway's clock has moved on a little since the signing: 3600 s, or a second more.
    assert re.search(
        r"360[01] s in the past; tolerance is 300 s", detail["stripe", "timestamp_out_of_tolerance"]
    )
    # The sender's detail stays cheap; the operator reads the diagnosis in the rejects report and the log.
    assert "re-encoded" not in detail["stripe", "signature_invalid"]
    assert "body appears re-encoded in transit" in failures["stripe", "signature_invalid"]["hint"]
    assert "signature_failure.diagnosed" in gateway.process.log()
    assert "any of the 1 configured secret(s)" in detail["github", "signature_invalid"]
    assert "'v1'; only v0 is supported" in detail["slack", "signature_version_unsupported"]
    assert "is not a certificate URL of PayPal's" in detail["paypal", "certificate_untrusted"]

    stored = json.dumps([failures[key] for key in failures], default=str)
    log = gateway.process.log()
    forbidden = [*SECRETS.values(), *sent_signatures]
    forbidden += [
        piece
        for s in sent_signatures
        for piece in s.replace(",", " ").replace("=", " ").split()
        if len(piece) >= 20
    ]
    for value in forbidden:
        assert value not in stored
        assert value not in log
