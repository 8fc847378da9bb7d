"""The handler of the out-of-order end-to-end test (test_ordering_e2e.py), run by a real worker process: it
mirrors a subscription's status, versioned by the event's ``created``, and logs each run as it starts."""

from __future__ import annotations

from effectgate.handlers import EffectContext, Event, effect


@effect(
    source="shop",
    events=["customer.subscription.updated"],
    name="sync_subscription",
    lock_key=lambda ev: f"subscription:{ev.payload['data']['object']['id']}",
    version="/created",
)
async def sync_subscription(ctx: EffectContext, ev: Event) -> None:
    subscription = ev.payload["data"]["object"]
    # One line per run, in the order the runs started; the test reads them back from the worker's log.
    print(f"ordering.ran {subscription['id']} {subscription['seq']}", flush=True)
