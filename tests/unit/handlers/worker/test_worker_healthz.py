"""The worker's ``GET /healthz`` (on ``--metrics-port``) from process state alone: starting before the loop's
first tick, ok while it ticks or drains, 503 once the loop is older than poll_interval + HEALTHZ_STALE_AFTER.
The loop's age is set by hand here (no clock is waited on); a real worker through an outage is
tests/e2e/test_worker_healthz_e2e.py."""

from __future__ import annotations

import time

import httpx
import pytest

from effectgate.gateway.operator import metrics
from effectgate.handlers.registry import Registry
from effectgate.handlers.worker.config import WorkerConfig
from effectgate.handlers.worker.runtime import HEALTHZ_STALE_AFTER, Worker
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger

pytestmark = pytest.mark.anyio


def worker() -> Worker:
    # A pool never opened: health() must not touch the database.
    pool = db.make_pool("postgresql://nobody@127.0.0.1:1/none")
    return Worker(Ledger(pool), Registry(), config=WorkerConfig(poll_interval=2.0))


async def get_healthz(w: Worker) -> httpx.Response:
    app = metrics.app(w.pool, token_sha256=b"x" * 32, health=w.health)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as client:
        return await client.get("/healthz")


async def test_before_the_first_tick_the_worker_is_starting_and_not_alive() -> None:
    r = await get_healthz(worker())
    assert r.status_code == 503 and r.json()["status"] == "starting"


async def test_a_recent_tick_is_alive_and_no_token_is_asked() -> None:
    w = worker()
    w.last_tick = time.monotonic()
    r = await get_healthz(w)
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["draining"] is False and r.json()["running"] == 0


async def test_a_loop_older_than_the_bound_is_stuck_503() -> None:
    w = worker()
    w.last_tick = time.monotonic() - (w.config.poll_interval + HEALTHZ_STALE_AFTER + 1)
    r = await get_healthz(w)
    assert r.status_code == 503 and r.json()["status"] == "stuck"
    assert r.json()["loop_age_seconds"] > w.config.poll_interval + HEALTHZ_STALE_AFTER


async def test_a_draining_worker_is_alive_however_old_its_last_tick() -> None:
    w = worker()
    w.last_tick = time.monotonic() - (w.config.poll_interval + HEALTHZ_STALE_AFTER + 1)
    w.stop()
    r = await get_healthz(w)
    assert r.status_code == 200 and r.json() == {**r.json(), "status": "ok", "draining": True}
