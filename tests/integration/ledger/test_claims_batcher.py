"""Group commit against a sequential model: generated sets of deliveries — the same key with the same payload,
the same key with another payload, many keys, several effects per event, one payload Postgres refuses — sent
concurrently through one ``ClaimBatcher``. The ledger must hold exactly what running the deliveries one after
another would have left, in an order consistent with which claim won each key, with exactly one job per key.

Also: the same set in ONE ``claim_deliveries`` call (one batch with repeated keys, as a batcher that did not
keep them apart would send), and the batcher's answers to a batch it cannot write."""

from __future__ import annotations

import asyncio
import dataclasses
import graphlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectgate.ledger import db
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import (
    Accepted,
    ClaimOutcome,
    Delivery,
    Duplicate,
    EffectRequest,
    Rejected,
    claim_deliveries,
)
from effectgate.ledger.errors import DeliveryRefused, LedgerUnavailable
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger

KEYS = [f"order:{n}" for n in range(6)]
# Postgres refuses \u0000 in jsonb text: the gateway's own check would turn this away with a 400 first, so
# here it stands for any delivery the database refuses for what it holds.
UNSTORABLE = {"id": "evt_bad", "note": "nul \u0000 inside"}


@dataclass(frozen=True)
class Spec:
    """One generated delivery: which payload variant, which keys (in effect order), which tenant."""

    variant: int
    keys: tuple[str, ...]
    tenant: str = "default"
    unstorable: bool = False


deliveries_strategy = st.lists(
    st.builds(
        Spec,
        variant=st.integers(0, 2),
        # Several effects per event, now and then the same key twice in one event (two handlers, one key).
        keys=st.lists(st.sampled_from(KEYS), min_size=0, max_size=3).map(tuple),
        tenant=st.sampled_from(["default", "default", "acme"]),
    ),
    min_size=1,
    max_size=24,
)


def payload(spec: Spec) -> dict[str, Any]:
    return UNSTORABLE if spec.unstorable else {"id": f"evt_{spec.variant}", "amount": 100 * spec.variant}


def make(spec: Spec, index: int) -> tuple[Delivery, list[EffectRequest]]:
    body = payload(spec)
    delivery = Delivery(
        request_id=f"req_{index}",
        tenant=spec.tenant,
        source="stripe",
        event_id=str(body["id"]),
        event_type="charge.succeeded",
        payload=body,
        fingerprint=fingerprint(body),
        secret_index=0,
    )
    return delivery, [EffectRequest(key, f"h{n}", 5, "redrive") for n, key in enumerate(spec.keys)]


@dataclass
class SequentialLedger:
    """The sequential model: what one-after-another claims leave behind."""

    held: dict[tuple[str, str], str] = field(default_factory=dict)  # key -> held fingerprint
    delivery_count: dict[tuple[str, str], int] = field(default_factory=dict)
    reject_count: dict[tuple[str, str], int] = field(default_factory=dict)
    rows: int = 0  # delivery rows, unmatched included
    rejects: int = 0
    unmatched: set[tuple[str, str]] = field(default_factory=set)  # (tenant, fingerprint) seen unmatched

    def claim(self, spec: Spec) -> list[str]:
        fp = fingerprint(payload(spec))
        outcomes = []
        # An unmatched body is kept once per tenant and source; seen again it is only counted.
        if spec.keys or (spec.tenant, fp) not in self.unmatched:
            self.rows += max(1, len(spec.keys))
        if not spec.keys:
            self.unmatched.add((spec.tenant, fp))
        for key in spec.keys:
            k = (spec.tenant, key)
            if k not in self.held:
                self.held[k], self.delivery_count[k], self.reject_count[k] = fp, 1, 0
                outcomes.append("accepted")
            elif self.held[k] == fp:
                self.delivery_count[k] += 1
                outcomes.append("duplicate")
            else:
                self.reject_count[k] += 1
                self.rejects += 1
                outcomes.append("rejected")
        return outcomes


