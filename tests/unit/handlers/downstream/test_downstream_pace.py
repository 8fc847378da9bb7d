"""A downstream's pace (handlers/downstream/pace.py): calls at once, calls started a second, a 429's hold, and a
call whose turn is too far off refused before anything is sent.

The schedule is driven by a clock the test moves: ``sleep`` records the wait it was asked for and advances the
clock only where a test says so, so start times are read off exactly, not timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from effectgate.gateway import metrics
from effectgate.handlers.downstream import DownstreamConfig, paces, send_idempotent
from effectgate.handlers.downstream.pace import MAX_HOLD, NO_RETRY_AFTER_HOLD, Pace, PaceExceeded
from effectgate.handlers.errors import TransientError
from tests.held_provider import HeldProvider
from tests.prometheus import value

pytestmark = pytest.mark.anyio

BASE = "https://api.example.test"


class Clock:
    """Virtual time: ``sleep`` records (when, how long) and, with ``advance``, moves the clock to its end."""

    def __init__(self, *, advance: bool = False) -> None:
        self.now = 100.0
        self.advance = advance
        self.sleeps: list[tuple[float, float]] = []
        self.slept: dict[asyncio.Task[Any] | None, float] = {}
        self.during_sleep: Callable[[], None] | None = None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append((self.now, seconds))
        task = asyncio.current_task()
        self.slept[task] = self.slept.get(task, 0.0) + seconds
        if self.during_sleep is not None:
            hook, self.during_sleep = self.during_sleep, None
            hook()
        if self.advance:
            self.now += seconds
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Yield to the event loop until ``condition`` holds; fail after 5 s."""
    deadline = time.monotonic() + 5.0
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def paced(clock: Clock, **limits: Any) -> Pace:
    return Pace(clock=clock, sleep=clock.sleep, **limits)


async def start_times(pace: Pace, clock: Clock, calls: int) -> list[float | str]:
    """Each call's start (its reserved time: the clock plus the wait it slept), or 'refused'."""

    async def one() -> float | str:
        try:
            async with pace.turn():
                return (
                    clock.now if clock.advance else clock.now + clock.slept.get(asyncio.current_task(), 0.0)
                )
        except PaceExceeded:
            return "refused"

    return list(await asyncio.gather(*(one() for _ in range(calls))))


# -- limits --------------------------------------------------------------------------------------------


