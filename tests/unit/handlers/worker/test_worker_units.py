"""The worker's and the context's pure parts: backoff, settings, error records, the slice budget, and
replayed steps — no database."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, Registry, Services, TerminalError, UnrecoverableError
from effectgate.handlers.worker.backoff import backoff_delay
from effectgate.handlers.worker.config import WorkerConfig
from effectgate.handlers.worker.maintenance import make_reconciler
from effectgate.handlers.worker.recorder import error_record
from effectgate.ledger import jobs
from effectgate.ledger.errors import LeaseLost
from effectgate.ledger.jobs.steps import RecordedStep
from effectgate.ledger.maintenance.scheduler import KindPolicy, ReconcilerConfig

pytestmark = pytest.mark.anyio


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(60.0, 1.0 * 2 ** (attempt - 1))
        delays = [backoff_delay(attempt, 1.0, 60.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered: retries of many jobs do not arrive in lockstep


def test_a_zero_backoff_base_switches_retry_waits_off() -> None:
    assert {backoff_delay(n, 0.0, 600.0) for n in range(1, 10)} == {0.0}


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"poll_interval": 0},
        {"poll_interval": float("nan")},
        {"drain_timeout": -1},
        {"backoff_base": -1},
        {"backoff_base": 10, "backoff_cap": 5},
    ],
)
def test_worker_settings_are_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        WorkerConfig(**bad)


def test_an_attempts_error_is_stored_with_type_message_code_and_traceback() -> None:
    try:
        raise TerminalError("card declined", code="card_declined")
    except TerminalError as exc:
        record = error_record(exc)
    assert (record["type"], record["message"], record["code"]) == (
        "TerminalError",
        "card declined",
        "card_declined",
    )
    assert 'raise TerminalError("card declined"' in record["traceback"]


def lease(**overrides: Any) -> jobs.Lease:
    fields: dict[str, Any] = {
        "job_id": 1,
        "effect_id": 1,
        "kind": "k",
        "tenant": "acme",
        "attempt": 1,
        "max_attempts": 3,
        "lease_token": 4,
        "checkpoint": {"done": 2},
        "cancel_requested": False,
        "effect_key": "order:1",
        "source": "stripe",
        "event_id": "evt_1",
        "event_type": "charge.succeeded",
        "payload": {},
    }
    fields.update(overrides)
    return jobs.Lease(**fields)


def context(
    recorded: dict[str, RecordedStep] | None = None, clock: list[float] | None = None
) -> EffectContext:
    now = clock if clock is not None else [0.0]
    return EffectContext(
        pool=None,  # type: ignore[arg-type]  # nothing here reaches the database
        lease=lease(),
        event=Event("stripe", "evt_1", "charge.succeeded", {}, "acme"),
        recorded=recorded or {},
        services=Services(),
        slice_budget=10.0,
        clock=lambda: now[0],
    )


def test_should_yield_turns_true_at_the_budget_on_drain_or_on_cancel() -> None:
    clock = [0.0]
    ctx = context(clock=clock)
    assert ctx.checkpoint == {"done": 2}
    assert not ctx.should_yield()
    clock[0] = 9.99
    assert not ctx.should_yield()
    clock[0] = 10.0
    assert ctx.should_yield()
    for flag in ("draining", "cancel_requested"):
        fresh = context()
        setattr(fresh, flag, True)
        assert fresh.should_yield()


async def test_a_fenced_off_context_refuses_every_write_without_asking_the_database() -> None:
    ctx = context()
    ctx.fenced_off = True

    async def never(idem: str) -> None:
        raise AssertionError("a fenced-off step must not call downstream")

    with pytest.raises(LeaseLost):
        await ctx.save_checkpoint({"done": 3})
    with pytest.raises(LeaseLost):
        await ctx.step("charge", never)
    with pytest.raises(LeaseLost):
        await ctx.fenced_write(never)  # type: ignore[arg-type]
    assert ctx.checkpoint == {"done": 2}


def recorded(name: str, status: str, *, result: Any = None, error: Any = None) -> RecordedStep:
    return RecordedStep(name, "eg_key", status, result, error, 1, 1, datetime(2030, 1, 1, tzinfo=UTC))


async def test_a_recorded_step_is_replayed_not_called_and_keeps_its_error_class() -> None:
    ctx = context(
        {
            "capture": recorded("capture", "succeeded", result={"id": "pi_1"}),
            "refund": recorded(
                "refund", "failed", error={"type": "UnrecoverableError", "message": "too much"}
            ),
            "ship": recorded("ship", "failed", error={"type": "TerminalError", "message": "no address"}),
        }
    )

    async def never(idem: str) -> Any:
        raise AssertionError("a recorded step must not run again")

    assert await ctx.step("capture", never) == {"id": "pi_1"}
    with pytest.raises(UnrecoverableError, match="too much"):
        await ctx.step("refund", never)
    with pytest.raises(TerminalError, match="no address") as terminal:
        await ctx.step("ship", never)
    assert type(terminal.value) is TerminalError


def test_make_reconciler_wires_the_registrys_sweeps_and_per_kind_settings() -> None:
    registry = Registry()

    async def handler(ctx: Any, ev: Event) -> None:
        return None

    async def sweep(conn: Any) -> int:
        return 0

    registry.effect(source="s", events=["x"], name="fast", pending_ttl=5, poison_threshold=1)(handler)
    registry.effect(source="s", events=["x"], name="plain")(handler)
    registry.register_sweep("orphans", sweep)
    reconciler = make_reconciler(registry, ReconcilerConfig(poison_threshold=4))
    assert reconciler.sweeps == {"orphans": sweep}
    assert reconciler.kinds == {"fast": KindPolicy(5, 1), "plain": KindPolicy(None, None)}
    assert (reconciler.poison_threshold("fast"), reconciler.poison_threshold("plain")) == (1, 4)
    assert reconciler.on_transition is not None
