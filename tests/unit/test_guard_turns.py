"""Turns' bookkeeping: a boxed client's one turn, passed to the newest waiter, never back to a free turn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import pytest

from effectgate.gateway.guard import GuardedHttpToolsProtocol
from effectgate.gateway.turns import Turns


class Waiting:
    """Stands in for a connection whose request waits for its client's turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turn_waiter: asyncio.Future[bool] = loop.create_future()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def waiting(loop: asyncio.AbstractEventLoop, n: int) -> list[Any]:
    return [Waiting(loop) for _ in range(n)]


def served(requests: list[Any]) -> list[int]:
    return [i for i, r in enumerate(requests) if r._turn_waiter.done() and r._turn_waiter.result()]


def test_the_turn_passes_to_the_newest_waiter_and_is_never_free_meanwhile(
    loop: asyncio.AbstractEventLoop,
) -> None:
    turns = Turns()
    assert turns.take("a") and turns.take("b")
    assert not turns.take("a")
    requests = waiting(loop, 3)
    for request in requests:
        turns.wait("a", cast(GuardedHttpToolsProtocol, request))
    assert turns.oldest("a") is requests[0]
    turns.release("a")
    # Newest first: the one that became ready last; the turn stays taken (handed over, not freed).
    assert served(requests) == [2]
    assert not turns.take("a")
    turns.release("a")
    assert served(requests) == [1, 2]
    turns.forget("a", cast(GuardedHttpToolsProtocol, requests[0]))
    turns.release("a")
    # Nobody left waiting: free again. Client b's turn was never touched.
    assert turns.take("a") and not turns.take("b")


def test_a_waiter_whose_connection_was_lost_is_skipped(loop: asyncio.AbstractEventLoop) -> None:
    turns = Turns()
    turns.take("a")
    requests = waiting(loop, 2)
    for request in requests:
        turns.wait("a", cast(GuardedHttpToolsProtocol, request))
    requests[1]._turn_waiter.set_result(False)
    turns.release("a")
    assert served(requests) == [0]


def test_a_request_that_became_ready_during_the_turn_waits_for_one_that_was_waiting_before(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # The flood's answered connection is back during every turn: newest at every hand-off, it would
    # starve a genuine delivery that arrived a moment before it.
    now = [0.0]
    turns = Turns(clock=lambda: now[0])
    assert turns.take("a")  # a flood request's turn, from 0.0
    requests = old_flood, genuine, back, back_again = waiting(loop, 4)
    for at, request in ((0.2, old_flood), (0.5, genuine), (0.7, back)):
        now[0] = at
        turns.wait("a", cast(GuardedHttpToolsProtocol, request))
    now[0] = 1.0
    turns.release("a")  # all three came during the turn: the newest
    assert served(requests) == [2]
    now[0] = 1.5
    turns.wait("a", cast(GuardedHttpToolsProtocol, back_again))
    now[0] = 2.0
    turns.release("a")  # the one back during this turn is passed over for the genuine one, older
    assert served(requests) == [1, 2]
    now[0] = 3.0
    turns.release("a")
    assert served(requests) == [1, 2, 3]
    turns.release("a")
    assert served(requests) == [0, 1, 2, 3]
