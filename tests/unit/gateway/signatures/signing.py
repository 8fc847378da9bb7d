"""Signers for the tests: how each provider would sign a body, with the tests' fixed ids and defaults.

The signing itself is the gateway's own (``sign`` next to each verifier, used by ``effectgate send``),
checked in ``test_signers.py`` against the providers' libraries and published examples. Stripe,
Standard Webhooks, Twilio and Adyen are also signed with the providers' own libraries in their test
modules; these helpers serve the cross-scheme tests (fuzzing, diagnostics) that need a valid signature
for every scheme.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import hmac
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effectgate.gateway.signatures import (
    Scheme,
    build_scheme,
    github,
    shopify,
    slack,
    standard_webhooks,
    stripe,
    twilio,
)
from tests.unit.gateway.signatures.paypal_pki import CERT_URL, MemoryFetcher, Pki, iso

NOW = 1_700_000_000
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TWILIO_URL = "https://example.test/webhooks/twilio?tenant=acme"


def hex_mac(secret: str, message: bytes, digest: str = "sha256") -> str:
    return hmac.new(secret.encode(), message, digest).hexdigest()


def b64_mac(key: bytes, message: bytes, digest: str = "sha256") -> str:
    return base64.b64encode(hmac.new(key, message, digest).digest()).decode()


def stripe_headers(body: bytes, secret: str = "whsec_stripe_test", t: int = NOW) -> dict[str, str]:
    return {"Stripe-Signature": stripe.signature_header(body, secret, timestamp=t)}


def github_headers(body: bytes, secret: str = "gh-secret", event: str = "push") -> dict[str, str]:
    return {
        "X-Hub-Signature-256": github.signature_header(body, secret),
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": event,
    }


def sw_headers(body: bytes, secret: str = SW_SECRET, msg_id: str = "msg_1", t: int = NOW) -> dict[str, str]:
    signature = standard_webhooks.hmac_signature(body, secret, msg_id=msg_id, timestamp=t)
    return {"webhook-id": msg_id, "webhook-timestamp": str(t), "webhook-signature": signature}


def shopify_headers(body: bytes, secret: str = "shpss_secret") -> dict[str, str]:
    return {
        "X-Shopify-Hmac-Sha256": shopify.signature(body, secret),
        "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        "X-Shopify-Topic": "orders/create",
    }


def slack_headers(body: bytes, secret: str = "slack-signing-secret", t: int = NOW) -> dict[str, str]:
    return {
        "X-Slack-Signature": slack.signature(body, secret, timestamp=t),
        "X-Slack-Request-Timestamp": str(t),
    }


def hmac_headers(body: bytes, secret: str = "generic-secret", t: int = NOW) -> dict[str, str]:
    """For the ``HMAC_OPTIONS`` configuration: ``sha256=<hex>`` over ``"<t>." + body``."""
    signed = build_scheme("hmac", [secret], options=HMAC_OPTIONS).sign(body, now=t)
    return {name: signed.headers[name] for name in ("X-Signature", "X-Timestamp")}


HMAC_OPTIONS: dict[str, Any] = {
    "header": "X-Signature",
    "prefix": "sha256=",
    "timestamp_header": "X-Timestamp",
}


def twilio_json_headers(body: bytes, token: str = "twilio-token", url: str = TWILIO_URL) -> dict[str, str]:
    return {
        "X-Twilio-Signature": twilio.signature(twilio.json_url(url, body), (), token),
        "Content-Type": "application/json",
        "I-Twilio-Idempotency-Token": "idem-1",
    }


PAYPAL_WEBHOOK_ID = "1JE4291016473214C"
PAYPAL_PKI = Pki.around(NOW)
_PAYPAL_DIR = Path(tempfile.mkdtemp(prefix="effectgate-paypal-ca-"))
atexit.register(shutil.rmtree, _PAYPAL_DIR, ignore_errors=True)
PAYPAL_CA_FILE = PAYPAL_PKI.write_root(_PAYPAL_DIR)


def paypal_headers(body: bytes, webhook_id: str = PAYPAL_WEBHOOK_ID, t: int = NOW) -> dict[str, str]:
    return PAYPAL_PKI.headers(body, webhook_id=webhook_id, time=iso(t))


def paypal_options() -> dict[str, Any]:
    """Trust the tests' CA and serve its chain from memory, and ask no API: nothing here reaches the network."""
    return {
        "ca_bundle": PAYPAL_CA_FILE,
        "fetcher": MemoryFetcher({CERT_URL: PAYPAL_PKI.chain_pem}),
        "confirm": "off",
    }


def warm_paypal(scheme: Scheme) -> None:
    """Run the gateway's prepare step, so that ``verify`` finds the certificate cached."""
    # A plausible request (every header, in time): prepare fetches nothing for less.
    asyncio.run(scheme.prepare(b"", paypal_headers(b""), now=NOW))


@dataclass(frozen=True)
class Case:
    """One scheme as the cross-scheme tests see it: how to build it and how to sign for it.

    ``prepare`` stands in for the gateway awaiting ``Scheme.prepare`` before each delivery, for the
    schemes whose verification needs it (PayPal's certificate).
    """

    name: str
    secret: str
    sign: Callable[[bytes], dict[str, str]]
    headers: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    prepare: Callable[[Scheme], None] | None = None

    def build(self, *secrets: str) -> Scheme:
        scheme = build_scheme(self.name, secrets or (self.secret,), options=self.options)
        if self.prepare is not None:
            self.prepare(scheme)
        return scheme


CASES = [
    Case("stripe", "whsec_stripe_test", stripe_headers, ("Stripe-Signature",)),
    Case(
        "github", "gh-secret", github_headers, ("X-Hub-Signature-256", "X-Hub-Signature", "X-GitHub-Delivery")
    ),
    Case(
        "standard-webhooks", SW_SECRET, sw_headers, ("webhook-id", "webhook-timestamp", "webhook-signature")
    ),
    Case("shopify", "shpss_secret", shopify_headers, ("X-Shopify-Hmac-Sha256", "X-Shopify-Topic")),
    Case("slack", "slack-signing-secret", slack_headers, ("X-Slack-Signature", "X-Slack-Request-Timestamp")),
    Case("hmac", "generic-secret", hmac_headers, ("X-Signature", "X-Timestamp"), HMAC_OPTIONS),
    Case(
        "twilio",
        "twilio-token",
        twilio_json_headers,
        ("X-Twilio-Signature", "Content-Type", "I-Twilio-Idempotency-Token"),
        {"url": TWILIO_URL},
    ),
    Case(
        "paypal",
        PAYPAL_WEBHOOK_ID,
        paypal_headers,
        (
            "PAYPAL-TRANSMISSION-ID",
            "PAYPAL-TRANSMISSION-TIME",
            "PAYPAL-TRANSMISSION-SIG",
            "PAYPAL-CERT-URL",
            "PAYPAL-AUTH-ALGO",
        ),
        paypal_options(),
        warm_paypal,
    ),
]
CASE_IDS = [case.name for case in CASES]

# One JSON body every scheme can read an event from: Stripe/hmac use id and type, Standard Webhooks
# type, Slack event_id and event.type, PayPal id and event_type; GitHub, Shopify and Twilio take the
# id from headers. (Adyen signs fields inside its own body shape, so it has tests of its own.)
EVENT_BODY = (
    b'{"id": "evt_1", "type": "thing.happened", "event_id": "Ev1", "event": {"type": "message"},'
    b' "event_type": "THING.HAPPENED", "note": "caf\xc3\xa9"}'
)
