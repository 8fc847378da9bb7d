"""Latest wins, per object (issue 22): an effect that declares a ``version`` and a ``lock_key`` never runs an
event older than the newest one claimed for its object.

Deliveries are planned by ``plan_event`` (the ingress's own function, so the version is read as the gateway
reads it) and claimed through a ``ClaimBatcher`` (the ingress's claim path: group commit, several batches in
flight at once), concurrently and out of order; then a real ``Worker`` runs the jobs. The handler records the
order it ran in. Checked against a model: every object ends at its highest version, every older delivery is
superseded (at the claim, or its job cancelled as superseded before it ran), and none ran after a newer one.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectgate.gateway.operator import reporting
from effectgate.handlers.event import Event, Transition
from effectgate.handlers.plan import plan_event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, reports
from effectgate.ledger.claim_batcher import ClaimBatcher
from effectgate.ledger.claims import ClaimOutcome, Delivery, Superseded
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.handle import Ledger
from effectgate.ledger.vocabulary import DeliveryOutcome
from tests.integration.jobs_and_workers import connected, make_worker

pytestmark = pytest.mark.anyio

T0 = datetime(2031, 3, 4, 12, 0, tzinfo=UTC)
KIND = "sync_order"


def _registry(ran: list[tuple[str, int]], *, iso: bool = True) -> Registry:
    """One kind syncing an order's state: keyed by event, locked and versioned by the order."""
    reg = Registry()

    async def sync_order(ctx: Any, ev: Event) -> None:
        # The run order, as the handler sees it: (object, version) at the start of each run.
        order = ev.payload["order"]
        ran.append((order["id"], order["seq"]))

    reg.effect(
        source="shop",
        events=["orders/updated"],
        name=KIND,
        key=lambda ev: f"order-sync:{ev.payload['id']}",
        lock_key=lambda ev: f"order:{ev.payload['order']['id']}",
        version="/order/updated_at" if iso else "/order/seq",
    )(sync_order)
    return reg


def _event(obj: int, version: int, variant: int = 0) -> Event:
    """Order ``obj``'s update number ``version`` (its ``updated_at`` grows with it); ``variant`` changes the
    payload but not the event id, for conflicts under one key."""
    updated = (T0 + timedelta(seconds=version)).isoformat()
    payload = {
        "id": f"evt_{obj}_{version}",
        "order": {"id": f"o{obj}", "seq": version, "updated_at": updated, "status": f"s{version}"},
        "variant": variant,
    }
    return Event("shop", payload["id"], "orders/updated", payload, "default")


def _delivery(event: Event) -> Delivery:
    return Delivery(
        request_id=uuid.uuid4().hex,
        tenant=event.tenant,
        source=event.source,
        event_id=event.id,
        event_type=event.type,
        payload=event.payload,
        fingerprint=fingerprint(event.payload),
    )


async def _send_concurrently(
    claims_pool: db.Pool, reg: Registry, events: list[Event], *, senders: int = 32
) -> list[ClaimOutcome]:
    """Every event claimed through one batcher by ``senders`` concurrent senders, as concurrent requests
    of a gateway process are; returns one outcome per event, in ``events`` order."""
    batcher = ClaimBatcher(Ledger(claims_pool), max_batch=16, max_in_flight=4, deadline=600)
    outcomes: list[ClaimOutcome | None] = [None] * len(events)
    queue = list(enumerate(events))

    async def sender() -> None:
        while queue:
            i, event = queue.pop()
            plan = plan_event(reg, event)
            [[outcome]] = await batcher.claim([(_delivery(event), plan.effects)])
            outcomes[i] = outcome

    await asyncio.gather(*(sender() for _ in range(senders)))
    await batcher.close()
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


async def _jobs_by_event(conn: db.Conn) -> dict[str, dict[str, Any]]:
    rows = await (
        await conn.execute(
            "SELECT e.event_id, j.state::text AS state, j.terminal_reason, j.version FROM jobs j "
            "JOIN effects e ON e.id = j.effect_id"
        )
    ).fetchall()
    return {r["event_id"]: r for r in rows}


async def _high_water(conn: db.Conn) -> dict[str, int]:
    rows = await (await conn.execute("SELECT lock_key, version FROM effect_versions")).fetchall()
    return {r["lock_key"]: r["version"] for r in rows}


def _micros(version: int) -> int:
    return int((T0 + timedelta(seconds=version)).timestamp()) * 1_000_000


def _assert_in_version_order(ran: list[tuple[str, int]]) -> None:
    last: dict[str, int] = {}
    for obj, version in ran:
        assert version > last.get(obj, -1), f"{obj} ran version {version} after {last[obj]}"
        last[obj] = version


