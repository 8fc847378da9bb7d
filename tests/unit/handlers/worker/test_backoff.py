"""The retry schedule (handlers.worker.backoff): the defaults outlast a day's outage, every wait is drawn
within its jitter bounds, and a kind's own backoff is what its retries wait by."""

from __future__ import annotations

import random
from typing import Any

import pytest

from effectgate.handlers.effect_kind import DEFAULT_MAX_ATTEMPTS, EffectKind
from effectgate.handlers.worker.backoff import RetrySchedule, backoff_delay, duration, kind_backoff
from effectgate.handlers.worker.config import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, WorkerConfig

DAY = 86_400.0
DEFAULT = RetrySchedule(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, DEFAULT_MAX_ATTEMPTS)


async def handler(ctx: Any, ev: Any) -> None:
    return None


def kind(**settings: Any) -> EffectKind:
    return EffectKind(name="k", source="s", events=("e",), fn=handler, **settings)


def test_the_default_budget_retries_for_a_day_at_the_least_before_an_effect_fails() -> None:
    # Every jitter draw at its low end still keeps an effect alive through a day of downstream outage;
    # at the high end it stays under Stripe's 3 days of retrying the webhook itself.
    assert DEFAULT.shortest_total >= DAY
    assert DEFAULT.longest_total <= 3 * DAY
    assert (DEFAULT.shortest_total, DEFAULT.longest_total) == (86_647.5, 173_295.0)
    # No wait is longer than the cap: a downstream back after an hour-long outage is retried within the hour.
    assert max(DEFAULT.ceilings()) == DEFAULT_BACKOFF_CAP == 3600.0
    assert len(DEFAULT.ceilings()) == DEFAULT_MAX_ATTEMPTS - 1 == 59


def test_the_default_schedule_as_config_show_prints_it() -> None:
    lines = DEFAULT.describe()
    assert lines[0] == "after attempt 1: 0.5s-1s"
    assert lines[11] == "after attempt 12: 17m4s-34m8s"
    assert lines[12] == "after attempts 13-59: 30m-1h0m each"
    assert lines[-1] == "total before attempt 60 fails the job: 1d0h4m-2d0h8m"
    assert RetrySchedule(0.0, 0.0, 3).describe() == ["2 retries at once (backoff_base = 0: waits off)"]
    assert RetrySchedule(1.0, 1.0, 1).describe() == ["no retry: the first failed attempt fails the job"]


def test_every_wait_is_within_its_jitter_bounds_and_a_drawn_schedule_within_its_totals() -> None:
    rng = random.Random(38)
    for _ in range(200):
        waits = [
            backoff_delay(n, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP, rng)
            for n in range(1, DEFAULT_MAX_ATTEMPTS)
        ]
        for wait, ceiling in zip(waits, DEFAULT.ceilings(), strict=True):
            assert ceiling / 2 <= wait <= ceiling
        assert DEFAULT.shortest_total <= sum(waits) <= DEFAULT.longest_total
    # Jittered: jobs failed by one outage do not all come back in the same second.
    assert len({backoff_delay(20, 1.0, 3600.0, rng) for _ in range(20)}) == 20


def test_an_attempt_far_past_the_cap_waits_the_cap_without_overflowing() -> None:
    # 2.0 ** 5000 raises OverflowError: a kind with thousands of attempts must still get a wait.
    assert 1800.0 <= backoff_delay(5000, 1.0, 3600.0) <= 3600.0
    assert RetrySchedule(1.0, 3600.0, 2000).longest_total == pytest.approx(4095 + 3600 * (1999 - 12))


def test_a_kind_without_its_own_backoff_waits_by_the_workers() -> None:
    assert kind_backoff(kind(), WorkerConfig()) == (DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP)
    assert kind_backoff(kind(), WorkerConfig(backoff_base=2, backoff_cap=30)) == (2, 30)


def test_a_kinds_own_backoff_overrides_the_workers() -> None:
    config = WorkerConfig(backoff_base=1, backoff_cap=3600)
    assert kind_backoff(kind(backoff_base=60, backoff_cap=600), config) == (60, 600)
    assert kind_backoff(kind(backoff_cap=30), config) == (1, 30)
    # A base above the worker's cap is never cut below itself.
    assert kind_backoff(kind(backoff_base=7200), config) == (7200, 7200)
    rng = random.Random(1)
    assert all(
        30 <= backoff_delay(n, *kind_backoff(kind(backoff_base=60, backoff_cap=60), config), rng) <= 60
        for n in range(1, 30)
    )


def test_a_worker_backoff_base_of_zero_turns_every_kinds_waits_off() -> None:
    # The one testing switch: a kind's own backoff must not bring the waits back under it.
    off = WorkerConfig(backoff_base=0)
    assert kind_backoff(kind(backoff_base=60, backoff_cap=600), off) == (0.0, 0.0)
    assert {backoff_delay(n, *kind_backoff(kind(backoff_base=60), off)) for n in range(1, 10)} == {0.0}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "0.5s"), (59.0, "59s"), (60.0, "1m"), (1024.0, "17m4s"), (3600.0, "1h0m"), (86_647.5, "1d0h4m")],
)
def test_durations_read_as_an_operator_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
