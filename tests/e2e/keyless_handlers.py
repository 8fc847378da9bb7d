"""The handler the ``find=`` crash tests run in real ``effectgate worker`` processes.

One step makes a label at an API that takes no idempotency key (``tests.e2e.keyless_api``), through
``ctx.downstream("labels")``. The step's key is stamped into the label's ``reference``; ``find`` searches
by it. ``E2E_FIND=0`` leaves ``find`` out, to show the window it closes.
"""

from __future__ import annotations

import os
from typing import Any

from effectgate.handlers import EffectContext, Event, effect

LEASE_TTL = float(os.environ.get("E2E_LEASE_TTL", "60"))
FIND = os.environ.get("E2E_FIND", "1") == "1"


@effect(
    source="shop",
    events=["*"],
    key=lambda ev: f"label:{ev.payload['order']}",
    name="e2e.label",
    orphan_policy="redrive",
    lease_ttl=LEASE_TTL,
)
async def make_label(ctx: EffectContext, ev: Event) -> None:
    labels = ctx.downstream("labels")
    order = ev.payload["order"]

    async def create(key: str) -> dict[str, Any]:
        return await labels.request("POST", "/v1/labels", json={"order": order, "reference": key})

    async def find(key: str) -> dict[str, Any] | None:
        found = await labels.request("GET", "/v1/labels", params={"reference": key})
        return found["data"][0] if found["data"] else None

    await ctx.step("label", create, find=find if FIND else None)
