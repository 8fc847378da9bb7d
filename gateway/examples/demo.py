"""The demo configuration ``effectgate up`` uses when no configuration file exists, and its deliveries.

Demo secrets are fixed, public and only for trying effectgate on a laptop; the demo sources read
them from environment variables like any other source, so nothing here is special-cased elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

from ..signatures import stripe

DEMO_ENV = {
    "EFFECTGATE_DEMO_STRIPE_SECRET": "whsec_effectgate_demo_only",
    "EFFECTGATE_DEMO_GITHUB_SECRET": "effectgate-demo-only",
    # base64 of 24 bytes, in Standard Webhooks' whsec_ form.
    "EFFECTGATE_DEMO_STANDARD_SECRET": "whsec_ZWZmZWN0Z2F0ZS1kZW1vLW9ubHktc2VjcmV0",
    # Bearer token of the demo's operator (view and operate) for /api/ and /ui/.
    "EFFECTGATE_DEMO_OPERATOR_TOKEN": "demo-operator-token-not-for-production",
}


def demo_config(*, host: str, port: int, fake_port: int) -> str:
    """The demo ``effectgate.toml``: Stripe, GitHub and Standard Webhooks sources, example handlers,
    and payments/shipping pointed at the local fake providers."""
    return f"""\
# effectgate demo configuration (written by `effectgate up`; safe to copy and edit).
[gateway]
host = "{host}"
port = {port}

[handlers]
modules = ["effectgate.handlers.examples.commerce", "effectgate.handlers.examples.audit"]
# The example module also fulfils Shopify orders; this deployment takes no Shopify webhooks.
skip_sources = ["shopify"]

[sources.stripe]
scheme = "stripe"
secrets = ["EFFECTGATE_DEMO_STRIPE_SECRET"]

[sources.github]
scheme = "github"
secrets = ["EFFECTGATE_DEMO_GITHUB_SECRET"]

[sources.standard]
scheme = "standard-webhooks"
secrets = ["EFFECTGATE_DEMO_STANDARD_SECRET"]

[worker]
concurrency = 4
backoff_base = 0.5
backoff_cap = 30

[[operators]]
name = "demo"
token_env = "EFFECTGATE_DEMO_OPERATOR_TOKEN"
scopes = ["view", "operate"]

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
"""


def payment_intent_event(
    order_id: str, event_type: str, *, event_id: str | None = None, amount: int = 4200
) -> dict[str, Any]:
    """A Stripe payment-intent event for ``order_id``, shaped like Stripe's, for a manual-capture payment.

    ``payment_intent.amount_capturable_updated`` carries the intent ``requires_capture`` (authorised,
    waiting for its capture); ``payment_intent.succeeded`` carries it captured, as Stripe sends it after
    the capture.
    """
    digest = hashlib.sha256(order_id.encode()).hexdigest()
    captured = event_type == "payment_intent.succeeded"
    return {
        "id": event_id or f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "type": event_type,
        "created": 1_700_000_000 + int(digest[:6], 16) + (1 if captured else 0),
        "data": {
            "object": {
                "id": f"pi_{digest[:24]}",
                "object": "payment_intent",
                "amount": amount,
                "amount_capturable": 0 if captured else amount,
                "amount_received": amount if captured else 0,
                "capture_method": "manual",
                "currency": "eur",
                "status": "succeeded" if captured else "requires_capture",
                "metadata": {"order_id": order_id},
            }
        },
    }


def payment_succeeded_event(
    order_id: str, *, event_id: str | None = None, amount: int = 4200
) -> dict[str, Any]:
    """A Stripe ``payment_intent.succeeded`` event for ``order_id`` (a captured intent), shaped like Stripe's."""
    return payment_intent_event(order_id, "payment_intent.succeeded", event_id=event_id, amount=amount)


#: A manual-capture payment's events in the order Stripe sends them: capture on the first, ship on the second.
DEMO_EVENT_TYPES = ("payment_intent.amount_capturable_updated", "payment_intent.succeeded")


def stripe_signature(body: bytes, secret: str, *, timestamp: int | None = None) -> str:
    """A ``Stripe-Signature`` header for ``body``, as Stripe computes it."""
    t = int(time.time()) if timestamp is None else timestamp
    return stripe.signature_header(body, secret, timestamp=t)


def example_delivery(
    url: str, order_id: str = "1234", event_type: str = DEMO_EVENT_TYPES[0]
) -> tuple[bytes, dict[str, str]]:
    """A signed demo delivery for the ``stripe`` source: body and headers."""
    suffix = "" if event_type == "payment_intent.succeeded" else "_capturable"
    event = payment_intent_event(order_id, event_type, event_id=f"evt_demo_order_{order_id}{suffix}")
    body = json.dumps(event).encode()
    headers = {
        "content-type": "application/json",
        "stripe-signature": stripe_signature(body, DEMO_ENV["EFFECTGATE_DEMO_STRIPE_SECRET"]),
    }
    return body, headers


def example_deliveries(url: str, order_id: str = "1234") -> list[tuple[bytes, dict[str, str]]]:
    """Both deliveries of a manual-capture payment, in Stripe's order (``DEMO_EVENT_TYPES``)."""
    return [example_delivery(url, order_id, t) for t in DEMO_EVENT_TYPES]


def curl_command(url: str, order_id: str = "1234") -> str:
    """A ready-to-paste curl command posting a signed demo delivery (valid for five minutes)."""
    body, headers = example_delivery(url, order_id)
    return (
        f"curl -sS -X POST {url}/webhooks/stripe "
        f"-H 'content-type: application/json' -H 'stripe-signature: {headers['stripe-signature']}' "
        f"--data-raw '{body.decode()}'"
    )
