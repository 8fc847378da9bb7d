"""One catch-all effect per source of ``test_send_e2e``, so every delivery ``effectgate send`` makes is claimed."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event, effect

SOURCES = (
    "stripe",
    "github",
    "standard",
    "standard_ed25519",
    "shopify",
    "slack",
    "hmac",
    "twilio",
    "twilio_sharedkey",
    "adyen",
    "paypal",
)


async def _record(ctx: EffectContext, ev: Event) -> None:
    return None


for _source in SOURCES:
    effect(source=_source, events=["*"], name=f"send.{_source}")(_record)
