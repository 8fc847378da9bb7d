"""The claim path on a heavy day, against a real Postgres: a bounded queue, a deadline, lock and statement
timeouts, rows Postgres refuses, a lost connection, a fault in the flusher, a replayed delivery in a flood.

Every assertion counts answers and rows; no test asserts a duration. Where a batch must be caught in
flight, another connection holds a row lock and the test waits (bounded, as a hang guard) until Postgres
shows the batch waiting for it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from effectgate.ledger import claim_batcher, db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import Accepted, ClaimOutcome, Delivery, Duplicate, EffectRequest
from effectgate.ledger.errors import (
    ClaimOverloaded,
    ClaimTimeout,
    DeliveryRefused,
    LedgerError,
    LedgerUnavailable,
)
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger
from tests.integration.ledger.row_locks import hold_row_lock, waiting_on_a_lock

pytestmark = pytest.mark.anyio

Item = tuple[Delivery, list[EffectRequest]]


def item(key: str, *, event_id: str | None = None, payload: Any = None, event_type: str = "charge") -> Item:
    body = payload if payload is not None else {"id": event_id or f"evt_{key}", "key": key}
    delivery = Delivery(
        request_id=f"req_{event_id or key}"[:60],
        tenant="default",
        source="stripe",
        event_id=event_id or f"evt_{key}"[:60],
        event_type=event_type,
        payload=body,
        fingerprint=fingerprint(body),
        secret_index=0,
    )
    return delivery, [EffectRequest(key, "h", 5, "redrive")]


def long_text() -> str:
    # Random hex does not compress, so its index entry stays over a btree row's 2,704 bytes.
    return os.urandom(1500).hex()


async def count(conn: db.Conn, sql: str) -> int:
    row = await (await conn.execute(sql)).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(next(iter(row.values())))


@pytest.fixture
async def admin(db_url: str) -> AsyncIterator[db.Conn]:
    conn = await db.connect(db_url)
    async with conn:
        yield conn


async def make_batcher(
    db_url: str, *, lock_timeout: float | None = None, statement_timeout: float | None = None, **kw: Any
) -> tuple[db.Pool, ClaimBatcher]:
    pool = db.make_pool(db_url, max_size=3, lock_timeout=lock_timeout, statement_timeout=statement_timeout)
    await pool.open(wait=True)
    return pool, ClaimBatcher(Ledger(pool), **kw)


async def test_refused_rows_get_their_own_answer_and_the_50_beside_them_are_claimed(
    db_url: str, admin: db.Conn
) -> None:
    pool, batcher = await make_batcher(db_url)
    try:
        genuine = [item(f"order:{n}") for n in range(50)]
        poison = [
            item(long_text(), event_id="evt_long_key"),  # over the btree row limit: SQLSTATE 54000
            item(
                "order:type", event_id="evt_long_type", event_type=long_text()
            ),  # the same, via an index on type
            item("order:nul", event_id="evt_nul", payload={"id": "evt_nul", "note": "nul \u0000"}),  # 22P05
        ]
        requests = [*genuine[:20], poison[0], *genuine[20:35], poison[1], poison[2], *genuine[35:]]
        answers = await asyncio.gather(*(batcher.claim([r]) for r in requests), return_exceptions=True)
    finally:
        await pool.close()
    refused = {requests[i][0].event_id: a for i, a in enumerate(answers) if isinstance(a, BaseException)}
    assert set(refused) == {"evt_long_key", "evt_long_type", "evt_nul"}, refused
    assert all(isinstance(a, DeliveryRefused) for a in refused.values()), refused
    assert [refused["evt_long_key"].sqlstate, refused["evt_long_type"].sqlstate] == ["54000", "54000"]  # type: ignore[attr-defined]
    assert refused["evt_nul"].sqlstate is not None and refused["evt_nul"].sqlstate.startswith("22")  # type: ignore[attr-defined]
    # The driver's words stay out of the answer.
    assert all("index row" not in str(a) for a in refused.values())
    assert (
        await count(
            admin,
            "SELECT count(*) FROM effects WHERE effect_key LIKE 'order:%' AND effect_key <> 'order:type'",
        )
        == 50
    )
    assert await count(admin, "SELECT count(*) FROM jobs") == 50
    assert (
        await count(
            admin,
            "SELECT count(*) FROM deliveries WHERE event_id IN ('evt_long_key', 'evt_long_type', 'evt_nul')",
        )
        == 0
    )


async def test_a_connection_lost_mid_batch_answers_every_request_503_and_writes_nothing(
    db_url: str, admin: db.Conn
) -> None:
    pool, batcher = await make_batcher(db_url)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    try:
        # One batch: the held key and ten others, all waiting on the lock when the backend is terminated.
        first = asyncio.create_task(batcher.claim([item("order:held", event_id="evt_held_2")]))
        pid = await waiting_on_a_lock(admin)
        others = [asyncio.create_task(batcher.claim([item(f"order:{n}")])) for n in range(10)]
        await asyncio.sleep(0)  # queued behind the batch in flight
        await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        answers = await asyncio.gather(first, *others, return_exceptions=True)
    finally:
        await holder.rollback()
        await holder.close()
    # The terminated batch answers 503; the batch after it (the ten) may run on a fresh connection and commit.
    assert isinstance(answers[0], LedgerUnavailable) and not isinstance(answers[0], ClaimTimeout), answers[0]
    await pool.close()
    assert await count(admin, "SELECT delivery_count FROM effects WHERE effect_key = 'order:held'") == 1
    assert await count(admin, "SELECT count(*) FROM deliveries WHERE event_id = 'evt_held_2'") == 0


async def test_a_lost_connection_fails_the_whole_batch_it_held(db_url: str, admin: db.Conn) -> None:
    pool, batcher = await make_batcher(db_url)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    gate = asyncio.Event()
    try:
        # Eleven requests queued together form one batch, which waits on the held key; then it loses its backend.
        async def send(r: Item) -> list[list[ClaimOutcome]]:
            await gate.wait()
            return await batcher.claim([r])

        batch = [item("order:held", event_id="evt_held_2"), *(item(f"order:{n}") for n in range(10))]
        tasks = [asyncio.create_task(send(r)) for r in batch]
        await asyncio.sleep(0)
        gate.set()
        pid = await waiting_on_a_lock(admin)
        await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        answers = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await holder.rollback()
        await holder.close()
        await pool.close()
    assert all(isinstance(a, LedgerUnavailable) for a in answers), answers
    assert not any(isinstance(a, ClaimTimeout | DeliveryRefused) for a in answers)
    assert await count(admin, "SELECT count(*) FROM effects") == 1
    assert await count(admin, "SELECT count(*) FROM deliveries") == 1
    assert await count(admin, "SELECT delivery_count FROM effects") == 1


async def test_past_lock_timeout_only_the_request_needing_the_held_key_fails(
    db_url: str, admin: db.Conn
) -> None:
    pool, batcher = await make_batcher(db_url, lock_timeout=0.2, statement_timeout=30)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    gate = asyncio.Event()
    try:

        async def send(r: Item) -> list[list[ClaimOutcome]]:
            await gate.wait()
            return await batcher.claim([r])

        requests = [item("order:held", event_id="evt_held_2"), *(item(f"order:{n}") for n in range(10))]
        tasks = [asyncio.create_task(send(r)) for r in requests]
        await asyncio.sleep(0)
        gate.set()
        answers = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await holder.rollback()
        await holder.close()
        await pool.close()
    assert isinstance(answers[0], ClaimTimeout) and answers[0].reason == "lock_timeout", answers[0]
    assert all(isinstance(a, list) and isinstance(a[0][0], Accepted) for a in answers[1:]), answers[1:]
    # Nothing of the timed-out claim was written; the ten were.
    assert await count(admin, "SELECT delivery_count FROM effects WHERE effect_key = 'order:held'") == 1
    assert await count(admin, "SELECT count(*) FROM deliveries WHERE event_id = 'evt_held_2'") == 0
    assert await count(admin, "SELECT count(*) FROM jobs") == 11


async def test_a_statement_past_statement_timeout_is_503_and_writes_nothing(
    db_url: str, admin: db.Conn
) -> None:
    # No lock_timeout: the wait on the held key ends at statement_timeout, which fails the batch it stalls.
    pool, batcher = await make_batcher(db_url, statement_timeout=0.2)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    try:
        answer = await asyncio.gather(
            batcher.claim([item("order:held", event_id="evt_held_2")]), return_exceptions=True
        )
    finally:
        await holder.rollback()
        await holder.close()
        await pool.close()
    assert isinstance(answer[0], ClaimTimeout) and answer[0].reason == "statement_timeout", answer
    assert await count(admin, "SELECT count(*) FROM deliveries") == 1


async def test_past_the_deadline_a_queued_request_is_refused_but_one_in_flight_gets_its_true_answer(
    db_url: str, admin: db.Conn
) -> None:
    pool, batcher = await make_batcher(db_url, deadline=0.05)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    try:
        in_flight = asyncio.create_task(batcher.claim([item("order:held")]))
        await waiting_on_a_lock(admin)
        # Queued behind the stalled batch, never taken: answered at its deadline, with nothing written.
        with pytest.raises(ClaimTimeout) as queued:
            await batcher.claim([item("order:queued")])
        assert queued.value.reason == "deadline"
        assert not in_flight.done()
    finally:
        await holder.rollback()
        await holder.close()
    # The batch in flight then commits: its request is answered with what was written, not a 503, although it
    # waited far past the deadline.
    [[outcome]] = await in_flight
    assert isinstance(outcome, Duplicate)
    await batcher.close()
    await pool.close()
    assert await count(admin, "SELECT count(*) FROM effects WHERE effect_key = 'order:queued'") == 0
    assert await count(admin, "SELECT delivery_count FROM effects WHERE effect_key = 'order:held'") == 2


async def test_a_full_queue_refuses_at_once_and_holds_nothing(db_url: str, admin: db.Conn) -> None:
    pool, batcher = await make_batcher(db_url, max_queue=3, deadline=60)
    await batcher.claim([item("order:held")])
    holder = await hold_row_lock(db_url, "order:held")
    try:
        in_flight = asyncio.create_task(batcher.claim([item("order:held")]))
        await waiting_on_a_lock(admin)
        queued = [asyncio.create_task(batcher.claim([item(f"order:{n}")])) for n in range(3)]
        await asyncio.sleep(0)
        # The batch is still stalled: the refusal came without waiting for anything.
        with pytest.raises(ClaimOverloaded):
            await batcher.claim([item("order:overflow")])
        assert not in_flight.done() and not any(t.done() for t in queued)
    finally:
        await holder.rollback()
        await holder.close()
    answers = await asyncio.gather(in_flight, *queued)
    assert all(isinstance(a[0][0], Accepted | Duplicate) for a in answers)
    await pool.close()
    assert await count(admin, "SELECT count(*) FROM effects WHERE effect_key = 'order:overflow'") == 0
    assert await count(admin, "SELECT count(*) FROM jobs") == 4


async def test_the_flusher_survives_a_fault_and_answers_everyone(
    db_url: str, admin: db.Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fault in the database layer, once: the batch it hits is retried in halves, and every request behind it
    # is still answered.
    real = claim_batcher.claim_deliveries
    faults = [RuntimeError("injected fault")]

    async def faulty(conn: db.Conn, items: Any, **kw: Any) -> list[list[ClaimOutcome]]:
        if faults:
            raise faults.pop()
        return await real(conn, items, **kw)

    monkeypatch.setattr(claim_batcher, "claim_deliveries", faulty)
    pool, batcher = await make_batcher(db_url, max_batch=8)
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(*(batcher.claim([item(f"order:{n}")]) for n in range(40)), return_exceptions=True),
            60,
        )
    finally:
        await pool.close()
    assert all(isinstance(a, list) and isinstance(a[0][0], Accepted) for a in answers), answers
    assert await count(admin, "SELECT count(*) FROM jobs") == 40


async def test_a_fault_that_stays_fails_only_its_request(
    db_url: str, admin: db.Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = claim_batcher.claim_deliveries

    async def faulty(conn: db.Conn, items: Any, **kw: Any) -> list[list[ClaimOutcome]]:
        if any(d.event_id == "evt_order:7" for d, _ in items):
            raise RuntimeError("injected fault")
        return await real(conn, items, **kw)

    monkeypatch.setattr(claim_batcher, "claim_deliveries", faulty)
    pool, batcher = await make_batcher(db_url)
    try:
        answers = await asyncio.gather(
            *(batcher.claim([item(f"order:{n}")]) for n in range(20)), return_exceptions=True
        )
    finally:
        await pool.close()
    assert type(answers[7]) is LedgerError, answers[7]
    assert all(isinstance(a, list) for i, a in enumerate(answers) if i != 7), answers
    assert await count(admin, "SELECT count(*) FROM jobs") == 19


async def test_a_replayed_delivery_in_a_flood_does_not_hold_back_unrelated_ones(
    db_url: str, admin: db.Conn
) -> None:
    # A deadline no copy reaches: the test counts batches, and the flood drains 500 copies in ~63 of them.
    pool, batcher = await make_batcher(db_url, deadline=600)
    try:
        replay = item("order:replayed", event_id="evt_replayed")
        # 500 copies of one delivery, then 50 unrelated ones, all queued before the first batch is taken.
        flood = [batcher.claim([replay]) for _ in range(500)]
        unrelated = [batcher.claim([item(f"order:{n}")]) for n in range(50)]
        answers = await asyncio.gather(*flood, *unrelated)
    finally:
        await pool.close()
    assert sum(isinstance(a[0][0], Accepted) for a in answers[:500]) == 1
    assert all(isinstance(a[0][0], Accepted) for a in answers[500:])
    # Batches counted from the rows: one transaction (xmin) per batch, in order.
    batches = await (
        await admin.execute(
            "SELECT xmin::text::bigint AS tx, bool_or(event_id <> 'evt_replayed') AS unrelated, count(*) AS n"
            " FROM deliveries GROUP BY 1 ORDER BY 1"
        )
    ).fetchall()
    last_unrelated = max(i for i, b in enumerate(batches) if b["unrelated"])
    assert sum(b["n"] for b in batches) == 550
    # Every unrelated delivery was in the first batch: none waited behind the flood.
    assert last_unrelated == 0, [(b["unrelated"], b["n"]) for b in batches[:5]]
    # And the flood drains several copies a batch, not one.
    assert len(batches) <= 500 // claim_batcher.DEFAULT_MAX_ROUNDS + 2


async def test_a_request_passed_over_for_a_repeat_keeps_its_place_for_every_key_it_names(
    db_url: str, admin: db.Conn
) -> None:
    # R2 repeats A (so it waits for a later statement) and names B too: R3, behind it, must not win B first.
    pool, batcher = await make_batcher(db_url, deadline=600)

    def request(name: str, *keys: str) -> Item:
        body = {
            "id": f"evt_{name}",
            "from": name,
        }  # every request a different payload: a later claim is a reject
        delivery = Delivery(name, "default", "stripe", f"evt_{name}", "charge", body, fingerprint(body), 0)
        return delivery, [EffectRequest(k, f"h{n}", 5, "redrive") for n, k in enumerate(keys)]

    try:
        r1, r2, r3, r4 = await asyncio.gather(
            batcher.claim([request("r1", "A")]),
            batcher.claim([request("r2", "A", "B")]),
            batcher.claim([request("r3", "B")]),
            batcher.claim([request("r4", "A")]),
        )
    finally:
        await pool.close()
    assert [o.outcome for o in r1[0]] == ["accepted"]
    assert [o.outcome for o in r2[0]] == ["rejected", "accepted"]
    assert [o.outcome for o in r3[0]] == ["rejected"]
    assert [o.outcome for o in r4[0]] == ["rejected"]
