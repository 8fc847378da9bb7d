"""The ingress room's gateway: its configuration and the environment it names, a registry with effects on each
source, a Stripe event with its signed headers, and the short ways the tests post and read rows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import stripe

from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db

STRIPE_SECRET = "whsec_test_ingress"
STANDARD_SECRET = "whsec_" + "dGVzdC1zdGFuZGFyZC13ZWJob29rcy1zZWNyZXQ="
ENV = {"STRIPE_SECRET": STRIPE_SECRET, "STANDARD_SECRET": STANDARD_SECRET}
CONFIG = """
[gateway]
max_body_bytes = 4096

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
on_conflict = 409
on_refusal = "reject"

[sources.lenient]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[sources.connect]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
tenant_from = "/account"
tenant_pattern = "acct_[0-9]+"

[sources.standard]
scheme = "standard-webhooks"
secrets = ["STANDARD_SECRET"]
tenant = "acme"
"""


async def noop(ctx: Any, ev: Event) -> None:
    return None


def make_registry() -> Registry:
    registry = Registry()
    order = "order-paid:{}"
    for source in ("stripe", "lenient"):
        registry.effect(
            source=source,
            events=["payment_intent.succeeded", "charge.succeeded"],
            key=lambda ev: order.format(ev.payload["data"]["object"]["metadata"]["order_id"]),
            name=f"{source}.fulfil",
            # Two sources in one tenant, one order space: declared, or the gateway refuses to start.
            key_space="shared",
        )(noop)
    registry.effect(
        source="stripe",
        events=["payment_intent.succeeded"],
        name="stripe.notify",
        lock_key=lambda ev: f"intent:{ev.payload['data']['object']['id']}",
    )(noop)
    registry.effect(source="standard", events=["invoice.*"], name="standard.invoice")(noop)
    registry.effect(
        source="connect",
        events=["payment_intent.succeeded"],
        key=lambda ev: order.format(ev.payload["data"]["object"]["metadata"]["order_id"]),
        name="connect.fulfil",
    )(noop)
    return registry


def stripe_event(
    order_id: str = "1", event_id: str = "evt_1", type_: str = "payment_intent.succeeded"
) -> bytes:
    return json.dumps(
        {
            "id": event_id,
            "type": type_,
            "data": {"object": {"id": "pi_1", "metadata": {"order_id": order_id}}},
        }
    ).encode()


def stripe_headers(body: bytes, secret: str = STRIPE_SECRET, timestamp: int | None = None) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=timestamp)
    return {"stripe-signature": header, "content-type": "application/json"}


async def post(
    client: httpx.AsyncClient, source: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    return await client.post(f"/webhooks/{source}", content=body, headers=headers)


async def rows(conn: db.Conn, sql: str) -> list[dict[str, Any]]:
    return await (await conn.execute(sql)).fetchall()  # type: ignore[arg-type]
