"""The claim call's answers over HTTP (ASGI, real ledger): a delivery Postgres refuses gets its own 400 and a row
in the rejects report while the 50 sent with it are claimed; past the claim queue's bound the answer is an
immediate 503 ``overloaded`` with ``Retry-After``; a held key answers 503 ``claim_timeout``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from tests.integration.gateway.ingress.ingress_app import (
    CONFIG,
    ENV,
    make_registry,
    noop,
    post,
    rows,
    stripe_event,
    stripe_headers,
)
from tests.integration.ledger.row_locks import hold_row_lock, waiting_on_a_lock

pytestmark = pytest.mark.anyio


def config(**gateway: Any) -> str:
    # No reconciler: nothing but claims waits on the rows these tests hold.
    settings = "".join(f"{key} = {value}\n" for key, value in {"run_reconciler": "false", **gateway}.items())
    return CONFIG.replace("[gateway]\n", "[gateway]\n" + settings, 1)


@pytest.fixture
async def admin(db_url: str) -> AsyncIterator[db.Conn]:
    conn = await db.connect(db_url)
    async with conn:
        yield conn


async def test_a_delivery_postgres_refuses_is_400_kept_and_the_50_sent_with_it_are_claimed(
    db_url: str, admin: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # An authentic event whose type is over the btree row limit (the type is indexed with the effect): Postgres
    # refuses that delivery with SQLSTATE 54000, which once failed every batch it shared with 503.
    long_type = "payment_intent." + os.urandom(1500).hex()
    registry = Registry()
    registry.effect(
        source="stripe", events=["payment_intent.*"], key=lambda ev: f"order:{ev.id}", name="stripe.fulfil"
    )(noop)
    app = create_app(parse(CONFIG, env=ENV), registry, db_url)
    bodies = [stripe_event(order_id=f"{n}", event_id=f"evt_{n}") for n in range(50)]
    poison = stripe_event(order_id="x", event_id="evt_poison", type_=long_type)
    bodies.insert(25, poison)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            answers = await asyncio.gather(*(post(c, "stripe", b, stripe_headers(b)) for b in bodies))
    assert [r.status_code for r in answers] == [202] * 25 + [400] + [202] * 25
    refused = answers[25].json()
    assert refused["error"] == "delivery_refused" and "54000" in refused["detail"]
    assert "index row" not in refused["detail"]
    assert len(await rows(admin, "SELECT * FROM jobs")) == 50
    # Where an operator sees it: kept as a refused delivery, its body byte-exact, with the SQLSTATE.
    [kept] = await rows(
        admin,
        "SELECT event_id, event_type, refusal, body, effect_id FROM deliveries WHERE outcome = 'refused'",
    )
    assert (kept["event_id"], kept["body"], kept["effect_id"]) == ("evt_poison", poison, None)
    assert (kept["refusal"]["reason"], kept["refusal"]["sqlstate"]) == ("delivery_refused", "54000")
    assert kept["event_type"] == long_type[:500]
    assert await rows(admin, "SELECT * FROM signature_failures") == []
    # The gateway says why, at warning, with the SQLSTATE: not a database outage.
    [logged] = [r for r in caplog.records if r.getMessage() == "delivery.refused"]
    assert (logged.levelname, logged.reason, logged.sqlstate) == (  # type: ignore[attr-defined]
        "WARNING",
        "delivery_refused",
        "54000",
    )


async def test_past_the_queue_bound_the_answer_is_503_overloaded_at_once(db_url: str, admin: db.Conn) -> None:
    text = config(claim_queue_max=1, claim_deadline=600, claim_lock_timeout=300, claim_statement_timeout=600)
    app = create_app(parse(text, env=ENV), make_registry(), db_url)
    first = stripe_event(order_id="1", event_id="evt_1")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            assert (await post(c, "stripe", first, stripe_headers(first))).status_code == 202
            holder = await hold_row_lock(db_url, "order-paid:1")
            try:
                # A retry of the first delivery stalls the one batch in flight on the held key.
                stalled = asyncio.create_task(post(c, "stripe", first, stripe_headers(first)))
                await waiting_on_a_lock(admin)
                others = [stripe_event(order_id=f"{n}", event_id=f"evt_{n}") for n in (2, 3)]
                tasks = [asyncio.create_task(post(c, "stripe", b, stripe_headers(b))) for b in others]
                # One of the two takes the one place in the queue; the other is answered while the batch is
                # still stalled: the 503 waited for nothing.
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                [answer] = [t.result() for t in done]
                assert not stalled.done()
            finally:
                await holder.rollback()
                await holder.close()
            later = await asyncio.gather(stalled, *(t for t in tasks if t not in done))
    assert (answer.status_code, answer.json()["error"]) == (503, "overloaded")
    assert answer.headers["retry-after"] == "1"
    assert [r.status_code for r in later] == [200, 202]
    assert len(await rows(admin, "SELECT * FROM jobs")) == 4  # evt_1 (two effects) and the queued one's one


async def test_a_held_key_is_503_claim_timeout_while_a_delivery_beside_it_is_claimed(
    db_url: str, admin: db.Conn
) -> None:
    app = create_app(parse(config(claim_lock_timeout=0.2), env=ENV), make_registry(), db_url)
    first = stripe_event(order_id="1", event_id="evt_1")
    other = stripe_event(order_id="2", event_id="evt_2", type_="charge.succeeded")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            assert (await post(c, "stripe", first, stripe_headers(first))).status_code == 202
            holder = await hold_row_lock(db_url, "order-paid:1")
            try:
                held, beside = await asyncio.gather(
                    post(c, "stripe", first, stripe_headers(first)),
                    post(c, "stripe", other, stripe_headers(other)),
                )
            finally:
                await holder.rollback()
                await holder.close()
    assert (held.status_code, held.json()["error"], held.headers["retry-after"]) == (
        503,
        "claim_timeout",
        "1",
    )
    assert beside.status_code == 202
    counts = await rows(admin, "SELECT delivery_count FROM effects WHERE effect_key = 'order-paid:1'")
    assert counts == [{"delivery_count": 1}]


async def test_a_connection_lost_mid_batch_is_503_without_the_drivers_words(
    db_url: str, admin: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    text = config(claim_deadline=600, claim_lock_timeout=300, claim_statement_timeout=600)
    app = create_app(parse(text, env=ENV), make_registry(), db_url)
    first = stripe_event(order_id="1", event_id="evt_1")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            assert (await post(c, "stripe", first, stripe_headers(first))).status_code == 202
            holder = await hold_row_lock(db_url, "order-paid:1")
            try:
                stalled = asyncio.create_task(post(c, "stripe", first, stripe_headers(first)))
                pid = await waiting_on_a_lock(admin)
                await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                answer = await stalled
            finally:
                await holder.rollback()
                await holder.close()
    assert (answer.status_code, answer.json()["error"]) == (503, "ledger_unavailable")
    assert "Shutdown" not in answer.text and "terminat" not in answer.text
    assert await rows(admin, "SELECT delivery_count FROM effects WHERE effect_key = 'order-paid:1'") == [
        {"delivery_count": 1}
    ]
    [logged] = [r for r in caplog.records if r.getMessage() == "delivery.ledger_unavailable"]
    assert (logged.levelname, logged.sqlstate) == ("WARNING", "57P01")  # type: ignore[attr-defined]


async def test_past_the_queue_bound_a_request_is_refused_before_its_body_is_verified(
    db_url: str, admin: db.Conn
) -> None:
    # The shed comes before the read, the verify and the plan: a forged delivery gets the same 503 as a genuine
    # one (not its 401), and nothing of either is recorded, not even as a signature failure.
    text = config(claim_queue_max=1, claim_deadline=600, claim_lock_timeout=300, claim_statement_timeout=600)
    app = create_app(parse(text, env=ENV), make_registry(), db_url)
    first = stripe_event(order_id="1", event_id="evt_1")
    queued_body = stripe_event(order_id="2", event_id="evt_2")
    forged = stripe_event(order_id="3", event_id="evt_3")
    genuine = stripe_event(order_id="4", event_id="evt_4")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            assert (await post(c, "stripe", first, stripe_headers(first))).status_code == 202
            holder = await hold_row_lock(db_url, "order-paid:1")
            try:
                stalled = asyncio.create_task(post(c, "stripe", first, stripe_headers(first)))
                await waiting_on_a_lock(admin)
                queued = asyncio.create_task(post(c, "stripe", queued_body, stripe_headers(queued_body)))
                batcher = app.state.batcher
                for _ in range(1000):  # the queued request reaches the queue: it is full from then on
                    await asyncio.sleep(0)
                    if len(batcher._queue) == 1:
                        break
                assert len(batcher._queue) == 1
                bad = {**stripe_headers(forged), "stripe-signature": "t=1,v1=" + "0" * 64}
                refused_forged = await post(c, "stripe", forged, bad)
                refused_genuine = await post(c, "stripe", genuine, stripe_headers(genuine))
                assert not stalled.done() and not queued.done()
            finally:
                await holder.rollback()
                await holder.close()
            later = await asyncio.gather(stalled, queued)
    for answer in (refused_forged, refused_genuine):
        assert (answer.status_code, answer.json()["error"], answer.headers["retry-after"]) == (
            503,
            "overloaded",
            "1",
        )
    assert [r.status_code for r in later] == [200, 202]
    assert await rows(admin, "SELECT * FROM signature_failures") == []
    assert await rows(admin, "SELECT * FROM deliveries WHERE event_id IN ('evt_3', 'evt_4')") == []