def sequential_order(specs: list[Spec], observed: dict[int, list[ClaimOutcome]]) -> list[int]:
    """An order of the deliveries in which each key's winner comes first among those claiming it; fails
    if none exists (the observed outcomes fit no sequential run)."""
    graph: dict[int, set[int]] = {i: set() for i in observed}
    winner: dict[tuple[str, str], int] = {}
    for i, outcomes in observed.items():
        for key, outcome in zip(specs[i].keys, outcomes, strict=True):
            if isinstance(outcome, Accepted):
                assert (specs[i].tenant, key) not in winner, f"two accepted claims of {key}"
                winner[(specs[i].tenant, key)] = i
    for i in observed:
        for key in specs[i].keys:
            w = winner.get((specs[i].tenant, key))
            if w is not None and w != i:
                graph[i].add(w)  # the winner comes before i
    return list(graphlib.TopologicalSorter(graph).static_order())


async def ledger_state(conn: db.Conn) -> dict[str, Any]:
    effects = await (
        await conn.execute(
            "SELECT tenant, effect_key, fingerprint, delivery_count, reject_count FROM effects"
        )
    ).fetchall()
    jobs = await (
        await conn.execute("SELECT e.tenant, e.effect_key FROM jobs j JOIN effects e ON e.id = j.effect_id")
    ).fetchall()
    counts = await (
        await conn.execute(
            "SELECT (SELECT count(*) FROM deliveries) AS rows, (SELECT count(*) FROM effect_rejects) AS rejects,"
            " (SELECT count(*) FROM deliveries WHERE request_id = 'req_bad') AS bad"
        )
    ).fetchone()
    assert counts is not None
    return {"effects": effects, "jobs": jobs, **counts}


def check_against_model(
    specs: list[Spec], observed: dict[int, list[ClaimOutcome]], state: dict[str, Any]
) -> None:
    model = SequentialLedger()
    for i in sequential_order(specs, observed):
        expected = model.claim(specs[i])
        got = [o.outcome for o in observed[i]]
        assert got == expected, f"delivery {i} {specs[i]}: got {got}, a sequential run gives {expected}"
        for outcome in observed[i]:
            assert isinstance(outcome, Accepted | Duplicate | Rejected)
    assert {(r["tenant"], r["effect_key"]): r["fingerprint"] for r in state["effects"]} == model.held
    assert {
        (r["tenant"], r["effect_key"]): r["delivery_count"] for r in state["effects"]
    } == model.delivery_count
    assert {(r["tenant"], r["effect_key"]): r["reject_count"] for r in state["effects"]} == model.reject_count
    # Exactly one job per key.
    assert sorted((r["tenant"], r["effect_key"]) for r in state["jobs"]) == sorted(model.held)
    assert (state["rows"], state["rejects"]) == (model.rows, model.rejects)


async def clear(conn: db.Conn) -> None:
    await conn.execute(
        "TRUNCATE effects, jobs, job_attempts, job_actions, steps, deliveries, effect_rejects, unmatched_deliveries"
    )


async def through_the_batcher(
    url: str, specs: list[Spec], bad_at: int, max_batch: int, max_rounds: int = 8
) -> None:
    pool = db.make_pool(url, max_size=4)
    await pool.open(wait=True)
    try:
        # A deadline no generated case reaches: the model is about order and counts, not time.
        batcher = ClaimBatcher(Ledger(pool), max_batch=max_batch, max_rounds=max_rounds, deadline=600)
        specs = [*specs[:bad_at], Spec(0, ("order:0",), unstorable=True), *specs[bad_at:]]
        items = [make(spec, i) for i, spec in enumerate(specs)]
        bad = bad_at
        items[bad] = (dataclasses.replace(items[bad][0], request_id="req_bad"), items[bad][1])
        start = asyncio.Event()

        async def send(i: int) -> list[ClaimOutcome] | BaseException:
            await start.wait()
            try:
                [outcomes] = await batcher.claim([items[i]])
            except DeliveryRefused as exc:
                return exc
            return outcomes

        tasks = [asyncio.create_task(send(i)) for i in range(len(items))]
        await asyncio.sleep(0)  # every task waits at the barrier: they queue together
        start.set()
        answers = await asyncio.gather(*tasks)
        await batcher.close()
        # The refused delivery, and only it, is refused; its batch-mates were claimed without it.
        assert isinstance(answers[bad], DeliveryRefused)
        observed = {i: a for i, a in enumerate(answers) if i != bad and not isinstance(a, BaseException)}
        assert len(observed) == len(items) - 1, [a for a in answers if isinstance(a, BaseException)]
        async with pool.connection() as conn:
            state = await ledger_state(conn)
            await clear(conn)
        assert state["bad"] == 0
        check_against_model(specs, observed, state)
    finally:
        await pool.close()


