"""The one handler the ingress benchmark's gateway matches: every event claims one effect."""

from __future__ import annotations

from typing import Any

from effectgate.handlers import Event, effect


@effect(source="bench", events=["*"], name="bench.any")
async def any_event(ctx: Any, ev: Event) -> None:
    return None
