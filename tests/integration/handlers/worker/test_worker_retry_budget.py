"""Retry budgets against real Postgres, on a moved clock (``Worker.run_until_idle(now=…)``), never a sleep:
a downstream down for half an hour is outlasted by the default budget and the effect performed once when
it is back; a kind's own backoff is what its retries wait by; ``backoff_base = 0`` still switches waits off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import respx

from effectgate.handlers import EffectContext, Event, Services
from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.effect_kind import DEFAULT_MAX_ATTEMPTS
from effectgate.handlers.worker.config import DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP
from effectgate.ledger import db, jobs
from tests.integration.jobs_and_workers import claim, job, kind, make_worker, registry

pytestmark = pytest.mark.anyio

PAYMENTS = "https://payments.test"
CAPTURE = f"{PAYMENTS}/v1/payment_intents/pi_38/capture"
OUTAGE = timedelta(minutes=30)


class Provider:
    """A Stripe-like payments API on the test's clock: 503 until ``back_at``, then one capture per
    Idempotency-Key, a repeated key answered with the same object (as Stripe does)."""

    def __init__(self, back_at: datetime) -> None:
        self.back_at = back_at
        self.now = back_at - OUTAGE
        self.captures: dict[str, dict[str, Any]] = {}
        self.answers: list[tuple[datetime, int, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        if self.now < self.back_at:
            self.answers.append((self.now, 503, key))
            return httpx.Response(503, json={"error": {"type": "api_error", "message": "down"}})
        captured = self.captures.setdefault(key, {"id": "pi_38", "status": "succeeded"})
        self.answers.append((self.now, 200, key))
        return httpx.Response(200, json=captured)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def capture(ctx: EffectContext, ev: Event) -> None:
    assert ctx.payments is not None
    payments = ctx.payments
    await ctx.step("capture", lambda key: payments.capture_payment_intent("pi_38", idempotency_key=key))


def services(http: httpx.AsyncClient) -> Services:
    return Services(http=http, payments=PaymentsClient(http, DownstreamConfig(PAYMENTS, "sk_test_38")))


async def test_a_downstream_down_for_half_an_hour_is_outlasted_and_charged_once(
    pool: db.Pool, http: httpx.AsyncClient
) -> None:
    async with pool.connection() as conn:
        job_id = await claim(conn, "order:38", max_attempts=DEFAULT_MAX_ATTEMPTS)
    # The defaults, not the tests' no-wait switch: the budget under test is the one operators get.
    worker = make_worker(
        pool,
        registry(kind(capture)),
        backoff_base=DEFAULT_BACKOFF_BASE,
        backoff_cap=DEFAULT_BACKOFF_CAP,
    )
    worker.services = services(http)
    started = datetime.now(UTC)
    provider = Provider(back_at=started + OUTAGE)
    clock = started
    with respx.mock(assert_all_mocked=True) as mock:
        mock.post(CAPTURE).mock(side_effect=provider)
        async with pool.connection() as conn:
            # Nobody touches the job: the clock moves to each retry's due time, as a day would pass.
            for _ in range(DEFAULT_MAX_ATTEMPTS):
                provider.now = clock
                await worker.run_until_idle(now=clock)
                row = await job(conn, job_id)
                if row["state"] != "pending":
                    break
                assert row["run_at"] > clock
                clock = row["run_at"]
    # Finished by the worker itself, no operator's redrive.
    assert row["state"] == "succeeded" and row["terminal_by"] == worker.owner
    # Retried through the outage: every attempt inside it answered 503, the first after it succeeded.
    statuses = [status for _, status, _ in provider.answers]
    assert statuses[-1] == 200 and set(statuses[:-1]) == {503} and len(statuses) == row["attempt"] >= 8
    # Back within one wait of the downstream's return: no wait is longer than the cap.
    assert (
        timedelta(0) <= provider.answers[-1][0] - provider.back_at <= timedelta(seconds=DEFAULT_BACKOFF_CAP)
    )
    # Exactly one effect at the downstream, under the one key every attempt sent.
    assert len(provider.captures) == 1 and len({key for _, _, key in provider.answers}) == 1
    async with pool.connection() as conn:
        attempts = await jobs.attempts(conn, job_id)
    assert [a["outcome"] for a in attempts] == ["retry"] * (len(attempts) - 1) + ["succeeded"]
    assert {a["error_type"] for a in attempts[:-1]} == {"TransientError"}


async def run_down(
    pool: db.Pool, http: httpx.AsyncClient, max_attempts: int, **settings: Any
) -> tuple[dict[str, Any], datetime]:
    """One ``run_until_idle`` at one instant against a downstream that answers 503; the job row after it,
    and that instant."""
    async with pool.connection() as conn:
        job_id = await claim(conn, max_attempts=max_attempts)
    kind_settings = settings.pop("kind", {})
    worker = make_worker(pool, registry(kind(capture, **kind_settings)), **settings)
    worker.services = services(http)
    clock = datetime.now(UTC)
    with respx.mock(assert_all_mocked=True) as mock:
        mock.post(CAPTURE).mock(return_value=httpx.Response(503, json={"error": {"type": "api_error"}}))
        await worker.run_until_idle(now=clock)
    async with pool.connection() as conn:
        return await job(conn, job_id), clock


async def waited(pool: db.Pool, http: httpx.AsyncClient, **settings: Any) -> float:
    """Seconds between a failed first attempt and its retry's due time, under a worker of ``settings``."""
    row, clock = await run_down(pool, http, DEFAULT_MAX_ATTEMPTS, **settings)
    assert (row["state"], row["attempt"]) == ("pending", 1)
    return float((row["run_at"] - clock).total_seconds())


async def test_a_kinds_own_backoff_is_what_its_retry_waits(pool: db.Pool, http: httpx.AsyncClient) -> None:
    defaults = {"backoff_base": DEFAULT_BACKOFF_BASE, "backoff_cap": DEFAULT_BACKOFF_CAP}
    assert 0.5 <= await waited(pool, http, **defaults) <= 1.0
    own = {"backoff_base": 600.0, "backoff_cap": 1200.0}
    assert 300.0 <= await waited(pool, http, kind=own, **defaults) <= 600.0


async def test_a_worker_backoff_base_of_zero_still_switches_a_kinds_waits_off(
    pool: db.Pool, http: httpx.AsyncClient
) -> None:
    # Every retry due at once: the budget is spent without the clock moving.
    own = {"backoff_base": 600.0, "backoff_cap": 1200.0}
    row, _ = await run_down(pool, http, 3, kind=own, backoff_base=0.0)
    assert (row["state"], row["attempt"]) == ("failed", 3)