async def test_a_thousand_shuffled_updates_of_a_hundred_objects_leave_each_at_its_latest(
    pool: db.Pool,
    db_url: str,
) -> None:
    objects, versions = 100, 10
    ran: list[tuple[str, int]] = []
    reg = _registry(ran)
    events = [_event(o, v) for o in range(objects) for v in range(versions)]
    random.Random(22).shuffle(events)

    outcomes = await _send_concurrently(pool, reg, events)
    await make_worker(pool, reg, concurrency=16).run_until_idle()

    async with connected(db_url) as conn:
        jobs_by_event = await _jobs_by_event(conn)
        high_water = await _high_water(conn)
        rates = await reporting.fetch(conn, reports.DELIVERY_OUTCOMES, {})
        stored = Counter(
            r["outcome"] for r in await (await conn.execute("SELECT outcome FROM deliveries")).fetchall()
        )
    claimed = Counter(str(o.outcome) for o in outcomes)
    superseded_at_claim = superseded_at_fetch = 0
    for event, outcome in zip(events, outcomes, strict=True):
        order, version = event.payload["order"]["id"], event.payload["order"]["seq"]
        latest = version == versions - 1
        if isinstance(outcome, Superseded):
            assert not latest
            assert outcome.version == _micros(version) < outcome.latest_version
            superseded_at_claim += 1
            continue
        assert outcome.outcome == DeliveryOutcome.ACCEPTED, (order, version, outcome)
        job = jobs_by_event[event.id]
        if latest:
            assert (job["state"], job["terminal_reason"]) == ("succeeded", None), job
        else:
            # Claimed before a newer one, then cancelled before it could run after it.
            assert (job["state"], job["terminal_reason"]) == ("cancelled", "superseded"), (
                order,
                version,
                job,
            )
            superseded_at_fetch += 1
    # Every object ends at its highest version, which ran; nothing ran after a newer version.
    assert high_water == {f"order:o{o}": _micros(versions - 1) for o in range(objects)}
    assert sorted(ran) == sorted((f"o{o}", versions - 1) for o in range(objects))
    _assert_in_version_order(ran)
    assert superseded_at_claim + superseded_at_fetch == objects * (versions - 1)
    assert stored == Counter({k: n for k, n in claimed.items()})
    # The per-source rates report (and the dashboard, which shows its columns) counts them.
    [rate] = rates.items
    assert (rate["source"], rate["superseded"], rate["accepted"]) == (
        "shop",
        superseded_at_claim,
        claimed["accepted"],
    )
    print(
        f"\nlatest wins: {len(events)} deliveries of {objects} objects; claim outcomes {dict(claimed)}; "
        f"superseded at the claim {superseded_at_claim}, cancelled as superseded before running "
        f"{superseded_at_fetch}; handler runs {len(ran)}, every object at its highest version, "
        "none ran after a newer one"
    )


async def test_a_worker_running_while_updates_race_in_never_runs_an_older_one_after_a_newer(
    pool: db.Pool,
    db_url: str,
) -> None:
    ran: list[tuple[str, int]] = []
    reg = _registry(ran, iso=False)
    events = [_event(o, v) for o in range(20) for v in range(10)]
    random.Random(4).shuffle(events)
    worker = make_worker(pool, reg, concurrency=8)
    runner = asyncio.create_task(worker.run())
    try:
        outcomes = await _send_concurrently(pool, reg, events, senders=16)

        async def settled() -> bool:
            async with connected(db_url) as conn:
                row = await (
                    await conn.execute("SELECT count(*) AS n FROM jobs WHERE state IN ('pending', 'running')")
                ).fetchone()
            return row is not None and row["n"] == 0

        deadline = asyncio.get_running_loop().time() + 60
        while not await settled():
            assert asyncio.get_running_loop().time() < deadline, "jobs did not settle within 60 s"
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await runner
    _assert_in_version_order(ran)
    last_run = {obj: version for obj, version in ran}
    assert last_run == {f"o{o}": 9 for o in range(20)}
    async with connected(db_url) as conn:
        jobs_by_event = await _jobs_by_event(conn)
    for event, outcome in zip(events, outcomes, strict=True):
        if outcome.outcome == DeliveryOutcome.ACCEPTED:
            job = jobs_by_event[event.id]
            ran_it = (event.payload["order"]["id"], event.payload["order"]["seq"]) in ran
            assert job["state"] == ("succeeded" if ran_it else "cancelled"), job
            assert ran_it or job["terminal_reason"] == "superseded"


