"""Bad signatures against the real app and a real ledger: answered without the database, counted after.

Every number here is a count (requests, pool checkouts, rows, diagnoses), never a time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import stripe
from starlette.applications import Starlette

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.config.gateway import PenaltySettings
from effectgate.gateway.edge.penalty_box import PenaltyBox
from effectgate.gateway.ingress.signature_failures import SignatureFailures
from effectgate.gateway.operator import reporting
from effectgate.gateway.signatures._matching import DIAGNOSE_MAX_BYTES, REENCODED_HINT
from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, reports
from effectgate.ledger.signature_failures import FailureCounter, FailureFlusher

pytestmark = pytest.mark.anyio

SECRET = "whsec_test_cheap_rejection"
ENV = {"STRIPE_SECRET": SECRET}
# A small claim pool, as a flood would find it; no reconciler, so every pool checkout is a request's.
CONFIG = """
[gateway]
max_body_bytes = 300000
pool_max = 2
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""


async def _noop(ctx: Any, ev: Event) -> None:
    return None


def make_registry() -> Registry:
    registry = Registry()
    registry.effect(source="stripe", events=["payment_intent.succeeded"], name="stripe.fulfil")(_noop)
    return registry


def event(event_id: str, padding: int = 0) -> bytes:
    document = {"id": event_id, "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_1"}}}
    if padding:
        # Many small values: the shape that made the old re-encoding diagnosis slowest.
        document["data"]["object"]["lines"] = [{"n": i % 10, "k": "v"} for i in range(padding // 16)]
        return json.dumps(document, separators=(",", ":")).encode()
    return json.dumps(document, indent=2).encode()


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret)
    return {"stripe-signature": header, "content-type": "application/json"}


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Starlette]:
    # The tests flush by hand: a background pass in the middle would make the counts race.
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url, failure_flush_interval=3600)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


def flusher(app: Starlette) -> FailureFlusher:
    found: FailureFlusher = app.state.signature_failure_flusher
    return found


def failures(app: Starlette) -> SignatureFailures:
    found: SignatureFailures = app.state.signature_failures
    return found


def pool_checkouts(app: Starlette) -> int:
    """Connections taken from the gateway's pools: the general one and the claim path's own."""
    pools: list[db.Pool] = [app.state.pool, app.state.claim_pool]
    return sum(int(pool.get_stats().get("requests_num", 0)) for pool in pools)


async def counted(conn: db.Conn) -> dict[str, dict[str, Any]]:
    rows = await (await conn.execute("SELECT * FROM signature_failures")).fetchall()
    return {row["reason"]: row for row in rows}


async def test_bad_signatures_are_401_with_a_code_and_counted_without_the_body_after_the_flush(
    app: Starlette, client: httpx.AsyncClient, conn: db.Conn
) -> None:
    body = event("evt_1")
    missing = await client.post("/webhooks/stripe", content=body)
    assert (missing.status_code, missing.json()["error"]) == (401, "signature_missing")
    for _ in range(3):
        wrong = await client.post("/webhooks/stripe", content=body, headers=signed(body, "whsec_wrong"))
        assert (wrong.status_code, wrong.json()["error"]) == (401, "signature_invalid")
    stale = signed(body)
    stale["stripe-signature"] = stripe.WebhookSignature.generate_signature_header(
        body.decode(), SECRET, timestamp=1_000_000_000
    )
    late = await client.post("/webhooks/stripe", content=body, headers=stale)
    assert (late.status_code, late.json()["error"]) == (401, "timestamp_out_of_tolerance")
    assert await counted(conn) == {}, "written per request, not by the flusher"

    assert await flusher(app).flush() == 5
    rows = await counted(conn)
    assert {reason: row["count"] for reason, row in rows.items()} == {
        "signature_invalid": 3,
        "signature_missing": 1,
        "timestamp_out_of_tolerance": 1,
    }
    columns = await (
        await conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'signature_failures'"
        )
    ).fetchall()
    assert not {"body", "payload"} & {c["column_name"] for c in columns}
    assert await (await conn.execute("SELECT * FROM effects")).fetchall() == []
    assert rows["signature_invalid"]["bytes_total"] == 3 * len(body)
    assert len(rows["signature_invalid"]["last_body_sha256"]) == 64
    assert "configured secret" in rows["signature_invalid"]["last_detail"]
    # A second pass adds to the same rows: one row per (source, reason, minute), never one per request.
    await client.post("/webhooks/stripe", content=body)
    assert await flusher(app).flush() == 1
    assert (await counted(conn))["signature_missing"]["count"] == 2


