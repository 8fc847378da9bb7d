"""The handlers of the backlog benchmark: the backlog's kind, and the kind live traffic claims meanwhile."""

from __future__ import annotations

from typing import Any

from effectgate.handlers import Event, effect


@effect(source="backlog", events=["*"], name="bench.backlog")
async def backlog_event(ctx: Any, ev: Event) -> None:
    return None


@effect(source="live", events=["*"], name="bench.live")
async def live_event(ctx: Any, ev: Event) -> None:
    return None
