"""POST /webhooks/{source} against a real ledger: the order of checks, the answers, what is recorded."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import standardwebhooks

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from tests.integration.gateway.ingress.ingress_app import (
    CONFIG,
    ENV,
    STANDARD_SECRET,
    STRIPE_SECRET,
    make_registry,
    noop,
    post,
    rows,
    stripe_event,
    stripe_headers,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield c


async def test_unknown_source_is_404(client: httpx.AsyncClient) -> None:
    r = await post(client, "nope", b"{}", {})
    assert r.status_code == 404
    assert r.json()["error"] == "unknown_source"


async def test_body_over_the_limit_is_413_even_without_a_declared_length(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    r = await client.post("/webhooks/stripe", content=chunks())
    assert r.status_code == 413
    assert r.json()["error"] == "payload_too_large"
    r = await post(client, "stripe", b"x" * 5000, {})
    assert r.status_code == 413
    assert await rows(conn, "SELECT * FROM deliveries") == []


async def test_new_event_is_accepted_then_a_duplicate(client: httpx.AsyncClient, conn: db.Conn) -> None:
    body = stripe_event()
    first = await post(client, "stripe", body, stripe_headers(body))
    assert first.status_code == 202
    effects = {e["handler"]: e for e in first.json()["effects"]}
    assert effects["stripe.fulfil"]["key"] == "order-paid:1"
    assert effects["stripe.fulfil"]["outcome"] == "accepted"
    assert effects["stripe.notify"]["key"] == "stripe:evt_1:stripe.notify"
    locks = await rows(conn, "SELECT kind, lock_key FROM jobs ORDER BY kind")
    assert locks == [
        {"kind": "stripe.fulfil", "lock_key": None},
        {"kind": "stripe.notify", "lock_key": "intent:pi_1"},
    ]

    again = await post(client, "stripe", body, stripe_headers(body))
    assert again.status_code == 200
    assert {e["outcome"] for e in again.json()["effects"]} == {"duplicate"}
    assert len(await rows(conn, "SELECT * FROM jobs")) == 2
    counts = await rows(conn, "SELECT effect_key, delivery_count FROM effects ORDER BY effect_key")
    assert [c["delivery_count"] for c in counts] == [2, 2]


async def test_a_different_event_reusing_the_order_key_is_409_and_recorded(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    paid = stripe_event(order_id="7", event_id="evt_pi")
    assert (await post(client, "stripe", paid, stripe_headers(paid))).status_code == 202
    charge = stripe_event(order_id="7", event_id="evt_ch", type_="charge.succeeded")
    r = await post(client, "stripe", charge, stripe_headers(charge))
    assert r.status_code == 409
    assert r.json()["error"] == "key_conflict"
    assert r.json()["effects"] == [{"key": "order-paid:7", "handler": "stripe.fulfil", "outcome": "rejected"}]
    [reject] = await rows(conn, "SELECT event_id, rejected_payload FROM effect_rejects")
    assert reject["event_id"] == "evt_ch"
    assert reject["rejected_payload"] == json.loads(charge)
    assert len(await rows(conn, "SELECT * FROM jobs WHERE kind = 'stripe.fulfil'")) == 1


async def test_a_source_may_answer_conflicts_with_200(client: httpx.AsyncClient) -> None:
    paid = stripe_event(order_id="8", event_id="evt_a")
    assert (await post(client, "lenient", paid, stripe_headers(paid))).status_code == 202
    other = stripe_event(order_id="8", event_id="evt_b")
    r = await post(client, "lenient", other, stripe_headers(other))
    assert r.status_code == 200
    assert r.json()["effects"][0]["outcome"] == "rejected"


async def test_verified_but_malformed_payload_is_400(client: httpx.AsyncClient, conn: db.Conn) -> None:
    body = b"not json"
    r = await post(client, "stripe", body, stripe_headers(body))
    assert (r.status_code, r.json()["error"]) == (400, "malformed_payload")
    assert await rows(conn, "SELECT * FROM deliveries") == []


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "delivery.refused"]


async def refused_rows(conn: db.Conn) -> list[dict[str, Any]]:
    return await rows(
        conn,
        "SELECT source, tenant, event_id, event_type, outcome, refusal, body, payload, effect_id "
        "FROM deliveries WHERE outcome = 'refused' ORDER BY id",
    )


async def test_a_key_function_that_fails_is_422_under_reject_kept_and_claims_nothing(
    client: httpx.AsyncClient, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps(
        {"id": "evt_x", "type": "payment_intent.succeeded", "secret_note": "s3cr3t", "data": {"object": {}}}
    ).encode()
    r = await post(client, "stripe", body, {**stripe_headers(body), "x-request-id": "req-key"})
    assert (r.status_code, r.json()["error"], r.json()["kept"]) == (422, "effect_key_failed", True)
    assert "stripe.fulfil" in r.json()["detail"]
    assert await rows(conn, "SELECT * FROM effects") == []
    # Kept, byte-exact, with why: the operator replays it once the handler is fixed.
    [kept] = await refused_rows(conn)
    assert kept["body"] == body and kept["payload"] == json.loads(body)
    assert (kept["source"], kept["tenant"], kept["event_id"], kept["effect_id"]) == (
        "stripe",
        "default",
        "evt_x",
        None,
    )
    assert kept["refusal"]["reason"] == "effect_key_failed"
    assert (kept["refusal"]["handler"], kept["refusal"]["error_type"]) == ("stripe.fulfil", "KeyError")
    assert kept["refusal"]["error"] == "KeyError: 'metadata'"
    # Genuine, so the provider retries it until it gives up: an operator hears of it, with what to look for.
    [logged] = refusals(caplog)
    assert logged.levelname == "WARNING"
    assert {key: getattr(logged, key) for key in ("source", "request_id", "reason", "event_id", "kept")} == {
        "source": "stripe",
        "request_id": "req-key",
        "reason": "effect_key_failed",
        "event_id": "evt_x",
        "kept": True,
    }
    assert (logged.event_type, logged.event_ids, logged.handler) == (  # type: ignore[attr-defined]
        "payment_intent.succeeded",
        ["evt_x"],
        "stripe.fulfil",
    )
    assert logged.error == "KeyError: 'metadata'"  # type: ignore[attr-defined]
    assert "s3cr3t" not in str(vars(logged)) and STRIPE_SECRET not in str(vars(logged))


async def test_a_key_function_that_fails_is_acknowledged_by_default_once_kept(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    # Stripe retries a non-2xx for three days, then may disable the endpoint and every other event with it.
    body = json.dumps({"id": "evt_y", "type": "charge.succeeded", "data": {"object": {}}}).encode()
    r = await post(client, "lenient", body, stripe_headers(body))
    assert r.status_code == 200
    assert (r.json()["error"], r.json()["kept"], r.json()["event_ids"]) == (
        "effect_key_failed",
        True,
        ["evt_y"],
    )
    assert await rows(conn, "SELECT * FROM effects") == []
    [kept] = await refused_rows(conn)
    assert (kept["event_id"], kept["refusal"]["handler"], kept["body"]) == ("evt_y", "lenient.fulfil", body)


async def test_a_refusal_that_cannot_be_kept_is_not_acknowledged(db_url: str) -> None:
    # The ledger goes away between the claim's plan and the keeping: a 2xx would lose the only copy.
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    app = create_app(parse(CONFIG, env=ENV), make_registry(), unreachable, pool_timeout=1.0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            body = json.dumps({"id": "evt_z", "type": "charge.succeeded", "data": {"object": {}}}).encode()
            r = await post(c, "lenient", body, stripe_headers(body))
    assert (r.status_code, r.json()["error"], r.headers["retry-after"]) == (503, "effect_key_failed", "1")
    assert "not acknowledged" in r.json()["detail"]


async def test_an_event_no_handler_wants_is_200_and_recorded_as_unmatched(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    body = stripe_event(type_="customer.created")
    r = await post(client, "stripe", body, stripe_headers(body))
    assert r.status_code == 200
    assert r.json()["effects"] == []
    [delivery] = await rows(conn, "SELECT outcome, event_type FROM deliveries")
    assert delivery == {"outcome": "unmatched", "event_type": "customer.created"}


async def test_standard_webhooks_signed_by_the_reference_library(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    from datetime import UTC, datetime

    payload = json.dumps({"type": "invoice.paid", "data": {"invoice": "in_1"}})
    wh = standardwebhooks.Webhook(STANDARD_SECRET)
    now = datetime.now(UTC)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": wh.sign("msg_1", now, payload),
    }
    r = await post(client, "standard", payload.encode(), headers)
    assert r.status_code == 202, r.text
    [effect] = await rows(conn, "SELECT tenant, effect_key FROM effects")
    assert effect == {"tenant": "acme", "effect_key": "standard:msg_1:standard.invoice"}


async def test_twenty_concurrent_identical_deliveries_claim_once(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    body = stripe_event(order_id="42", event_id="evt_42")
    headers = stripe_headers(body)
    answers = await asyncio.gather(*(post(client, "stripe", body, headers) for _ in range(20)))
    assert sorted(r.status_code for r in answers) == [200] * 19 + [202]
    assert len(await rows(conn, "SELECT * FROM jobs")) == 2
    assert len(await rows(conn, "SELECT * FROM deliveries")) == 40


async def test_an_unreachable_ledger_is_503_and_nothing_is_acknowledged() -> None:
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    app = create_app(parse(CONFIG, env=ENV), make_registry(), unreachable, pool_timeout=1.0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            body = stripe_event()
            r = await post(c, "stripe", body, stripe_headers(body))
            assert r.status_code == 503
            assert r.json()["error"] == "ledger_unavailable"


async def test_deliveries_and_failures_are_counted_in_the_metrics(client: httpx.AsyncClient) -> None:
    from effectgate.gateway import metrics
    from tests.prometheus import value

    before = metrics.render()
    body = stripe_event(order_id="m1", event_id="evt_m1")
    await post(client, "stripe", body, stripe_headers(body))
    await post(client, "stripe", body, stripe_headers(body))
    await post(client, "stripe", body, {})
    after = metrics.render()

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Two effects of one delivery.
    assert grew("effectgate_deliveries_total", source="stripe", outcome="accepted") == 2
    assert grew("effectgate_deliveries_total", source="stripe", outcome="duplicate") == 2
    assert grew("effectgate_verification_failures_total", source="stripe", reason="signature_missing") == 1


@pytest.mark.parametrize(
    ("text", "stored"),
    [("nul \\u0000 inside", "nul \ufffd inside"), ("lone \\ud800 surrogate", "lone \ufffd surrogate")],
)
async def test_an_authentic_payload_with_text_postgres_cannot_store_is_claimed_with_u_fffd(
    client: httpx.AsyncClient, conn: db.Conn, text: str, stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    # User-entered text (a gift note, an address line) the provider signed: claimed, not refused for days.
    caplog.set_level(logging.INFO, "effectgate.gateway")
    body = (
        '{"id": "evt_odd", "type": "payment_intent.succeeded", "note": "' + text + '", '
        '"data": {"object": {"id": "pi_1", "metadata": {"order_id": "9"}}}}'
    ).encode()
    r = await post(client, "stripe", body, stripe_headers(body))
    assert r.status_code == 202, r.text
    assert (await post(client, "stripe", body, stripe_headers(body))).status_code == 200  # a duplicate
    [effect] = await rows(conn, "SELECT payload, delivery_count FROM effects WHERE handler = 'stripe.fulfil'")
    assert (effect["payload"]["note"], effect["delivery_count"]) == (stored, 2)
    assert await refused_rows(conn) == []
    logged = [r for r in caplog.records if r.getMessage() == "delivery.payload_rewritten"]
    assert [r.event_id for r in logged] == ["evt_odd", "evt_odd"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("number", "read_as"),
    [("1e400", "1e400"), ("-1e400", "-1e400"), ("9" * 5000, "9" * 5000), ("12.5", 12.5), ("7", 7)],
)
async def test_a_number_past_what_python_holds_reads_as_its_text(
    db_url: str, conn: db.Conn, number: str, read_as: object
) -> None:
    body = (
        '{"id": "evt_num", "type": "payment_intent.succeeded", "amount": ' + number + ", "
        '"data": {"object": {"id": "pi_1", "metadata": {"order_id": "9"}}}}'
    ).encode()
    config = parse(CONFIG.replace("max_body_bytes = 4096", "max_body_bytes = 65536"), env=ENV)
    app = create_app(config, make_registry(), db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            r = await post(client, "lenient", body, stripe_headers(body))
    assert r.status_code == 202, r.text
    [effect] = await rows(conn, "SELECT payload FROM effects")
    assert effect["payload"]["amount"] == read_as


async def test_a_payload_nested_past_the_documented_limit_is_refused_and_kept(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    from effectgate.ledger.storable import MAX_DEPTH

    deep_ok = "[" * (MAX_DEPTH - 5) + "]" * (MAX_DEPTH - 5)
    too_deep = "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5)
    for event_id, nested in (("evt_ok", deep_ok), ("evt_deep", too_deep)):
        body = (
            '{"id": "' + event_id + '", "type": "payment_intent.succeeded", "nested": ' + nested + ", "
            '"data": {"object": {"id": "pi_1", "metadata": {"order_id": "' + event_id + '"}}}}'
        ).encode()
        r = await post(client, "lenient", body, stripe_headers(body))
        if event_id == "evt_ok":
            assert r.status_code == 202, r.text
        else:
            assert (r.status_code, r.json()["error"], r.json()["kept"]) == (200, "malformed_payload", True)
            [kept] = await refused_rows(conn)
            assert (kept["event_id"], kept["payload"], kept["body"]) == ("evt_deep", None, body)
    assert [e["event_id"] for e in await rows(conn, "SELECT event_id FROM effects")] == ["evt_ok"]


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_readiness_without_a_database_is_503_and_names_no_host() -> None:
    unreachable = "postgresql://secretuser@127.0.0.1:1/none?connect_timeout=1"
    app = create_app(parse(CONFIG, env=ENV), make_registry(), unreachable, pool_timeout=1.0)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            r = await c.get("/readyz")
    assert (r.status_code, r.json()["error"]) == (503, "ledger_unavailable")
    assert "secretuser" not in r.text and "127.0.0.1" not in r.text


async def test_readiness_answers_while_every_claim_and_operator_connection_is_taken(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url, pool_timeout=1.0)
    async with app.router.lifespan_context(app):
        held = []
        try:
            # A burst holds every connection of both request pools; readiness asks on its own.
            for pool in (app.state.pool, app.state.claim_pool):
                held += [(pool, await pool.getconn()) for _ in range(pool.max_size)]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
                r = await c.get("/readyz")
        finally:
            for pool, conn in held:
                await pool.putconn(conn)
    assert (r.status_code, r.json()) == (200, {"status": "ready"})


def connect_event(account: object, event_id: str = "evt_c1", order_id: str = "1234") -> bytes:
    event: dict[str, Any] = {
        "id": event_id,
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": f"pi_{event_id}", "metadata": {"order_id": order_id}}},
    }
    if account is not None:
        event["account"] = account
    return json.dumps(event).encode()


async def test_the_tenant_comes_from_the_event_so_two_accounts_keep_one_order_id_apart(
    client: httpx.AsyncClient, conn: db.Conn
) -> None:
    for account in ("acct_1", "acct_2"):
        body = connect_event(account, event_id=f"evt_{account}")
        r = await post(client, "connect", body, stripe_headers(body))
        assert r.status_code == 202
    again = connect_event("acct_1", event_id="evt_acct_1")
    assert (await post(client, "connect", again, stripe_headers(again))).status_code == 200
    effects = await rows(conn, "SELECT tenant, effect_key, delivery_count FROM effects ORDER BY tenant")
    assert effects == [
        {"tenant": "acct_1", "effect_key": "order-paid:1234", "delivery_count": 2},
        {"tenant": "acct_2", "effect_key": "order-paid:1234", "delivery_count": 1},
    ]
    assert [j["tenant"] for j in await rows(conn, "SELECT tenant FROM jobs ORDER BY tenant")] == [
        "acct_1",
        "acct_2",
    ]


@pytest.mark.parametrize(
    ("account", "code"),
    [
        (None, "tenant_missing"),
        (42, "tenant_missing"),
        ("", "tenant_missing"),
        ({"id": "acct_1"}, "tenant_missing"),
        ("acct\x1f1", "tenant_invalid"),
        ("a" * 201, "tenant_invalid"),
        # Only the tenants the source allows: never "default", nor a name outside the pattern.
        ("default", "tenant_not_allowed"),
        ("acct_1x", "tenant_not_allowed"),
    ],
)
async def test_an_event_without_a_usable_tenant_is_kept_and_nothing_is_claimed(
    client: httpx.AsyncClient, conn: db.Conn, account: object, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = connect_event(account)
    r = await post(client, "connect", body, stripe_headers(body))
    assert r.status_code == 200
    assert r.json()["error"] == code
    assert "/account" in r.json()["detail"]
    for table in ("effects", "jobs", "effect_rejects"):
        assert await rows(conn, f"SELECT * FROM {table}") == [], table
    # Kept under no tenant: the replay reads it again by the source's rule, once that rule allows it.
    [kept] = await refused_rows(conn)
    assert (kept["tenant"], kept["event_id"], kept["refusal"]["reason"], kept["body"]) == (
        "",
        "evt_c1",
        code,
        body,
    )
    [logged] = refusals(caplog)
    assert (logged.levelname, logged.reason, logged.event_id) == ("WARNING", code, "evt_c1")  # type: ignore[attr-defined]


async def test_a_delivery_postgres_refuses_gets_its_own_400_and_its_batch_mates_are_claimed(
    db_url: str, conn: db.Conn
) -> None:
    # A key function that lets a NUL through (user code can): Postgres refuses that delivery's row, and only it.
    registry = Registry()
    registry.effect(
        source="stripe",
        events=["payment_intent.succeeded"],
        key=lambda ev: "order:" + ev.payload["data"]["object"]["metadata"]["order_id"].replace("bad", "\x00"),
        name="stripe.fulfil",
    )(noop)
    app = create_app(parse(CONFIG, env=ENV), registry, db_url)
    bodies = [stripe_event(order_id=f"{n}", event_id=f"evt_{n}") for n in range(12)]
    bodies[5] = stripe_event(order_id="bad", event_id="evt_bad")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            answers = await asyncio.gather(*(post(c, "stripe", b, stripe_headers(b)) for b in bodies))
    assert [r.status_code for r in answers] == [202] * 5 + [400] + [202] * 6
    assert answers[5].json()["error"] == "delivery_refused"
    [kept] = await refused_rows(conn)
    assert (kept["event_id"], kept["refusal"]["reason"], kept["body"]) == (
        "evt_bad",
        "delivery_refused",
        bodies[5],
    )
    delivered = await rows(
        conn, "SELECT event_id, outcome FROM deliveries WHERE outcome <> 'refused' ORDER BY event_id"
    )
    assert delivered == sorted(
        ({"event_id": f"evt_{n}", "outcome": "accepted"} for n in range(12) if n != 5),
        key=lambda r: r["event_id"],
    )
