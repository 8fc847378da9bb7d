"""One handler, to show a derived image can install and import a package of its own."""

from __future__ import annotations

from typing import Any

from effectgate.handlers import REGISTRY, EffectContext, Event, effect


@effect(
    source="stripe",
    events=["customer.created"],
    key=lambda ev: f"customer-created:{ev.payload['data']['object']['id']}",
    name="ci_handlers.noted",
)
async def noted(ctx: EffectContext, ev: Event) -> dict[str, Any]:
    """Records nothing downstream: the customer id is the result."""
    return {"customer": ev.payload["data"]["object"]["id"]}


def handled() -> str:
    """The names of the effect kinds this process has registered."""
    return ",".join(sorted(kind.name for kind in REGISTRY.kinds()))
