"""The effect-handler side of effectgate: register handlers, run them once per logical effect.

    from handlers import effect, TransientError, TerminalError

    @effect(source="stripe", events=["payment_intent.succeeded"],
            key=lambda ev: f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}",
            orphan_policy="redrive")
    async def fulfil_order(ctx, ev): ...
"""

from .context import EffectContext, Services
from .errors import HandlerError, StepAlreadyRun, TerminalError, TransientError, UnrecoverableError
from .registry import REGISTRY, EffectKind, Event, Registry, Transition, effect, register_sweep

__all__ = [
    "REGISTRY",
    "EffectContext",
    "EffectKind",
    "Event",
    "HandlerError",
    "Registry",
    "Services",
    "StepAlreadyRun",
    "TerminalError",
    "TransientError",
    "Transition",
    "UnrecoverableError",
    "effect",
    "register_sweep",
]
