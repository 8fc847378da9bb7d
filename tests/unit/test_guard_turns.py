"""The guard's wait for a boxed client's turn, bounded by ``hold``."""

from __future__ import annotations

import asyncio
from typing import Any

from effectgate.gateway.config.gateway import Limits, PenaltySettings
from effectgate.gateway.edge.guard import GuardedHttpToolsProtocol
from effectgate.gateway.edge.penalty_box import PenaltyBox
from effectgate.gateway.edge.turns import Turns


class ClosingTransport:
    """As asyncio's: ``close`` calls the protocol's ``connection_lost`` soon, not now."""

    def __init__(self, protocol: WaitingConnection, loop: asyncio.AbstractEventLoop) -> None:
        self.protocol, self.loop, self.closing = protocol, loop, False

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closing


class Cycle:
    """What ``_wait_for_turn`` touches of uvicorn's request cycle: a request whose body is in."""

    waiting_for_100_continue = False
    more_body = False
    disconnected = False
    body = b""


class WaitingConnection:
    """The guard's connection, with only its turn-waiting parts (``GuardedHttpToolsProtocol``'s own)."""

    limits = Limits()
    _wait_for_turn = GuardedHttpToolsProtocol._wait_for_turn
    _stop_waiting = GuardedHttpToolsProtocol._stop_waiting

    def __init__(self, loop: asyncio.AbstractEventLoop, box: PenaltyBox, turns: Turns) -> None:
        self.loop, self.box, self.turns, self.client = loop, box, turns, ("10.0.0.1", 1)
        self.transport = ClosingTransport(self, loop)
        self._turn_waiter: asyncio.Future[bool] | None = None

    def _arm(self, *args: Any) -> None: ...

    def _disarm(self) -> None: ...

    def _release_slot(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None:
        # GuardedHttpToolsProtocol.connection_lost's part for a waiting request.
        self._stop_waiting()


def test_hold_bounds_the_waiting_requests_of_a_burst_that_arrives_in_one_loop_pass() -> None:
    # Past hold each new request closes its client's longest-waiting one, whose connection is lost only
    # in a later pass: every request of the same pass found the same oldest one, and held grew past hold
    # by the burst (hold 4, 54 requests: 53 held).
    async def burst() -> tuple[int, int, list[bool]]:
        loop = asyncio.get_running_loop()
        box = PenaltyBox(PenaltySettings(hold=4))
        turns = Turns()
        assert turns.take("10.0.0.1")  # a flood request in its turn
        connections = [WaitingConnection(loop, box, turns) for _ in range(54)]
        tasks = [asyncio.ensure_future(c._wait_for_turn(Cycle(), box, turns, "s")) for c in connections[:4]]
        await asyncio.sleep(0)
        assert box.held == 4
        tasks += [asyncio.ensure_future(c._wait_for_turn(Cycle(), box, turns, "s")) for c in connections[4:]]
        for _ in range(5):
            await asyncio.sleep(0)
        held, during = box.held, box.held
        for _ in range(4):
            turns.release("10.0.0.1")
        _, pending = await asyncio.wait(tasks, timeout=5)
        for task in pending:
            task.cancel()
        held = box.held
        return during, held, [c.transport.closing for c in connections]

    during, after, closed = asyncio.run(burst())
    assert during == 4, f"held {during} waiting requests with hold = 4"
    # The four newest wait (and were then served); every other was closed unanswered.
    assert closed == [True] * 50 + [False] * 4
    assert after == 0


def test_a_request_closed_for_want_of_room_is_not_answered_by_uvicorn() -> None:
    # Hold full of another client's waiters and none of its own to give up: this request closes its own
    # connection. Its cycle must say disconnected, or uvicorn logs "ASGI callable returned without
    # starting response" at ERROR and writes a 500 to the closing socket.
    async def full() -> tuple[bool, bool, int]:
        loop = asyncio.get_running_loop()
        box = PenaltyBox(PenaltySettings(hold=0))
        turns = Turns()
        assert turns.take("10.0.0.1")
        connection, cycle = WaitingConnection(loop, box, turns), Cycle()
        got = await connection._wait_for_turn(cycle, box, turns, "s")
        return got, cycle.disconnected, box.held

    got, disconnected, held = asyncio.run(full())
    assert (got, disconnected, held) == (False, True, 0)