async def in_one_statement(url: str, specs: list[Spec]) -> None:
    conn = await db.connect(url)
    async with conn:
        answers = await claim_deliveries(conn, [make(spec, i) for i, spec in enumerate(specs)])
        state = await ledger_state(conn)
        await clear(conn)
    observed = dict(enumerate(answers))
    # One call is one sequence: the order given is the order claimed.
    assert sequential_order(specs, observed) is not None
    model = SequentialLedger()
    for i, spec in enumerate(specs):
        assert [o.outcome for o in answers[i]] == model.claim(spec), f"delivery {i} {spec}"
    check_against_model(specs, observed, state)


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=deliveries_strategy,
    bad_at=st.integers(0, 24),
    max_batch=st.sampled_from([1, 3, 64]),
    # Repeats of a key ride in later statements of one batch (up to max_rounds deep), after the distinct keys.
    max_rounds=st.sampled_from([1, 2, 8]),
)
def test_concurrent_claims_through_the_batcher_match_a_sequential_run(
    db_url: str, specs: list[Spec], bad_at: int, max_batch: int, max_rounds: int
) -> None:
    asyncio.run(through_the_batcher(db_url, specs, min(bad_at, len(specs)), max_batch, max_rounds))


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(specs=deliveries_strategy)
def test_one_batch_with_repeated_keys_resolves_in_order(db_url: str, specs: list[Spec]) -> None:
    asyncio.run(in_one_statement(db_url, specs))


@pytest.mark.anyio
async def test_a_batch_that_cannot_be_written_answers_every_request_and_leaves_nothing(db_url: str) -> None:
    # A pool whose every connection attempt fails (its database does not exist): the whole batch is lost.
    missing = db_url.replace("dbname=", f"dbname=missing_{uuid.uuid4().hex[:6]}_")
    pool = db.make_pool(missing, max_size=2, timeout=1)
    await pool.open(wait=False)
    try:
        batcher = ClaimBatcher(Ledger(pool))
        answers = await asyncio.gather(
            *(batcher.claim([make(Spec(0, (f"order:{i}",)), i)]) for i in range(5)), return_exceptions=True
        )
    finally:
        await pool.close()
    assert all(isinstance(a, LedgerUnavailable) for a in answers), answers
    conn = await db.connect(db_url)
    async with conn:
        assert (await ledger_state(conn))["rows"] == 0


@pytest.mark.anyio
async def test_a_request_right_after_a_batch_ends_starts_the_next_one(db_url: str) -> None:
    # The flusher's slot is given back in its last synchronous step: a request arriving as the previous batch
    # is answered (before a done callback would run) must still find a flusher, or it waits forever.
    pool = db.make_pool(db_url, max_size=2)
    await pool.open(wait=True)
    try:
        batcher = ClaimBatcher(Ledger(pool), max_in_flight=1)

        async def one_after_another() -> int:
            for i in range(40):
                [[outcome]] = await batcher.claim([make(Spec(0, (f"order:{i}",)), i)])
                assert isinstance(outcome, Accepted)
            return 40

        # A bound on a hang, not on speed: 40 sequential claims finish in well under a second.
        assert await asyncio.wait_for(one_after_another(), 60) == 40
    finally:
        await pool.close()