def test_limits_are_checked_and_name_the_field() -> None:
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="max_in_flight"):
            Pace(max_in_flight=bad)  # type: ignore[arg-type]
    for bad_rate in (0, -1.0, float("inf"), float("nan"), True, "5"):
        with pytest.raises(ValueError, match="max_per_second"):
            Pace(max_per_second=bad_rate)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_per_second"):
        DownstreamConfig(BASE, None, max_per_second=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        DownstreamConfig(BASE, None, max_in_flight=0)


async def test_calls_start_evenly_spaced_at_the_rate_in_the_order_they_asked() -> None:
    clock = Clock()
    pace = paced(clock, max_per_second=10)
    starts = await start_times(pace, clock, 5)
    assert starts == pytest.approx([100.0, 100.1, 100.2, 100.3, 100.4])


async def test_a_turn_further_off_than_the_wait_is_refused_and_not_reserved() -> None:
    clock = Clock()
    pace = paced(clock, max_per_second=1, max_wait=2.5)
    starts = await start_times(pace, clock, 5)
    assert starts == [100.0, 101.0, 102.0, "refused", "refused"]
    # The refused calls did not push the schedule: the next turn is still at +3 s, and its wait is what a
    # refused call is told to retry after.
    with pytest.raises(PaceExceeded) as refused:
        async with pace.turn():
            pytest.fail("a refused call must not run")
    assert isinstance(refused.value, TransientError)
    assert refused.value.retry_after == pytest.approx(3.0)
    clock.now += 1.0
    assert await start_times(pace, clock, 1) == [pytest.approx(103.0)]
    assert pace.waiting == 0


async def test_a_429_holds_the_calls_not_yet_started_and_a_long_one_is_capped_and_refused() -> None:
    clock = Clock(advance=True)
    pace = paced(clock, max_wait=10)
    pace.hold(4.0)
    pace.hold(2.0)  # a shorter hold never shortens a longer one
    assert await start_times(pace, clock, 1) == [pytest.approx(104.0)]
    assert await start_times(pace, clock, 1) == [pytest.approx(104.0)]  # the hold is over: no wait
    pace.hold(None)
    assert await start_times(pace, clock, 1) == [pytest.approx(104.0 + NO_RETRY_AFTER_HOLD)]
    pace.hold(3600.0)
    with pytest.raises(PaceExceeded) as refused:
        async with pace.turn():
            pytest.fail("a call held past its wait must not run")
    assert refused.value.retry_after == pytest.approx(MAX_HOLD)


async def test_a_429_arriving_while_a_call_waits_for_its_turn_moves_that_call_after_the_hold() -> None:
    clock = Clock(advance=True)
    pace = paced(clock, max_per_second=2)
    async with pace.turn():
        pass  # the first call starts at once and reserves the next turn, half a second later
    clock.during_sleep = lambda: pace.hold(3.0)
    starts = await start_times(pace, clock, 1)
    assert starts == [pytest.approx(103.0)]
    assert [seconds for _, seconds in clock.sleeps] == pytest.approx([0.5, 2.5])


async def test_at_most_max_in_flight_run_at_once_and_the_rest_wait_their_turn() -> None:
    pace = Pace(max_in_flight=2)
    gate = asyncio.Event()
    running = 0
    most = 0

    async def call() -> None:
        nonlocal running, most
        async with pace.turn():
            running += 1
            most = max(most, running)
            await gate.wait()
            running -= 1

    tasks = [asyncio.create_task(call()) for _ in range(6)]
    await until(lambda: running == 2 and pace.waiting == 4, "two calls running and four waiting")
    gate.set()
    await asyncio.gather(*tasks)
    assert most == 2 and pace.waiting == 0


async def test_a_call_waiting_for_a_slot_longer_than_its_wait_is_refused() -> None:
    pace = Pace(max_in_flight=1, max_wait=0.05)
    async with pace.turn():
        with pytest.raises(PaceExceeded, match="in flight"):
            async with pace.turn():
                pytest.fail("a refused call must not run")
    # The refused call gave nothing back that it had not taken: the one slot is free again.
    async with pace.turn():
        pass
    assert pace.waiting == 0


# -- over HTTP: the shared request path ------------------------------------------------------------------


async def test_send_idempotent_keeps_to_max_in_flight_and_every_call_is_answered() -> None:
    provider = HeldProvider()
    config = DownstreamConfig(BASE, "sk_test", max_in_flight=2)
    pace = paces([("payments", config)])["payments"]
    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        tasks = [
            asyncio.create_task(send_idempotent(http, config, "/v1/x", idempotency_key=f"k{i}", pace=pace))
            for i in range(6)
        ]
        await until(lambda: provider.held + pace.waiting == 6, "every call sent or waiting its turn")
        provider.gate.set()
        answers = await asyncio.gather(*tasks)
    assert provider.most_held == 2
    assert sorted(a["n"] for a in answers) == [1, 2, 3, 4, 5, 6]


async def test_after_a_429_the_next_call_is_not_sent_until_retry_after_and_paced_is_counted() -> None:
    calls: list[tuple[str, int | str, float]] = []

    def limited(n: int) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "30"}, json={"error": {"type": "rate_limit"}})

    provider = HeldProvider(answer=limited)
    provider.gate.set()
    config = DownstreamConfig(BASE, "sk_test", timeout=10)
    pace = config.pace()
    before = value(metrics.render(), "effectgate_downstream_calls_total", service="payments", status="paced")

    def heard(service: str, status: int | str, seconds: float) -> None:
        calls.append((service, status, seconds))
        metrics.downstream_call(service, status, seconds)

    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        with pytest.raises(TransientError) as first:
            await send_idempotent(
                http, config, "/v1/x", idempotency_key="k1", pace=pace, service="payments", on_call=heard
            )
        assert first.value.retry_after == 30
        # Held 30 s, past this API's 10 s wait: refused at once, and the provider never sees it.
        with pytest.raises(PaceExceeded) as second:
            await send_idempotent(
                http, config, "/v1/x", idempotency_key="k2", pace=pace, service="payments", on_call=heard
            )
    assert provider.requests == 1
    assert second.value.retry_after == pytest.approx(30, abs=1)
    assert [status for _, status, _ in calls] == [429, "paced"]
    assert (
        value(metrics.render(), "effectgate_downstream_calls_total", service="payments", status="paced")
        == before + 1
    )


async def test_without_a_pace_nothing_holds_after_a_429() -> None:
    provider = HeldProvider(answer=lambda n: httpx.Response(429, headers={"Retry-After": "30"}, json={}))
    provider.gate.set()
    config = DownstreamConfig(BASE, "sk_test")
    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        for key in ("k1", "k2"):
            with pytest.raises(TransientError):
                await send_idempotent(http, config, "/v1/x", idempotency_key=key)
    assert provider.requests == 2
