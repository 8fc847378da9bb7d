"""The whole pipeline on a ledger, through the testing kit: a delivery claimed as the ingress claims it, its job run by
the worker with one step. Run beside an application's tables, after an upgrade, or as a role that may only read and
write rows, it shows the ledger works there."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.ledger.claims import Accepted
from effectgate.testing import TestLedger


def _registry() -> Registry:
    async def fulfil(ctx: EffectContext, ev: Event) -> None:
        async def ship(idem: str) -> dict[str, str]:
            return {"shipment": idem}

        await ctx.step("ship", ship)

    reg = Registry()
    reg.register(
        EffectKind(
            name="fulfil", source="shop", events=("order.paid",), fn=fulfil, key=lambda ev: f"o:{ev.id}"
        )
    )
    return reg


async def run_pipeline(url: str, event_id: str) -> None:
    """claim → job → handler, through the testing kit (the ingress's claim, the worker's run)."""
    ledger = TestLedger(url, registry=_registry())
    event = Event(id=event_id, type="order.paid", source="shop", payload={"order": event_id})
    [outcome] = await ledger.deliver(event)
    assert isinstance(outcome, Accepted)
    run = await ledger.run_job("fulfil")
    assert run.state == "succeeded"
    assert set(run.steps) == {"ship"}