async def test_the_401_path_makes_no_database_call_so_a_closed_claim_pool_changes_nothing(
    app: Starlette, client: httpx.AsyncClient, conn: db.Conn
) -> None:
    pool: db.Pool = app.state.pool
    before = pool_checkouts(app)
    await pool.close()
    # Sixty failures from one client would box it at fifty (tests/e2e/test_penalty_box.py): the counting
    # path is what is tested here.
    app.state.penalty_box = PenaltyBox(PenaltySettings(enabled=False))
    body = event("evt_1")
    answers = await asyncio.gather(
        *(
            client.post("/webhooks/stripe", content=body, headers=signed(body, "whsec_wrong"))
            for _ in range(60)
        )
    )
    assert [a.status_code for a in answers] == [401] * 60
    assert pool_checkouts(app) == before
    # The counts reach the ledger on the flusher's own connection, all of them.
    assert await flusher(app).flush() == 60
    assert (await counted(conn))["signature_invalid"]["count"] == 60


async def test_a_flush_that_fails_keeps_its_counts_for_the_next_one(app: Starlette, conn: db.Conn) -> None:
    failing = FailureFlusher(failures(app).counter, "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        for _ in range(5):
            assert (await c.post("/webhooks/stripe", content=b"{}")).status_code == 401
    assert await failing.flush() == 0
    assert failing.failed_passes == 1
    assert await flusher(app).flush() == 5
    assert (await counted(conn))["signature_missing"]["count"] == 5


async def test_a_flood_of_json_bad_signatures_beside_genuine_deliveries(
    app: Starlette, client: httpx.AsyncClient, conn: db.Conn
) -> None:
    # Big, and JSON small enough to be diagnosed (the 256 KiB case is counted in the unit tests).
    forged = event("evt_forged", padding=60_000)
    assert 50_000 < len(forged) <= DIAGNOSE_MAX_BYTES
    forged_headers = signed(event("evt_other"))
    genuine = [event(f"evt_{i}") for i in range(20)]
    before = pool_checkouts(app)

    async def attack() -> int:
        r = await client.post("/webhooks/stripe", content=forged, headers=forged_headers)
        return r.status_code

    async def deliver(body: bytes) -> int:
        r = await client.post("/webhooks/stripe", content=body, headers=signed(body))
        return r.status_code

    answers = await asyncio.gather(*(attack() for _ in range(40)), *(deliver(b) for b in genuine))
    assert answers[:40] == [401] * 40
    assert answers[40:] == [202] * 20
    effects = await (await conn.execute("SELECT count(*) AS n FROM effects")).fetchone()
    assert effects is not None and effects["n"] == 20
    # Only genuine deliveries took a claim connection (at most one each; group commit shares them).
    assert 1 <= pool_checkouts(app) - before <= 20
    # Diagnoses were sampled: a couple per source and minute, however many failures (two if a minute ended).
    diagnoser = failures(app).diagnoser
    assert 1 <= diagnoser.started <= 2 * diagnoser.per_minute
    assert diagnoser.started + diagnoser.skipped == 40
    await diagnoser.wait_idle()
    assert await flusher(app).flush() == 40
    assert (await counted(conn))["signature_invalid"]["count"] == 40


async def test_a_re_encoded_body_is_diagnosed_off_the_request_and_shown_in_the_rejects_report(
    app: Starlette, client: httpx.AsyncClient, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    original = event("evt_proxy")
    compact = json.dumps(json.loads(original)).encode()
    answer = await client.post("/webhooks/stripe", content=compact, headers=signed(original))
    assert (answer.status_code, answer.json()["error"]) == (401, "signature_invalid")
    assert "re-encoded" not in answer.json()["detail"]

    await failures(app).diagnoser.wait_idle()
    await flusher(app).flush()
    assert (await counted(conn))["signature_invalid"]["hint"] == REENCODED_HINT
    assert any(
        record.message == "signature_failure.diagnosed" and getattr(record, "hint", None) == REENCODED_HINT
        for record in caplog.records
    )
    # The rejects report an operator reads (API, dashboard and CLI share it) shows the diagnosis.
    page = await reporting.fetch(conn, reports.AUTH_FAILURES, {})
    assert [row["hint"] for row in page.items] == [REENCODED_HINT]


async def test_what_was_counted_is_written_when_the_gateway_stops(db_url: str, conn: db.Conn) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url, failure_flush_interval=3600)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
            for _ in range(3):
                assert (await c.post("/webhooks/stripe", content=b"{}")).status_code == 401
        assert await counted(conn) == {}
    assert (await counted(conn))["signature_missing"]["count"] == 3


async def test_failures_past_the_bucket_cap_are_logged_as_dropped_and_the_rest_written(
    db_url: str, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    counter = FailureCounter(max_buckets=1)
    counter.add("stripe", "signature_invalid", b"{}", "d")
    counter.add("stripe", "signature_missing", b"{}", "d")
    counter.add("stripe", "signature_missing", b"{}", "d")
    flushing = FailureFlusher(counter, db_url)
    try:
        assert await flushing.flush() == 1
        assert await flushing.flush() == 0
    finally:
        await flushing.run(stopped())
    dropped = [r for r in caplog.records if r.message == "signature_failures.dropped"]
    assert [getattr(r, "failures", None) for r in dropped] == [2]
    assert {reason: row["count"] for reason, row in (await counted(conn)).items()} == {"signature_invalid": 1}


def stopped() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event
