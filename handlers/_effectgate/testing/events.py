"""Events as a handler sees them, built from the ``effectgate send`` examples, and handlers run on them.

``example_event`` signs an example body with the source's real scheme and a throwaway secret, then
verifies it with the same scheme: the event id, type and payload are what the gateway itself would
parse from that delivery (a body digest where the provider leaves its id header unsigned, one event per
Adyen notification item, Slack's inner event type). ``context_for`` asks ``handlers.plan.plan_event`` —
the one function the ingress uses — for the effect key, so the idempotency keys a test sees are the
keys production derives.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

from effectgate.gateway.examples import example
from effectgate.gateway.signatures import Signer, build_scheme
from effectgate.handlers.context import Services
from effectgate.handlers.event import Event
from effectgate.handlers.plan import plan_event
from effectgate.handlers.registry import REGISTRY, Registry
from effectgate.ledger.claims import EffectRequest

from .context import MemoryContext

# Throwaway secrets in each scheme's format, and the options a scheme cannot be built without. They
# never leave the process: the delivery is signed and verified in memory.
_SECRETS: Mapping[str, str] = {
    "stripe": "whsec_effectgate_testing",
    "github": "effectgate-testing",
    "standard-webhooks": "whsec_" + base64.b64encode(b"effectgate testing secret!").decode(),
    "shopify": "shpss_effectgate_testing",
    "slack": "effectgate-testing",
    "hmac": "effectgate-testing",
    "twilio": "effectgate-testing",
    "adyen": "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
}
_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "hmac": {"header": "X-Signature"},
    "twilio": {"url": "https://hooks.example.test/webhooks/twilio"},
}

EXAMPLE_SCHEMES = tuple(sorted(_SECRETS))
"""The schemes ``example_event`` builds events for (PayPal's examples need its certificate service)."""


def example_event(
    scheme: str,
    event_type: str | None = None,
    *,
    event_id: str | None = None,
    source: str | None = None,
    tenant: str = "default",
    options: Mapping[str, Any] | None = None,
) -> Event:
    """The event the gateway would hand a handler for the ``effectgate send --example`` delivery of
    ``scheme`` and ``event_type`` (the scheme's first example type when None; ``EXAMPLE_TYPES`` lists
    them, any other type gets a generic body). ``event_id`` fixes the id (a fresh one otherwise; the body
    derives its order ids from it); ``source`` is the configured source name (default: the scheme's
    name); ``options`` the scheme options the source is configured with (``hmac``'s ``id_header``…).
    ``ValueError`` for a scheme without examples."""
    if scheme not in _SECRETS:
        raise ValueError(
            f"scheme {scheme!r}: no example events can be built offline; one of {', '.join(EXAMPLE_SCHEMES)}"
        )
    built = example(scheme, event_type, event_id)
    merged = {**_OPTIONS.get(scheme, {}), **(options or {})}
    scheme_obj = build_scheme(scheme, [_SECRETS[scheme]], options=merged)
    assert isinstance(scheme_obj, Signer)
    signed = scheme_obj.sign(
        built.body, event_id=built.event_id, event_type=built.event_type, content_type=built.content_type
    )
    verified = scheme_obj.verify(signed.body, signed.headers)
    if not verified.events:
        raise ValueError(f"scheme {scheme!r}: a {built.event_type!r} delivery carries no event to handle")
    first = verified.events[0]
    return Event(
        source or scheme,
        first.id,
        first.type,
        first.payload,
        tenant,
        first.delivery_id,
        first.type_signed,
    )


def plan(event: Event, *, registry: Registry | None = None) -> list[EffectRequest]:
    """The effects ``event`` would claim, as the ingress decides them (``handlers.plan.plan_event``):
    one per registered handler whose source, type and ``require`` match, with its effect key."""
    return plan_event(registry or REGISTRY, event).effects


Handler = str | Callable[..., Any]
"""A registered handler: its name (``module.function`` unless ``@effect(name=…)``) or the function."""


def handler_name(handler: Handler, registry: Registry | None = None) -> str:
    """The registered name of ``handler`` (a name is returned as it is); ``LookupError`` for a function
    that is not registered."""
    if isinstance(handler, str):
        return handler
    for kind in (registry or REGISTRY).kinds():
        if kind.fn is handler:
            return kind.name
    raise LookupError(f"{getattr(handler, '__qualname__', handler)!r} is not a registered handler")


def context_for(
    event: Event,
    handler: Handler | None = None,
    *,
    registry: Registry | None = None,
    services: Services | None = None,
) -> MemoryContext:
    """A ``MemoryContext`` for the effect ``handler`` (a registered handler or its name; may be omitted
    when exactly one matches) claims for ``event``: its effect key and tenant are the ingress's."""
    effects = plan(event, registry=registry)
    names = [e.handler for e in effects]
    if handler is None:
        if len(effects) != 1:
            raise LookupError(
                f"event {event.type!r} from {event.source!r} matches {len(effects)} handlers "
                f"({', '.join(names) or 'none'}); name the one to run"
            )
        [effect] = effects
    else:
        name = handler_name(handler, registry)
        matching = [e for e in effects if e.handler == name]
        if not matching:
            raise LookupError(
                f"handler {name!r} does not claim event {event.type!r} from {event.source!r} "
                f"(matching: {', '.join(names) or 'none'})"
            )
        [effect] = matching
    return MemoryContext(
        event, effect_key=effect.effect_key, tenant=event.tenant, services=services, kind=effect.handler
    )


async def run_handler(ctx: MemoryContext, *, registry: Registry | None = None) -> Any:
    """Run the registered handler ``ctx`` was made for (``context_for``) once, on ``ctx.event``, and
    return what it returns (``HAND_BACK`` included). Its errors propagate as the worker would see them;
    ``ctx.rerun()`` is the next attempt."""
    kind = (registry or REGISTRY).get(ctx.kind)
    if kind is None:
        raise LookupError(f"no handler named {ctx.kind!r} is registered")
    return await kind.fn(ctx, ctx.event)
