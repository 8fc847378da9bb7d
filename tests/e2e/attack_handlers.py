"""Handlers for ``test_replay_attacks``: a catch-all effect per source (every claim is counted), and two
effects routed on an unsigned type that guard themselves with ``require`` on the signed body."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event, effect

SOURCES = (
    "stripe",
    "github",
    "standard",
    "shopify",
    "slack",
    "hmac",
    "hmac_headers",
    "twilio",
    "paypal",
    "adyen",
)


async def _record(ctx: EffectContext, ev: Event) -> None:
    return None


for _source in SOURCES:
    effect(source=_source, events=["*"], name=f"attack.{_source}")(_record)

# Shopify's topic is unsigned: "orders/paid" proves nothing, the signed financial_status does.
effect(
    source="shopify",
    events=["orders/paid"],
    name="attack.shopify_paid",
    key=lambda ev: f"paid:{ev.payload['id']}",
    require={"/financial_status": "paid"},
    key_space="source",
)(_record)

# GitHub's X-GitHub-Event is unsigned: a deploy runs only for a body that says the pull request merged.
effect(
    source="github",
    events=["pull_request.closed"],
    name="attack.github_merged",
    key=lambda ev: f"merged:{ev.payload['pull_request']['id']}",
    require={"/pull_request/merged": True},
    key_space="source",
)(_record)
effect(
    source="bare",
    events=["pull_request.closed"],
    name="attack.bare_merged",
    key=lambda ev: f"merged:{ev.payload['pull_request']['id']}",
    require={"/pull_request/merged": True},
    key_space="source",
)(_record)
