"""The guard's per-client request slots, through a real uvicorn (tests/unit/gateway/edge/real_uvicorn.py): a client at its
share has its next requests wait unread, each admitted, in order, when one of its own finishes, while
another client's go straight through; a request that waits past the header timeout is answered 408 and
gives up its place; trusted proxies are not limited. ClientSlots' own bookkeeping is test_client_slots.py."""

from __future__ import annotations

import pytest

from effectgate.gateway.config.gateway import Limits
from effectgate.gateway.edge.client_slots import ClientSlots
from tests.unit.gateway.edge.real_uvicorn import App, eventually, serving, status

pytestmark = pytest.mark.anyio


async def test_a_client_at_its_share_waits_unread_and_is_admitted_in_order_as_its_own_requests_finish() -> (
    None
):
    app, slots = App(), ClientSlots(2)
    release = {name: app.hold(name) for name in ("a", "b", "first")}
    async with serving(app, slots=slots) as server:
        a, b = await server.request("a"), await server.request("b")
        await app.arrived["a"].wait()
        await app.arrived["b"].wait()
        first = await server.request("first")
        await eventually(lambda: slots.waited == 1, "the third request waiting")
        second = await server.request("second")
        await eventually(lambda: slots.waited == 2, "the fourth request waiting")

        # Another client is served meanwhile; the waiting requests are not read.
        other = await server.request("other", source="127.0.0.2")
        assert status(await other.answer()) == 200
        assert app.seen == ["a", "b", "other"]

        # One of its own finishes: the longest-waiting request is read, the other still waits.
        release["a"].set()
        assert status(await a.answer()) == 200
        await app.arrived["first"].wait()
        assert app.seen == ["a", "b", "other", "first"]

        release["b"].set()
        assert status(await b.answer()) == 200
        assert status(await second.answer()) == 200
        release["first"].set()
        assert status(await first.answer()) == 200
    assert app.seen == ["a", "b", "other", "first", "second"]
    assert slots.waited == 2 and not slots.full("127.0.0.1")


async def test_a_request_that_waits_past_the_header_timeout_is_answered_408_and_gives_up_its_place() -> None:
    # The header timeout is the test's duration: a second, so that the request after it is admitted well
    # within its own.
    app, slots = App(), ClientSlots(1)
    release = app.hold("a")
    async with serving(app, slots=slots, limits=Limits(header_timeout=1.0)) as server:
        a = await server.request("a")
        await app.arrived["a"].wait()
        late = await server.request("late")
        answer = await late.answer()
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"error": "request_timeout"' in answer

        after = await server.request("after")
        await eventually(lambda: slots.waited == 2, "the next request waiting")
        release.set()
        assert status(await a.answer()) == 200
        assert status(await after.answer()) == 200
    # The one that gave up was never read: the slot went to the one behind it.
    assert app.seen == ["a", "after"]
    assert not slots.full("127.0.0.1")


@pytest.mark.parametrize(
    ("trusted", "limited"),
    [((), True), (("*",), False), (("127.0.0.0/8",), False), (("127.0.0.9",), True), (("::1",), True)],
)
async def test_trusted_proxies_are_not_limited(trusted: tuple[str, ...], limited: bool) -> None:
    app, slots = App(), ClientSlots(1, trusted)
    release = app.hold("a")
    async with serving(app, slots=slots) as server:
        a = await server.request("a")
        await app.arrived["a"].wait()
        b = await server.request("b")
        if limited:
            await eventually(lambda: slots.waited == 1, "the second request waiting")
            assert app.seen == ["a"]
            release.set()
            assert status(await b.answer()) == 200
        else:
            # Straight through, while the first is still in flight.
            assert status(await b.answer()) == 200
            release.set()
        assert status(await a.answer()) == 200
    assert app.seen == ["a", "b"]
    assert slots.waited == (1 if limited else 0)
