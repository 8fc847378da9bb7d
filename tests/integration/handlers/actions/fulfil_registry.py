"""A registry of its own with one kind, ``fulfil``, for Stripe's ``thing.*`` events keyed by the payload's key: the
handler that arrives after its deliveries did, for the tests that replay unmatched deliveries. Its handler, ``noop``,
does nothing."""

from __future__ import annotations

from typing import Any

from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry


async def noop(ctx: Any, ev: Event) -> None:
    return None


def fulfil_registry() -> Registry:
    reg = Registry()
    reg.effect(
        source="stripe", events=["thing.*"], key=lambda ev: f"order:{ev.payload['key']}", name="fulfil"
    )(noop)
    return reg
