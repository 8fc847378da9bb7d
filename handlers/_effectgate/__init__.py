"""effectgate: a webhook consumer gateway with an idempotent effect ledger.

This is the one import a handler module needs::

    from effectgate import HAND_BACK, EffectContext, Event, TransientError, effect

The names in ``__all__`` are the public handler API, pinned by a test; ``effectgate.testing`` is the kit
for testing handlers (docs/testing.md). The gateway, the worker runtime
and the ledger live in ``effectgate.gateway``, ``effectgate.handlers`` and ``effectgate.ledger``. (In the
repository this file lives in ``handlers/_effectgate/``; pyproject's package-dir installs it as the
top-level ``effectgate`` package.)

The names are resolved on first use, so ``import effectgate.ledger`` does not pull in the handler side
(the ledger imports nothing else of the project, and importing it must not either).
"""

import importlib as _importlib
import importlib.metadata as _metadata
import typing as _typing

if _typing.TYPE_CHECKING:
    from effectgate.handlers import (
        HAND_BACK,
        EffectContext,
        EffectKind,
        Event,
        HandBack,
        HandlerError,
        JobState,
        Services,
        StepAlreadyRun,
        TerminalError,
        TransientError,
        Transition,
        UnrecoverableError,
        effect,
        register_sweep,
    )

try:
    __version__ = _metadata.version("effectgate")
except _metadata.PackageNotFoundError:  # pragma: no cover - only when run from an uninstalled tree
    __version__ = "0+unknown"

__all__ = [
    "HAND_BACK",
    "EffectContext",
    "EffectKind",
    "Event",
    "HandBack",
    "HandlerError",
    "JobState",
    "Services",
    "StepAlreadyRun",
    "TerminalError",
    "TransientError",
    "Transition",
    "UnrecoverableError",
    "__version__",
    "effect",
    "register_sweep",
]


def __getattr__(name: str) -> _typing.Any:
    if name in __all__:
        value = getattr(_importlib.import_module("effectgate.handlers"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'effectgate' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
