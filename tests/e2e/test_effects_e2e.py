"""Real processes over loopback HTTP: the gateway, workers and the fake payment/shipping providers.

Each test delivers Stripe-signed webhooks (signed by the ``stripe`` library) and counts the real
effects the fake providers performed — the number the whole design exists to keep at one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from effectgate.ledger import db, jobs

from .conftest import Stack, event, headers
from .processes import wait_until


def test_the_same_delivery_twenty_times_at_once_runs_the_effect_once(stack: Stack) -> None:
    stack.worker("worker")
    body = event("1001", "evt_1001")

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{stack.gateway_url}/webhooks/shop"
            answers = await asyncio.gather(
                *(client.post(url, content=body, headers=headers(body)) for _ in range(20))
            )
            return [a.status_code for a in answers]

    assert sorted(asyncio.run(burst())) == [200] * 19 + [202]
    job = stack.wait_state("order-paid:1001", "succeeded")
    assert job["attempt"] == 1
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)


def test_both_events_stripe_sends_for_one_payment_capture_once_and_reject_nothing(stack: Stack) -> None:
    stack.worker("worker")
    assert stack.deliver(event("2002", "evt_pi_2002")).status_code == 202
    stack.wait_state("order-paid:2002", "succeeded")
    # charge.succeeded for the same payment: another event, another payload, the same amount and currency.
    charge = stack.deliver(event("2002", "evt_ch_2002", "charge.succeeded"))
    assert charge.status_code == 200
    assert charge.json()["effects"][0]["outcome"] == "duplicate"
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"]) == (1, 1)
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        assert conn.execute("SELECT count(*) AS n FROM effect_rejects").fetchone() == {"n": 0}
        effect = conn.execute("SELECT delivery_count, reject_count FROM effects").fetchone()
    assert effect == {"delivery_count": 2, "reject_count": 0}


def test_the_same_order_with_another_amount_is_rejected_and_never_captures(stack: Stack) -> None:
    stack.worker("worker")
    assert stack.deliver(event("2003", "evt_pi_2003")).status_code == 202
    stack.wait_state("order-paid:2003", "succeeded")
    changed = stack.deliver(event("2003", "evt_ch_2003", "charge.succeeded", amount=1999))
    # Recorded as a reject, never run; Stripe is answered 200 (its source's default), so it does not
    # retry the event for days or disable the endpoint.
    assert changed.status_code == 200
    assert changed.json()["effects"][0]["outcome"] == "rejected"
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"]) == (1, 1)
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        [reject] = conn.execute("SELECT event_id, rejected_payload FROM effect_rejects").fetchall()
    assert reject["event_id"] == "evt_ch_2003"
    assert reject["rejected_payload"]["data"]["object"]["amount"] == 1999


def test_two_connected_accounts_with_the_same_order_id_are_two_effects_and_two_captures(
    stack: Stack,
) -> None:
    stack.worker("worker")
    for account in ("acct_alpha", "acct_beta"):
        body = event("5005", f"evt_{account}", intent=f"pi_5005_{account}", account=account)
        assert stack.deliver(body, source="connect").status_code == 202
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        effects = conn.execute("SELECT tenant, effect_key FROM effects ORDER BY tenant").fetchall()
    assert effects == [
        {"tenant": "acct_alpha", "effect_key": "order-paid:5005"},
        {"tenant": "acct_beta", "effect_key": "order-paid:5005"},
    ]
    wait_until(
        lambda: stack.stats()["shipments"] == 2, 30, "both accounts' orders to be captured and shipped"
    )
    stats = stack.stats()
    assert stats["captures_by_intent"] == {"pi_5005_acct_alpha": 1, "pi_5005_acct_beta": 1}
    assert (stats["captures"], stats["replays"]) == (2, 0)
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        keys = conn.execute(
            "SELECT j.tenant, s.idempotency_key FROM steps s JOIN jobs j ON j.id = s.job_id "
            "WHERE s.name = 'capture' ORDER BY j.tenant"
        ).fetchall()
    assert [k["tenant"] for k in keys] == ["acct_alpha", "acct_beta"]
    assert keys[0]["idempotency_key"] != keys[1]["idempotency_key"]


def test_a_connect_event_without_an_account_is_kept_acknowledged_and_claims_nothing(stack: Stack) -> None:
    answer = stack.deliver(event("6006", "evt_no_account"), source="connect")
    assert answer.status_code == 200
    assert (answer.json()["error"], answer.json()["kept"]) == ("tenant_missing", True)
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        for table in ("effects", "jobs", "effect_rejects"):
            assert conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone() == {"n": 0}, table
        kept = conn.execute("SELECT event_id, outcome, tenant FROM deliveries").fetchall()
        assert kept == [{"event_id": "evt_no_account", "outcome": "refused", "tenant": ""}]


def test_a_worker_killed_between_capture_and_its_record_captures_once(stack: Stack) -> None:
    marker = stack.tmp / "crashed"
    doomed = stack.worker("doomed", E2E_CRASH_MARKER=str(marker), E2E_LEASE_TTL="1.5")
    assert stack.deliver(event("3003", "evt_3003")).status_code == 202
    wait_until(lambda: doomed.popen.poll() is not None, 30, "the worker to SIGKILL itself")
    assert doomed.popen.returncode == -9 and marker.exists()
    assert stack.stats()["captures"] == 1
    assert stack.job("order-paid:3003")["state"] == "running"  # the lease is held by a dead process

    # A second worker's reconciler sees the lease expire, redrives the job, and the capture step —
    # never recorded — is called again with the same idempotency key: the provider replays it.
    stack.worker("rescuer", E2E_LEASE_TTL="1.5")
    job = stack.wait_state("order-paid:3003", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)
    assert stats["replays"] >= 1
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        attempts = conn.execute(
            "SELECT outcome FROM job_attempts WHERE job_id = %s ORDER BY attempt", (job["id"],)
        ).fetchall()
        steps = conn.execute("SELECT name, idempotency_key FROM steps ORDER BY name").fetchall()
    assert [a["outcome"] for a in attempts] == ["lease_expired", "succeeded"]
    assert [s["name"] for s in steps] == ["capture", "ship"]


def test_a_connection_dropped_after_the_capture_still_captures_once(stack: Stack) -> None:
    stack.faults(mode="drop_after_effect", rate=1.0, paths=["/v1/payment_intents"])
    stack.worker("worker")
    assert stack.deliver(event("4004", "evt_4004")).status_code == 202
    wait_until(lambda: stack.stats()["captures"] == 1, 30, "the first capture")
    wait_until(lambda: stack.job("order-paid:4004")["attempt"] >= 2, 30, "a retry after the dropped answer")
    stack.faults(mode="none")
    stack.wait_state("order-paid:4004", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)


def test_two_hundred_duplicates_and_fifty_racing_redrives_capture_and_ship_once(stack: Stack) -> None:
    # Shipping fails until the job gives up; the capture step is recorded by then.
    stack.faults(mode="error_500", rate=1.0, paths=["/v1/shipments"])
    stack.worker("worker", E2E_MAX_ATTEMPTS="2")
    body = event("5005", "evt_5005")

    async def duplicates() -> list[int]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as client:
            url = f"{stack.gateway_url}/webhooks/shop"
            answers = await asyncio.gather(
                *(client.post(url, content=body, headers=headers(body)) for _ in range(200))
            )
            return [a.status_code for a in answers]

    codes = asyncio.run(duplicates())
    assert codes.count(202) == 1 and codes.count(200) == 199
    failed = stack.wait_state("order-paid:5005", "failed")
    stack.faults(mode="none")

    async def redrives() -> list[Any]:
        conns = [await db.connect(stack.db_url) for _ in range(50)]
        try:
            return await asyncio.gather(*(jobs.redrive(c, failed["id"], by="test") for c in conns))
        finally:
            for c in conns:
                await c.close()

    results = asyncio.run(redrives())
    assert results.count(None) == 1, results
    assert {r.code for r in results if r is not None} == {"not_redrivable"}
    stack.wait_state("order-paid:5005", "succeeded")
    stats = stack.stats()
    assert (stats["captures"], stats["shipments"], stats["double_capture_attempts"]) == (1, 1, 0)
