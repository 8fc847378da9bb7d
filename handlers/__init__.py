"""The effect-handler side of effectgate: register handlers, run them once per logical effect.

``effect`` registers an async handler for a source's event types with a key function; the worker
runs it with an ``EffectContext`` whose ``step`` makes each downstream call once per effect.
"""

from effectgate.ledger.vocabulary import JobState

from .context import EffectContext, Services
from .errors import HandlerError, StepAlreadyRun, TerminalError, TransientError, UnrecoverableError
from .event import Event, Transition
from .outcomes import HAND_BACK, HandBack
from .registry import REGISTRY, EffectKind, Registry, effect, register_sweep

__all__ = [
    "HAND_BACK",
    "REGISTRY",
    "EffectContext",
    "EffectKind",
    "Event",
    "HandBack",
    "HandlerError",
    "JobState",
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
