"""``/metrics`` over the real app: process counters plus the ledger's job gauges, read at scrape time."""

from __future__ import annotations

import asyncio
import pathlib

import httpx
import pytest

from effectgate.gateway import metrics as counting
from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.operator import metrics
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from effectgate.ledger.jobs import resolutions
from effectgate.ledger.jobs.resolutions import Resolved
from tests.integration.reports_seed import seed
from tests.prometheus import value

pytestmark = pytest.mark.anyio

CONFIG = """
[gateway]
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""


async def scrape(url: str, *, open_pool: bool = True) -> httpx.Response:
    app = create_app(parse(CONFIG, env={"STRIPE_SECRET": "whsec_test"}), Registry(), url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        async with app.router.lifespan_context(app):
            if open_pool:
                return await client.get("/metrics")
        return await client.get("/metrics")


async def test_metrics_carry_process_counters_and_job_gauges(db_url: str, conn: db.Conn) -> None:
    await seed(conn)
    counting.delivery("stripe", "duplicate")
    response = await scrape(db_url)
    assert response.status_code == 200
    assert response.headers["content-type"] == counting.CONTENT_TYPE
    lines = response.text.splitlines()
    assert "effectgate_ledger_up 1" in lines
    # The seed leaves one failed job and two pending ones; succeeded jobs are history, not a gauge.
    assert 'effectgate_jobs{state="failed",kind="fulfil_order"} 1' in lines
    assert 'effectgate_jobs{state="pending",kind="ship_order"} 1' in lines
    assert 'effectgate_jobs{state="pending",kind="audit_order"} 1' in lines
    assert not any(line.startswith('effectgate_jobs{state="succeeded"') for line in lines)
    # The seeded jobs became due in 2025, so the oldest has waited a long time.
    [oldest] = [line for line in lines if line.startswith("effectgate_oldest_due_job_seconds ")]
    assert float(oldest.split()[1]) > 86400
    assert value(response.text, "effectgate_deliveries_total", source="stripe", outcome="duplicate") >= 1


async def test_a_job_resolved_by_hand_leaves_the_waiting_gauge(db_url: str, conn: db.Conn) -> None:
    ids = await seed(conn)
    assert 'effectgate_jobs{state="failed",kind="fulfil_order"} 1' in (await scrape(db_url)).text.splitlines()
    assert isinstance(
        await resolutions.resolve(conn, ids["order-paid:1"], by="op", reason="refunded by hand"), Resolved
    )
    lines = (await scrape(db_url)).text.splitlines()
    # The series the "waiting for a human" alert reads is gone, and resolved jobs are history, not a gauge.
    assert not any(line.startswith('effectgate_jobs{state="failed"') for line in lines)
    assert not any(line.startswith('effectgate_jobs{state="resolved"') for line in lines)
    assert 'effectgate_jobs{state="pending",kind="ship_order"} 1' in lines


async def test_metrics_answer_without_the_ledger(db_url: str) -> None:
    response = await scrape(db_url, open_pool=False)
    assert response.status_code == 200
    assert "effectgate_ledger_up 0" in response.text.splitlines()
    assert "effectgate_deliveries_total" in response.text


async def test_metrics_count_what_retention_purged_per_table(db_url: str, conn: db.Conn) -> None:
    from datetime import UTC, datetime

    from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper

    await seed(conn)
    # The seed's rows are from 2025: a pass "in 2032" with short windows purges every finished one.
    later = datetime(2032, 1, 1, tzinfo=UTC)
    result = await RetentionKeeper(RetentionConfig(payloads=1 * DAY, history=2 * DAY)).run_once(
        conn, now=later
    )
    assert result.purged["deliveries"] > 0
    lines = (await scrape(db_url)).text.splitlines()
    assert "# TYPE effectgate_retention_purged_rows_total counter" in lines
    for what in ("deliveries", "effects.payload", "jobs"):
        line = f'effectgate_retention_purged_rows_total{{table="{what}"}} {result.purged[what]}'
        assert line in lines


async def test_a_configured_metrics_token_is_required(db_url: str) -> None:
    token = "scrape-token-0123456789"
    config = parse(
        CONFIG + '\n[metrics]\ntoken_env = "METRICS_TOKEN"\n',
        env={"STRIPE_SECRET": "whsec_test", "METRICS_TOKEN": token},
    )
    app = create_app(config, Registry(), db_url)
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client,
        app.router.lifespan_context(app),
    ):
        missing = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": f"Bearer {token}x"})
        right = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "effectgate_" not in missing.text
    assert value(right.text, "effectgate_ledger_up") == 1


@pytest.mark.parametrize("where", ["gateway", "worker"])
async def test_wrong_metrics_tokens_are_throttled_and_the_right_one_never(db_url: str, where: str) -> None:
    token = "scrape-token-0123456789"
    config = parse(
        CONFIG + '\n[metrics]\ntoken_env = "METRICS_TOKEN"\n',
        env={"STRIPE_SECRET": "whsec_test", "METRICS_TOKEN": token},
    )
    app = create_app(config, Registry(), db_url)
    async with app.router.lifespan_context(app):
        target = (
            app
            if where == "gateway"
            else metrics.app(app.state.pool, token_sha256=config.metrics_token_sha256)
        )
        transport = httpx.ASGITransport(app=target)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            limit = target.state.auth_throttle.limit
            statuses = [
                (
                    await client.get("/metrics", headers={"Authorization": f"Bearer guess-{i}-0123456789"})
                ).status_code
                for i in range(limit + 3)
            ]
            right = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            missing = await client.get("/metrics")
    assert statuses == [401] * limit + [429] * 3
    assert right.status_code == 200 and missing.status_code == 401


class FakeClock:
    def __init__(self) -> None:
        self.now = 1.8e9

    def __call__(self) -> float:
        return self.now


async def test_ledger_gauges_are_read_once_per_ttl_and_shared_by_concurrent_scrapes(
    db_url: str, conn: db.Conn, tmp_path: pathlib.Path
) -> None:
    ids = await seed(conn)
    clock = FakeClock()
    gauges = metrics.LedgerGauges(ttl=10.0, directory=str(tmp_path), clock=clock)
    pool = db.make_pool(db_url)
    await pool.open()
    try:
        texts = await asyncio.gather(*(gauges.text(pool) for _ in range(20)))
        assert gauges.reads == 1
        assert len(set(texts)) == 1
        assert 'effectgate_jobs{state="failed",kind="fulfil_order"} 1' in texts[0].splitlines()
        assert value(texts[0], "effectgate_ledger_read_timestamp_seconds") == clock.now
        await resolutions.resolve(conn, ids["order-paid:1"], by="op", reason="refunded by hand")
        clock.now += 9.9
        # Within the TTL: what was read, the resolution not yet seen.
        assert await gauges.text(pool) == texts[0]
        # A sibling process of the same `serve` tree takes the text from the shared file, not the ledger.
        sibling = metrics.LedgerGauges(ttl=10.0, directory=str(tmp_path), clock=clock)
        assert await sibling.text(pool) == texts[0]
        assert sibling.reads == 0
        clock.now += 0.1
        fresh = await gauges.text(pool)
        assert gauges.reads == 2
        assert not any(line.startswith('effectgate_jobs{state="failed"') for line in fresh.splitlines())
        assert await sibling.text(pool) == fresh
        assert sibling.reads == 0
    finally:
        await pool.close()


async def test_an_unreadable_ledger_is_cached_too_and_says_so(db_url: str) -> None:
    clock = FakeClock()
    gauges = metrics.LedgerGauges(ttl=5.0, clock=clock)
    pool = db.make_pool(db_url, timeout=0.5)  # never opened: every connection attempt fails
    for _ in range(3):
        assert "effectgate_ledger_up 0" in (await gauges.text(pool)).splitlines()
    assert gauges.reads == 1
    with pytest.raises(ValueError, match="ttl"):
        metrics.LedgerGauges(ttl=-1)


async def test_scrapes_of_one_app_share_one_ledger_read(db_url: str) -> None:
    app = create_app(parse(CONFIG, env={"STRIPE_SECRET": "whsec_test"}), Registry(), db_url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        async with app.router.lifespan_context(app):
            pages = [(await client.get("/metrics")).text for _ in range(3)]
    assert all("effectgate_ledger_up 1" in page.splitlines() for page in pages)
    assert app.state.ledger_gauges.reads == 1
