"""The one effect kind tests/citus/chaos_run.py runs in real worker processes on the cluster.

A Stripe Connect event for an order of a connected account becomes one charge at the fake payment provider,
captured under the step's downstream idempotency key. ``CHAOS_PAUSE`` (seconds) holds the step open between
the capture call and its record, so a SIGKILL lands in the unknown-outcome window more often than by luck.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from effectgate.handlers import EffectContext, Event, effect

LEASE_TTL = float(os.environ.get("CHAOS_LEASE_TTL", "60"))
PAUSE = float(os.environ.get("CHAOS_PAUSE", "0"))


def order_key(ev: Event) -> str:
    return f"charge:{ev.payload['data']['object']['metadata']['order_id']}"


@effect(
    source="connect",
    events=["payment_intent.succeeded"],
    key=order_key,
    name="chaos.charge",
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
    max_attempts=100,
    fingerprint=["/data/object/amount", "/data/object/currency"],
)
async def charge(ctx: EffectContext, ev: Event) -> None:
    intent = ev.payload["data"]["object"]["id"]

    async def capture(key: str) -> dict[str, Any]:
        result = await ctx.payments.capture_payment_intent(intent, idempotency_key=key)
        await asyncio.sleep(PAUSE)
        return result

    await ctx.step("capture", capture)
