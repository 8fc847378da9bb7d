"""Listeners a ledger module tells of what it saw (a failover, a skipped node), without importing who listens.

The gateway's and the worker's processes hand in their metrics' counters (``gateway.metrics``); ``ledger`` cannot
import ``gateway``. A listener must not block: it runs where the module saw the thing, on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")

log = logging.getLogger("effectgate.ledger")


class Listeners(Generic[P]):
    """Callables told of each event; one that raises is logged as ``<name>_listener_failed`` and the rest go on."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._listeners: list[Callable[P, None]] = []

    def listen(self, listener: Callable[P, None]) -> Callable[[], None]:
        """Call ``listener`` for every event from now on; returns the function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def tell(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in list(self._listeners):
            try:
                listener(*args, **kwargs)
            except Exception as exc:  # one listener's bug must not fail what saw the event
                log.error(f"{self._name}_listener_failed", extra={"error": f"{type(exc).__name__}: {exc}"})
