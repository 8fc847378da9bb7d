"""One catch-all effect per scheme's source, for ``test_schemes_e2e``: every verified event is claimed."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event, effect

SOURCES = ("stripe", "github", "standard", "shopify", "slack", "hmac", "twilio", "paypal", "adyen")


async def _record(ctx: EffectContext, ev: Event) -> None:
    return None


for _source in SOURCES:
    effect(source=_source, events=["*"], name=f"schemes.{_source}")(_record)
