"""A downstream's `max_per_second` kept in the ledger (`pace_scope = "ledger"`): paces on two pools, as two worker
processes hold them, take their turns from one schedule on real Postgres.

- together they start no faster than the one rate (each alone would start at it);
- a call refused because its turn is too far off reserves nothing, so the next call's turn is not pushed away;
- a 429 seen by one holds the other's calls back, also a call already waiting for its turn;
- a schedule that cannot be read refuses the call unsent.

The spacing is checked as a lower bound on the time the calls took (a loaded machine only makes it longer): each
pace alone would start the same calls in about half of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from effectgate.handlers.downstream import DownstreamConfig, Pace, PaceExceeded, paces
from effectgate.ledger import db
from effectgate.ledger.paces import LedgerTurns
from tests.integration.jobs_and_workers import scalar

pytestmark = pytest.mark.anyio

BASE = "https://api.example.test"


@pytest.fixture
async def other_pool(db_url: str) -> AsyncIterator[db.Pool]:
    """A second pool on the same ledger: the other worker process's."""
    p = db.make_pool(db_url, min_size=1, max_size=4, name="effectgate-test-other")
    await p.open(wait=True)
    try:
        yield p
    finally:
        await p.close()


def pace_on(
    pool: db.Pool, *, per_second: float, max_wait: float = 10.0, name: str = "api", **kw: object
) -> Pace:
    return Pace(
        max_per_second=per_second,
        max_wait=max_wait,
        name=name,
        shared=LedgerTurns(pool),
        **kw,  # type: ignore[arg-type]
    )


async def calls(pace: Pace, n: int, started: list[float]) -> None:
    for _ in range(n):
        async with pace.turn():
            started.append(time.monotonic())


async def test_two_processes_together_start_no_faster_than_the_one_rate(
    pool: db.Pool, other_pool: db.Pool
) -> None:
    # 20 a second: 20 calls, 10 from each, are spaced over 19 turns of 50 ms at least (each alone: 9 turns).
    one, other = pace_on(pool, per_second=20), pace_on(other_pool, per_second=20)
    started: list[float] = []
    await asyncio.gather(calls(one, 10, started), calls(other, 10, started))
    assert len(started) == 20
    span = max(started) - min(started)
    assert span >= 19 * 0.05 * 0.85, f"20 calls at 20 a second took {span:.3f} s"


async def test_config_scope_process_keeps_the_rate_per_process(pool: db.Pool, other_pool: db.Pool) -> None:
    # The same two paces built as `paces` builds them, one downstream per scope: only "ledger" is shared.
    configs = [
        ("shared", DownstreamConfig(BASE, None, max_per_second=5)),
        ("own", DownstreamConfig(BASE, None, max_per_second=5, pace_scope="process")),
        ("unpaced", DownstreamConfig(BASE, None)),
    ]
    built = paces(configs, LedgerTurns(pool))
    assert built["shared"].shared is not None and built["shared"].name == "shared"
    assert built["own"].shared is None
    assert built["unpaced"].shared is None  # no rate: nothing to share, no statement a call
    with pytest.raises(ValueError, match="pace_scope"):
        DownstreamConfig(BASE, None, pace_scope="cluster")


async def test_a_refused_call_reserves_nothing(pool: db.Pool, other_pool: db.Pool) -> None:
    # One call a second, a turn waited for at most 0.3 s: after one call, the next turn is about 1 s away.
    one, other = pace_on(pool, per_second=1, max_wait=0.3), pace_on(other_pool, per_second=1, max_wait=0.3)
    sent = 0
    async with one.turn():
        sent += 1
    refusals = []
    for _ in range(3):
        with pytest.raises(PaceExceeded) as refused:
            async with other.turn():
                sent += 1
        refusals.append(refused.value.retry_after)
    assert sent == 1
    # Each refusal names the same turn, about a second off: none pushed it further away.
    assert all(r is not None and 0.3 < r <= 1.0 for r in refusals), refusals
    async with pool.connection() as conn:
        left = await scalar(
            conn, "SELECT extract(epoch FROM next_at - clock_timestamp()) FROM downstream_paces"
        )
    assert left <= 1.0


async def test_a_429_in_one_process_holds_the_other_s_calls(pool: db.Pool, other_pool: db.Pool) -> None:
    one, other = (
        pace_on(pool, per_second=100, max_wait=0.5),
        pace_on(other_pool, per_second=100, max_wait=0.5),
    )
    await calls(other, 1, [])  # a call goes through before the 429
    one.hold(2.0)
    await one.settled()
    sent = 0
    with pytest.raises(PaceExceeded) as refused:
        async with other.turn():
            sent += 1
    assert sent == 0
    assert refused.value.retry_after is not None and 1.0 < refused.value.retry_after <= 2.0


async def test_a_429_while_a_call_waits_for_its_turn_voids_that_turn(
    pool: db.Pool, other_pool: db.Pool
) -> None:
    sleeping = asyncio.Event()

    async def sleep(seconds: float) -> None:
        sleeping.set()
        await asyncio.sleep(seconds)

    one = pace_on(pool, per_second=100)
    # Two a second: the second call's turn is half a second off, and it sleeps for it.
    other = pace_on(other_pool, per_second=2, sleep=sleep, name="api")
    await calls(other, 1, [])
    started: list[float] = []
    waiting = asyncio.create_task(calls(other, 1, started))
    await asyncio.wait_for(sleeping.wait(), 5.0)
    held_at = time.monotonic()
    one.hold(1.5)
    await one.settled()
    await asyncio.wait_for(waiting, 10.0)
    assert started[0] - held_at >= 1.5 * 0.95, f"started {started[0] - held_at:.3f} s after a 1.5 s hold"


async def test_a_schedule_that_cannot_be_read_refuses_the_call_unsent(db_url: str) -> None:
    closed = db.make_pool(db_url, min_size=0, max_size=1, name="effectgate-test-closed")
    pace = pace_on(closed, per_second=10)
    sent = 0
    with pytest.raises(PaceExceeded, match="could not be read"):
        async with pace.turn():
            sent += 1
    assert sent == 0
    assert pace.waiting == 0
