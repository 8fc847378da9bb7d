"""Handlers the end-to-end tests run in real worker processes.

``E2E_CRASH_MARKER`` names a file: the first process to complete the capture call creates it and
SIGKILLs itself before the step is recorded — the unknown-outcome window, produced for real.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from effectgate.handlers import EffectContext, Event, effect

LEASE_TTL = float(os.environ.get("E2E_LEASE_TTL", "60"))
MAX_ATTEMPTS = int(os.environ.get("E2E_MAX_ATTEMPTS", "8"))


def order_key(ev: Event) -> str:
    return f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}"


def _crash_once() -> None:
    marker = os.environ.get("E2E_CRASH_MARKER")
    if marker and not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)


# As the README's example: both event types Stripe sends for one payment are one effect per order,
# and "the same request" is the amount and currency both carry.
SAME_PAYMENT = ["/data/object/amount", "/data/object/currency"]


@effect(
    source="shop",
    events=["payment_intent.succeeded", "charge.succeeded"],
    key=order_key,
    name="e2e.fulfil",
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
    max_attempts=MAX_ATTEMPTS,
    fingerprint=SAME_PAYMENT,
)
async def fulfil(ctx: EffectContext, ev: Event) -> None:
    obj = ev.payload["data"]["object"]
    order_id = obj["metadata"]["order_id"]
    intent = obj["id"] if obj["object"] == "payment_intent" else obj["payment_intent"]

    async def capture(key: str) -> dict[str, Any]:
        result = await ctx.payments.capture_payment_intent(intent, idempotency_key=key)
        _crash_once()
        return result

    await ctx.step("capture", capture)
    await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=order_id,
            address={"country": "DE"},
            items=[{"sku": "x", "quantity": 1}],
            idempotency_key=key,
        ),
    )


# The same effect for a Connect platform's source, whose tenant is each event's connected account.
effect(
    source="connect",
    events=["payment_intent.succeeded", "charge.succeeded"],
    key=order_key,
    name="e2e.connect_fulfil",
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
    max_attempts=MAX_ATTEMPTS,
    fingerprint=SAME_PAYMENT,
)(fulfil)
