"""Example handler: keep an audit record of every GitHub and Standard Webhooks event, once each."""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, effect


async def _audit(ctx: EffectContext, ev: Event) -> None:
    async def record(_key: str) -> dict[str, Any]:
        return {"source": ev.source, "event_id": ev.id, "type": ev.type}

    await ctx.step("audit", record)


for _source in ("github", "standard"):
    effect(source=_source, events=["*"], name=f"audit.{_source}", orphan_policy="redrive")(_audit)
