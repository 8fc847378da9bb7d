"""A worker's slots against a paced downstream: more slots than `max_in_flight` never call it more often at
once, every job still succeeds, each call once; and a call refused by the pace is retried, never lost.

The provider is an httpx transport that holds each request until the test opens its gate and counts how many
it holds at once; the clients are built as `effectgate worker` builds them (`paces`, `clients`).
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from effectgate.handlers import EffectContext, Event
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamConfig, Pace, clients, paces
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger
from tests.held_provider import HeldProvider
from tests.integration.jobs_and_workers import claim, kind, registry, wait_for, wait_state, worker_config

pytestmark = pytest.mark.anyio

BASE = "https://labels.example.test"


async def label(ctx: EffectContext, ev: Event) -> None:
    labels = ctx.downstream("labels")
    await ctx.step("label", lambda key: labels.request("POST", "/v1/labels", json={}, idempotency_key=key))


def labelling_worker(
    pool: db.Pool,
    db_url: str,
    http: httpx.AsyncClient,
    configs: list[tuple[str, DownstreamConfig]],
    turns: dict[str, Pace],
    *,
    concurrency: int,
) -> Worker:
    """A worker running ``label`` jobs, its clients built as ``effectgate worker`` builds them."""
    return Worker(
        Ledger(pool),
        registry(kind(label, name="label")),
        url=db_url,
        config=worker_config(concurrency=concurrency),
        owner=f"test-{uuid.uuid4().hex[:6]}",
        services=Services(http=http, downstreams=clients(http, configs, paces=turns)),
    )


async def test_eight_slots_call_an_api_paced_at_two_at_most_two_at_once_and_every_job_succeeds(
    pool: db.Pool, db_url: str
) -> None:
    provider = HeldProvider()
    configs = [("labels", DownstreamConfig(BASE, None, max_in_flight=2, timeout=60))]
    turns = paces(configs)
    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        worker = labelling_worker(pool, db_url, http, configs, turns, concurrency=8)
        async with pool.connection() as conn:
            ids = [await claim(conn, kind="label") for _ in range(8)]
            running = asyncio.create_task(worker.run())
            try:

                async def all_eight_calling() -> bool:
                    return provider.held + turns["labels"].waiting == 8

                # Every slot has made its call: two are at the provider and six wait for their turn.
                await wait_for(all_eight_calling, 10.0, "eight slots to call the API")
                provider.gate.set()
                for job_id in ids:
                    await wait_state(conn, job_id, "succeeded", within=10.0)
            finally:
                provider.gate.set()
                worker.stop()
                await running
    assert provider.most_held == 2
    assert len(provider.keys) == 8 and set(provider.keys.values()) == {1}


async def test_a_call_refused_by_the_pace_is_never_sent_and_its_job_is_retried_after_its_turn(
    pool: db.Pool, db_url: str
) -> None:
    provider = HeldProvider()
    provider.gate.set()
    # One call every two seconds, a turn waited for at most half a second: of two jobs run together, the second's
    # call is refused unsent (unless it started 1.5 s after the first) and its job retried when its turn has come.
    configs = [("labels", DownstreamConfig(BASE, None, max_per_second=0.5, timeout=0.5))]
    async with httpx.AsyncClient(transport=httpx.MockTransport(provider)) as http:
        worker = labelling_worker(pool, db_url, http, configs, paces(configs), concurrency=2)
        async with pool.connection() as conn:
            ids = [await claim(conn, kind="label") for _ in range(2)]
            running = asyncio.create_task(worker.run())
            try:
                for job_id in ids:
                    await wait_state(conn, job_id, "succeeded", within=10.0)
            finally:
                worker.stop()
                await running
            attempts = await (
                await conn.execute(
                    "SELECT error_type, error_message FROM job_attempts WHERE job_id = ANY(%s) ORDER BY job_id, attempt",
                    (ids,),
                )
            ).fetchall()
    refused = [row for row in attempts if row["error_type"] is not None]
    assert len(attempts) == 3, attempts
    assert len(refused) == 1 and refused[0]["error_type"] == "PaceExceeded", refused
    # Each job's call reached the provider once: the refused attempt sent nothing.
    assert len(provider.keys) == 2 and set(provider.keys.values()) == {1}
