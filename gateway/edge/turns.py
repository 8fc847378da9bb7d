"""Boxed clients served one request at a time per process: the penalty box's ``one_at_a_time`` turns.

The connection guard (``edge.guard``) makes a boxed client's request wait here, unread, for its
client's turn, and gives the turn back when the request authenticates or is answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class TurnWaiting(Protocol):
    """What the turns touch of a waiting request's connection (``guard.GuardedHttpToolsProtocol``)."""

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def _turn_waiter(self) -> asyncio.Future[bool] | None: ...

    def _stop_waiting(self) -> None:
        """Give up its place: forgotten here and no longer counted in the box's ``held``, at once."""


# A boxed client's turn passes on no sooner than this after it was taken: at most 100 of its requests a
# second per process reach the app, whatever its connections, while a request that waits newest is served
# within about two of these.
TURN_INTERVAL = 0.01
# Every this-many-th hand-off of a client's turn goes to its longest-waiting request, so that none is passed
# over for ever by newer ones.
OLDEST_EVERY = 4


class Turns:
    """Boxed clients served one request at a time in this process: who has the turn, and who waits for it.

    Newest first, among the requests that were already waiting when the current turn began: a flood's
    connections each send their next request only once answered, so the request that became ready during
    a turn is, most often, the flood's answered connection back again, and it would be newest at every
    hand-off. Left for the turn after, it lets a genuine delivery from the boxed address through within a
    turn or two, however many flood requests wait below it; those wait until the header timeout closes
    them unanswered, as ``held`` would. With no one older waiting, the newest gets the turn.

    But a flood that opens new connections adds more than one request a turn, and there is then always one
    newer than a request that waits: so every ``OLDEST_EVERY``-th hand-off goes to the longest-waiting
    request instead. A request with n requests waiting ahead of it (older) gets the turn within
    ``OLDEST_EVERY * (n + 1)`` hand-offs, unless the header timeout closes it first.

    The turn passes on straight to the waiter (never back through a free turn another request could
    snatch). Waiters are kept in insertion order in a dict, so forgetting one (its connection lost) costs
    no scan of the others.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # client -> when its current turn began
        self._serving: dict[str, float] = {}
        # client -> hand-offs of its turn since it was last free
        self._handoffs: dict[str, int] = {}
        # client -> {waiting connection: when it began waiting}, oldest first
        self._waiting: dict[str, dict[TurnWaiting, float]] = {}

    def take(self, client: str) -> bool:
        """Whether ``client``'s turn was free (it is now taken)."""
        if client in self._serving:
            return False
        self._serving[client] = self._clock()
        return True

    def wait(self, client: str, protocol: TurnWaiting) -> None:
        """``protocol``'s turn waiter is resolved True when the turn passes to it."""
        self._waiting.setdefault(client, {})[protocol] = self._clock()

    def forget(self, client: str, protocol: TurnWaiting) -> None:
        waiting = self._waiting.get(client)
        if waiting is None:
            return
        waiting.pop(protocol, None)
        if not waiting:
            del self._waiting[client]

    def oldest(self, client: str) -> TurnWaiting | None:
        """The request of ``client``'s that has waited longest (the first to give up its place), if any."""
        waiting = self._waiting.get(client)
        return next(iter(waiting)) if waiting else None

    def release(self, client: str) -> None:
        """The request with ``client``'s turn is answered: the turn passes on (see the class), if anyone waits."""
        waiting = self._waiting.get(client)
        began = self._serving.get(client, 0.0)
        while waiting:
            handoffs = self._handoffs.get(client, 0) + 1
            self._handoffs[client] = handoffs
            protocol = next(iter(waiting)) if handoffs % OLDEST_EVERY == 0 else _newest_before(waiting, began)
            del waiting[protocol]
            waiter = protocol._turn_waiter
            if waiter is not None and not waiter.done():
                if not waiting:
                    del self._waiting[client]
                self._serving[client] = self._clock()
                waiter.set_result(True)
                return
        self._waiting.pop(client, None)
        self._serving.pop(client, None)
        self._handoffs.pop(client, None)


def _newest_before(waiting: dict[TurnWaiting, float], began: float) -> TurnWaiting:
    """The newest of ``waiting`` that waited before ``began``; else the newest. Only the few that became
    ready during the turn are looked at and passed over."""
    newest = None
    for protocol in reversed(waiting):
        if newest is None:
            newest = protocol
        if waiting[protocol] < began:
            return protocol
    assert newest is not None
    return newest
