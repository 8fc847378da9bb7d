"""Steps with ``find=`` (issue 19): a committed ``started`` marker before the call, and a look before a
second create, so a downstream that takes no idempotency key still acts once per step."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from effectgate.handlers import EffectContext, Event, TerminalError, TransientError
from effectgate.handlers.context import Services
from effectgate.handlers.idempotency import idempotency_key
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.errors import LeaseLost, StepAlreadyRecorded
from effectgate.ledger.jobs import steps
from effectgate.ledger.vocabulary import StepStatus
from tests.integration.jobs_and_workers import claim, kind, lease_one, make_worker, registry

pytestmark = pytest.mark.anyio


async def steps_of(pool: db.Pool) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return await (
            await conn.execute("SELECT name, status, result, error, idempotency_key, lease_token FROM steps")
        ).fetchall()


class Downstream:
    """An API without idempotency keys: every create makes a new object; objects are found by reference."""

    def __init__(self) -> None:
        self.objects: list[dict[str, Any]] = []
        self.finds = 0

    def create(self, reference: str) -> dict[str, Any]:
        obj = {"id": f"obj_{len(self.objects) + 1}", "reference": reference}
        self.objects.append(obj)
        return obj

    def find(self, reference: str) -> dict[str, Any] | None:
        self.finds += 1
        return next((o for o in self.objects if o["reference"] == reference), None)


async def test_an_answer_lost_after_the_create_is_found_not_created_again(pool: db.Pool) -> None:
    api = Downstream()
    seen_before_call: list[list[dict[str, Any]]] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def create(key: str) -> dict[str, Any]:
            # The marker is committed (another connection sees it) before anything is sent.
            seen_before_call.append(await steps_of(pool))
            api.create(key)
            # The object exists downstream, but its answer never comes back.
            raise TransientError("read timeout")

        async def find(key: str) -> dict[str, Any] | None:
            return api.find(key)

        assert await ctx.step("ship", create, find=find) == {
            "id": "obj_1",
            "reference": ctx.idempotency_key("ship"),
        }

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:1", max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()

    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and (job["state"], job["attempt"]) == ("succeeded", 2)
    key = idempotency_key("default", "order:1", "ship")
    assert [[(s["name"], s["status"], s["idempotency_key"]) for s in rows] for rows in seen_before_call] == [
        [("ship", "started", key)]
    ]
    assert len(api.objects) == 1 and api.finds == 1
    [step] = await steps_of(pool)
    assert (step["status"], step["result"]) == ("succeeded", {"id": "obj_1", "reference": key})


async def test_nothing_found_means_the_call_never_arrived_and_it_is_made(pool: db.Pool) -> None:
    api = Downstream()
    calls = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def create(key: str) -> dict[str, Any]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise TransientError("connect refused")  # never reached the API
            return api.create(key)

        async def find(key: str) -> dict[str, Any] | None:
            return api.find(key)

        await ctx.step("ship", create, find=find)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:2", max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and job["state"] == "succeeded"
    assert (calls, api.finds, len(api.objects)) == (2, 1, 1)
    [step] = await steps_of(pool)
    assert step["status"] == "succeeded"


async def test_a_first_attempt_does_not_look_and_a_recorded_step_does_not_look_again(pool: db.Pool) -> None:
    api = Downstream()
    runs = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        nonlocal runs
        runs += 1

        async def create(key: str) -> dict[str, Any]:
            return api.create(key)

        async def find(key: str) -> dict[str, Any] | None:
            return api.find(key)

        await ctx.step("ship", create, find=find)
        if runs == 1:
            raise TransientError("a later step blinked")

    async with pool.connection() as conn:
        await claim(conn, "order:3", max_attempts=3)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert (runs, api.finds, len(api.objects)) == (2, 0, 1)


async def test_a_terminal_error_from_find_is_recorded_like_one_from_the_call(pool: db.Pool) -> None:
    creates = 0
    finds = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def create(key: str) -> dict[str, Any]:
            nonlocal creates
            creates += 1
            raise TransientError("read timeout")

        async def find(key: str) -> dict[str, Any] | None:
            nonlocal finds
            finds += 1
            raise TerminalError("search refused", code="forbidden")

        await ctx.step("ship", create, find=find)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:4", max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
        assert job is not None and (job["state"], job["attempt"]) == ("failed", 2)
        assert await jobs.redrive(conn, job_id, by="test", force=True) is None
    [step] = await steps_of(pool)
    assert (step["status"], step["error"]["code"]) == ("failed", "forbidden")
    # A redrive replays the recorded failure: neither call runs again.
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert (creates, finds) == (1, 1)


async def test_a_transient_error_from_find_retries_and_looks_again(pool: db.Pool) -> None:
    api = Downstream()
    finds = 0

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def create(key: str) -> dict[str, Any]:
            api.create(key)
            raise TransientError("read timeout")

        async def find(key: str) -> dict[str, Any] | None:
            nonlocal finds
            finds += 1
            if finds == 1:
                raise TransientError("search index is behind")
            return api.find(key)

        await ctx.step("ship", create, find=find)

    async with pool.connection() as conn:
        job_id = await claim(conn, "order:5", max_attempts=5)
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    async with pool.connection() as conn:
        job = await jobs.get(conn, job_id)
    assert job is not None and (job["state"], job["attempt"]) == ("succeeded", 3)
    assert (finds, len(api.objects)) == (2, 1)


async def test_a_step_without_find_writes_no_marker(pool: db.Pool) -> None:
    during: list[list[dict[str, Any]]] = []

    async def handler(ctx: EffectContext, ev: Event) -> None:
        async def call(key: str) -> int:
            during.append(await steps_of(pool))
            return 1

        await ctx.step("plain", call)

    async with pool.connection() as conn:
        await claim(conn, "order:6")
    await make_worker(pool, registry(kind(handler))).run_until_idle()
    assert during == [[]]
    [step] = await steps_of(pool)
    assert step["status"] == "succeeded"


async def test_a_marker_left_behind_and_find_since_removed_just_calls_again(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        await claim(conn, "order:7")
        lease = await lease_one(conn)
        key = idempotency_key("default", "order:7", "ship")
        await steps.mark_started(
            conn, job_id=lease.job_id, lease_token=lease.lease_token, name="ship", idempotency_key=key
        )
    ctx = context(pool, lease, await recorded(pool, lease))
    assert await ctx.step("ship", _const({"id": "obj_9"})) == {"id": "obj_9"}
    [step] = await steps_of(pool)
    assert (step["status"], step["result"]) == ("succeeded", {"id": "obj_9"})


async def test_a_lost_lease_writes_no_marker_and_makes_no_call(pool: db.Pool) -> None:
    calls = 0

    async def create(key: str) -> int:
        nonlocal calls
        calls += 1
        return 1

    async def find(key: str) -> int | None:
        return None

    async with pool.connection() as conn:
        await claim(conn, "order:8")
        lease = await lease_one(conn)
    # Another worker holds the job now: this slice's token is stale.
    stale = dataclasses.replace(lease, lease_token=lease.lease_token - 1)
    with pytest.raises(LeaseLost):
        await context(pool, stale, {}).step("ship", create, find=find)
    fenced = context(pool, lease, {})
    fenced.fenced_off = True
    with pytest.raises(LeaseLost):
        await fenced.step("ship", create, find=find)
    assert calls == 0
    assert await steps_of(pool) == []


async def test_a_marker_is_not_progress_and_an_outcome_replaces_it_once(pool: db.Pool) -> None:
    async with pool.connection() as conn:
        job_id = await claim(conn, "order:9")
        lease = await lease_one(conn)
    ctx = context(pool, lease, {})
    seen: list[Any] = []

    async def create(key: str) -> dict[str, str]:
        async with pool.connection() as conn:
            seen.append((await jobs.get(conn, job_id) or {}).get("committed_since_release"))
        return {"id": "obj_1"}

    await ctx.step("ship", create, find=_const(None))
    # A worker that dies inside every call must still count towards poison: the marker is no progress.
    assert seen == [False]
    async with pool.connection() as conn:
        view = await reports.effect_view(conn, "order:9")
        assert view is not None and [s["status"] for s in view.steps] == ["succeeded"]
        # The outcome replaced the marker; it is not replaced again, and the step cannot be re-marked.
        key = idempotency_key("default", "order:9", "ship")
        with pytest.raises(StepAlreadyRecorded):
            await steps.record(
                conn,
                job_id=job_id,
                lease_token=lease.lease_token,
                name="ship",
                idempotency_key=key,
                status=StepStatus.SUCCEEDED,
                result={"id": "obj_2"},
            )
        with pytest.raises(StepAlreadyRecorded):
            await steps.mark_started(
                conn, job_id=job_id, lease_token=lease.lease_token, name="ship", idempotency_key=key
            )
    [step] = await steps_of(pool)
    assert step["result"] == {"id": "obj_1"}


def _const(value: Any) -> Any:
    async def fn(key: str) -> Any:
        return value

    return fn


async def recorded(pool: db.Pool, lease: jobs.Lease) -> dict[str, steps.RecordedStep]:
    async with pool.connection() as conn:
        return await steps.for_effect(conn, lease.effect_id)


def context(pool: db.Pool, lease: jobs.Lease, recorded: dict[str, steps.RecordedStep]) -> EffectContext:
    event = Event(lease.source, lease.event_id, lease.event_type, lease.payload, lease.tenant)
    return EffectContext(
        pool=pool, lease=lease, event=event, recorded=recorded, services=Services(), slice_budget=60.0
    )
