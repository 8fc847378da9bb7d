"""The guard's wait for a boxed client's turn (the penalty box's ``one_at_a_time`` mode), through a real uvicorn
(tests/unit/gateway/edge/real_uvicorn.py): at most ``hold`` requests wait, however many arrive in one pass of the loop, and
one closed for want of room is closed unanswered, without uvicorn's 500. Turns' own bookkeeping (who gets
the turn next) is test_turns.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from effectgate.gateway.config.gateway import PenaltySettings
from effectgate.gateway.edge.penalty_box import PenaltyBox
from tests.unit.gateway.edge.real_uvicorn import WITHIN, App, eventually, request, serving, status

pytestmark = pytest.mark.anyio

SOURCE = "/webhooks/s"


def boxed(hold: int) -> PenaltyBox:
    """A box in which 127.0.0.1 is held off source ``s``: its requests there take turns."""
    box = PenaltyBox(PenaltySettings(failures=1, hold=hold))
    assert box.failed("127.0.0.1", 0, "s")
    return box


async def test_hold_bounds_the_waiting_requests_of_a_burst_that_arrives_in_one_loop_pass() -> None:
    # Past hold each new request closes its client's longest-waiting one, whose connection is lost only
    # in a later pass: every request of the same pass found the same oldest one, and held grew past hold
    # by the burst (hold 4, 54 requests: 53 held, one closed).
    app, box = App(), boxed(hold=4)
    release = app.hold("turn")
    async with serving(app, box=box) as server:
        turn = await server.request("turn", SOURCE)
        await app.arrived["turn"].wait()
        early = []
        for n in range(4):
            early.append(await server.request(f"early{n}", SOURCE))
            await eventually(lambda n=n: box.held == n + 1, f"request {n} waiting for the turn")
        burst = [await server.connect() for _ in range(50)]
        # Written with no await between: the server reads all fifty in one pass of the loop.
        for n, client in enumerate(burst):
            client.send(request(f"burst{n}", SOURCE))
        answers = [asyncio.ensure_future(client.answer()) for client in [*early, *burst]]
        await eventually(lambda: sum(a.done() for a in answers) == 50, "fifty requests closed")
        assert box.held == 4, f"held {box.held} waiting requests with hold = 4"
        # The four that waited before the burst were the oldest: they gave up their places first.
        assert all(a.done() for a in answers[:4])
        assert [a.result() for a in answers if a.done()] == [b""] * 50, "closed unanswered"

        # The turn passes on: the four that still wait are each read and answered.
        release.set()
        assert status(await turn.answer()) == 200
        done, _ = await asyncio.wait(answers, timeout=WITHIN)
        assert len(done) == 54
        assert sorted(status(a.result()) for a in answers) == [0] * 50 + [200] * 4
    assert len(app.seen) == 5 and box.held == 0


async def test_a_request_closed_for_want_of_room_is_not_answered_by_uvicorn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Hold full (here 0) and none of its client's requests waiting to give up: this request closes its own
    # connection. Its cycle must say disconnected, or uvicorn logs "ASGI callable returned without starting
    # response" at ERROR and answers 500 (to the closing socket, where the bytes are dropped).
    app, box = App(), boxed(hold=0)
    release = app.hold("turn")
    with caplog.at_level(logging.ERROR):
        async with serving(app, box=box) as server:
            turn = await server.request("turn", SOURCE)
            await app.arrived["turn"].wait()
            refused = await server.request("refused", SOURCE)
            assert await refused.answer() == b""
            assert box.held == 0
            release.set()
            assert status(await turn.answer()) == 200
    assert app.seen == ["turn"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