# Deliveries for a model: (object, version, payload variant), repeats and equal versions included.
deliveries = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 4), st.integers(0, 1)), min_size=1, max_size=24
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=deliveries)
async def test_racing_out_of_order_deliveries_match_the_model(
    pool: db.Pool,
    db_url: str,
    sent: list[tuple[int, int, int]],
) -> None:
    # Objects of their own per example: the database is shared by the examples of one test.
    run = uuid.uuid4().hex[:6]
    ran: list[tuple[str, int]] = []
    reg = _registry(ran, iso=False)
    events = []
    for obj, version, variant in sent:
        event = _event(obj, version, variant)
        payload = {
            **event.payload,
            "id": f"{event.id}_{run}",
            "order": {**event.payload["order"], "id": f"{run}-{obj}"},
        }
        events.append(Event("shop", payload["id"], event.type, payload, "default"))
    outcomes = await _send_concurrently(pool, reg, events, senders=8)

    # The model: per object, the newest version sent is claimed (its first delivery accepted) and is the
    # high-water mark; a version below it ends superseded one way or another; within one version, one
    # delivery is accepted or none (all superseded), and the others are duplicates (same payload) or
    # rejected (another payload), exactly as without versions.
    newest: dict[str, int] = defaultdict(lambda: -1)
    for event in events:
        order = event.payload["order"]
        newest[order["id"]] = max(newest[order["id"]], order["seq"])
    by_version: dict[tuple[str, int], list[tuple[Event, ClaimOutcome]]] = defaultdict(list)
    for event, outcome in zip(events, outcomes, strict=True):
        by_version[event.payload["order"]["id"], event.payload["order"]["seq"]].append((event, outcome))
    for (obj, version), claims in by_version.items():
        kinds = Counter(str(o.outcome) for _, o in claims)
        if version == newest[obj]:
            assert kinds["superseded"] == 0 and kinds["accepted"] == 1, (obj, version, kinds)
        else:
            assert kinds["accepted"] <= 1, (obj, version, kinds)
        held = next((e for e, o in claims if o.outcome == DeliveryOutcome.ACCEPTED), None)
        for event, outcome in claims:
            if outcome.outcome == DeliveryOutcome.DUPLICATE:
                assert held is not None and event.payload == held.payload
            elif outcome.outcome == DeliveryOutcome.REJECTED:
                assert held is not None and event.payload != held.payload

    await make_worker(pool, reg, concurrency=4).run_until_idle()
    async with connected(db_url) as conn:
        high_water = await _high_water(conn)
        jobs_by_event = await _jobs_by_event(conn)
    assert {k: v for k, v in high_water.items() if k.startswith(f"order:{run}-")} == {
        f"order:{obj}": version for obj, version in newest.items()
    }
    assert sorted(ran) == sorted(newest.items())
    for (obj, version), claims in by_version.items():
        for event, outcome in claims:
            if outcome.outcome == DeliveryOutcome.ACCEPTED and version < newest[obj]:
                job = jobs_by_event[event.id]
                assert (job["state"], job["terminal_reason"]) == ("cancelled", "superseded")


async def test_a_fetch_that_only_finds_superseded_jobs_goes_on_to_the_newer_one(
    pool: db.Pool,
    db_url: str,
) -> None:
    """One free slot, the older version at the head of the queue: the fetch cancels it and still leases the
    newer one, rather than answer "nothing due" and leave it to the next poll."""
    ran: list[tuple[str, int]] = []
    reg = _registry(ran, iso=False)
    for version in (1, 2):
        [[outcome]] = [await _send_concurrently(pool, reg, [_event(7, version)], senders=1)]
        assert outcome.outcome == DeliveryOutcome.ACCEPTED
    assert await make_worker(pool, reg, concurrency=1).run_until_idle() == 1
    assert ran == [("o7", 2)]
    async with connected(db_url) as conn:
        jobs_by_event = await _jobs_by_event(conn)
    assert (jobs_by_event["evt_7_1"]["state"], jobs_by_event["evt_7_1"]["terminal_reason"]) == (
        "cancelled",
        "superseded",
    )


async def test_a_superseded_job_of_a_kind_with_on_transition_ends_through_its_hook(
    pool: db.Pool,
    db_url: str,
) -> None:
    """The hook mirrors every terminal state, the superseded cancel included, in the cancel's transaction."""
    ran: list[tuple[str, int]] = []
    seen: list[tuple[str, str, str | None]] = []

    async def mirror(conn: db.Conn, transition: Transition) -> None:
        seen.append((transition.effect_key, str(transition.state), transition.reason))

    reg = Registry()

    async def sync_order(ctx: Any, ev: Event) -> None:
        ran.append((ev.payload["order"]["id"], ev.payload["order"]["seq"]))

    reg.effect(
        source="shop",
        events=["orders/updated"],
        name=KIND,
        key=lambda ev: f"order-sync:{ev.payload['id']}",
        lock_key=lambda ev: f"order:{ev.payload['order']['id']}",
        version="/order/seq",
        on_transition=mirror,
    )(sync_order)
    for version in (1, 2):
        [outcome] = await _send_concurrently(pool, reg, [_event(3, version)], senders=1)
        assert outcome.outcome == DeliveryOutcome.ACCEPTED
    assert await make_worker(pool, reg, concurrency=1).run_until_idle() == 1
    assert ran == [("o3", 2)]
    assert sorted(seen) == [
        ("order-sync:evt_3_1", "cancelled", "superseded"),
        ("order-sync:evt_3_2", "succeeded", None),
    ]
