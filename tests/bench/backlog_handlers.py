"""The handlers of the backlog benchmark: the backlog's kind, and the kind live traffic claims meanwhile.

With ``BENCH_STEPS_MS`` set (``worker_vs_pgqueuer --steps MS``), the backlog's handler is a payment's shape
instead of a no-op: two recorded steps, each around a downstream call that takes MS milliseconds.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from effectgate.handlers import Event, effect

STEP_SECONDS = float(os.environ.get("BENCH_STEPS_MS", "0")) / 1000


async def _downstream(key: str) -> str:
    await asyncio.sleep(STEP_SECONDS)
    return key


@effect(source="backlog", events=["*"], name="bench.backlog")
async def backlog_event(ctx: Any, ev: Event) -> None:
    if STEP_SECONDS:
        await ctx.step("charge", _downstream)
        await ctx.step("ship", _downstream)


@effect(source="live", events=["*"], name="bench.live")
async def live_event(ctx: Any, ev: Event) -> None:
    return None
