"""Over HTTP: a provider's late retry after retention purged the payload answers 200 duplicate and creates
no second job; after an opted-in dedupe window it counts as new."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.ledger import db, jobs
from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper
from tests.integration.gateway.ingress.ingress_app import (
    CONFIG,
    ENV,
    make_registry,
    post,
    stripe_event,
    stripe_headers,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
            yield c


async def finish_all(conn: db.Conn) -> None:
    kinds = {"stripe.fulfil": 30.0, "stripe.notify": 30.0}
    for lease in await jobs.fetch_and_lease(conn, owner="w", kinds=kinds, limit=10):
        await jobs.finish(conn, lease.job_id, lease.lease_token, state="succeeded", by="w")


async def scalar(conn: db.Conn, sql: str) -> object:
    row = await (await conn.execute(sql)).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return next(iter(row.values()))


async def test_a_late_retry_after_the_payload_purge_answers_200_duplicate_and_runs_nothing(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    body = stripe_event(order_id="77", event_id="evt_77")
    first = await post(client, "stripe", body, stripe_headers(body))
    assert first.status_code == 202
    await finish_all(conn)
    later = datetime.now(UTC) + timedelta(days=2)
    purged = await RetentionKeeper(RetentionConfig(payloads=1 * DAY)).run_once(conn, now=later)
    assert purged.purged["effects.payload"] == 2
    assert await scalar(conn, "SELECT count(*) FROM effects WHERE payload IS NOT NULL") == 0

    # The provider retries the very same event (re-signed now, as a retry is).
    late = await post(client, "stripe", body, stripe_headers(body))
    assert late.status_code == 200
    assert {e["outcome"] for e in late.json()["effects"]} == {"duplicate"}
    assert await scalar(conn, "SELECT count(*) FROM jobs") == 2
    assert await scalar(conn, "SELECT count(*) FROM jobs WHERE state = 'pending'") == 0


async def test_after_an_opted_in_dedupe_window_the_same_event_counts_as_new(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    body = stripe_event(order_id="78", event_id="evt_78")
    assert (await post(client, "stripe", body, stripe_headers(body))).status_code == 202
    await finish_all(conn)
    config = RetentionConfig(payloads=1 * DAY, history=2 * DAY, tombstones=4 * DAY)
    await RetentionKeeper(config).run_once(conn, now=datetime.now(UTC) + timedelta(days=5))
    assert await scalar(conn, "SELECT count(*) FROM effects") == 0
    again = await post(client, "stripe", body, stripe_headers(body))
    assert again.status_code == 202
    assert {e["outcome"] for e in again.json()["effects"]} == {"accepted"}
