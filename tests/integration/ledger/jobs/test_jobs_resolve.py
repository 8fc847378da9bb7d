"""Resolved by hand (ledger/jobs/resolutions.py): a failed or parked job closed without running it, its refusals,
its idempotence, and a resolve racing redrives and workers for the same job."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from effectgate.handlers.actions import control
from effectgate.handlers.event import Transition
from effectgate.ledger import db, jobs, reports
from effectgate.ledger.errors import InvalidParameter
from effectgate.ledger.jobs import Refused, resolutions
from effectgate.ledger.jobs.resolutions import Resolved
from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper
from tests.integration.jobs_and_workers import at, claim, connected, job, kind, lease_one, registry

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def _ended(conn: db.Conn, state: str, **claim_args: Any) -> int:
    job_id = await claim(conn, now=at(0), **claim_args)
    lease = await lease_one(conn, kind=claim_args.get("kind", "k"), now=at(0))
    await jobs.finish(conn, job_id, lease.lease_token, state=state, by="w", reason="boom", now=at(1))  # type: ignore[arg-type]
    return job_id


@pytest.mark.parametrize("state", ["failed", "parked"])
async def test_a_failed_or_parked_job_is_resolved_with_who_why_and_when(conn: db.Conn, state: str) -> None:
    job_id = await _ended(conn, state)
    answer = await resolutions.resolve(
        conn, job_id, by="cli:alice", reason="  refunded in Stripe  ", now=at(5)
    )
    assert answer == Resolved(job_id, state, at(5), "cli:alice", "refunded in Stripe", already=False)  # type: ignore[arg-type]
    row = await job(conn, job_id)
    assert (
        row["state"],
        row["resolved_from"],
        row["resolved_at"],
        row["resolved_by"],
        row["resolved_reason"],
    ) == (
        "resolved",
        state,
        at(5),
        "cli:alice",
        "refunded in Stripe",
    )
    # How it ended stays readable beside the resolution.
    assert (row["terminal_reason"], row["terminal_by"], row["finished_at"]) == ("boom", "w", at(1))
    # Nothing waits for a human any more: the gauge the alert reads leaves it out.
    gauges = await reports.job_gauges(conn, now=at(6))
    assert [r for r in gauges.by_state_kind if r["state"] in ("failed", "parked", "resolved")] == []


async def test_the_same_resolution_again_answers_the_one_that_stands(conn: db.Conn) -> None:
    job_id = await _ended(conn, "failed")
    first = await resolutions.resolve(conn, job_id, by="op", reason="handled", now=at(5))
    again = await resolutions.resolve(conn, job_id, by="op", reason="handled", now=at(9))
    assert isinstance(first, Resolved) and isinstance(again, Resolved)
    assert (again.already, again.resolved_at) == (True, at(5))
    other = await resolutions.resolve(conn, job_id, by="op", reason="something else", now=at(9))
    assert isinstance(other, Refused) and other.code == "already_resolved"
    assert "resolved by op" in other.detail and "handled" in other.detail
    someone = await resolutions.resolve(conn, job_id, by="bob", reason="handled", now=at(9))
    assert isinstance(someone, Refused) and someone.code == "already_resolved"
    row = await job(conn, job_id)
    assert (row["resolved_by"], row["resolved_reason"], row["resolved_at"]) == ("op", "handled", at(5))


@pytest.mark.parametrize("state", ["pending", "running", "succeeded", "cancelled"])
async def test_only_failed_and_parked_jobs_can_be_resolved(conn: db.Conn, state: str) -> None:
    job_id = await claim(conn, now=at(0))
    if state != "pending":
        lease = await lease_one(conn, now=at(0))
        if state == "succeeded":
            await jobs.finish(conn, job_id, lease.lease_token, state="succeeded", by="w", now=at(1))
        elif state == "cancelled":
            await jobs.cancel(conn, job_id, by="alice", now=at(1))
            await jobs.finish(conn, job_id, lease.lease_token, state="succeeded", by="w", now=at(1))
    refused = await resolutions.resolve(conn, job_id, by="op", reason="x", now=at(2))
    assert isinstance(refused, Refused) and refused.code == "not_resolvable", refused
    assert f"job {job_id} is {state}" in refused.detail
    if state == "running":
        assert "leased to a worker" in refused.detail
    row = await job(conn, job_id)
    assert (row["state"], row["resolved_at"]) == (state, None)
    missing = await resolutions.resolve(conn, 10_000, by="op", reason="x")
    assert isinstance(missing, Refused) and missing.code == "not_found"


@pytest.mark.parametrize("reason", ["", "   ", "a\x00b", "line\nbreak", "x" * 501])
async def test_a_resolution_needs_a_printable_reason(conn: db.Conn, reason: str) -> None:
    job_id = await _ended(conn, "failed")
    with pytest.raises(InvalidParameter) as refused:
        await resolutions.resolve(conn, job_id, by="op", reason=reason)
    assert refused.value.code == "invalid_reason"
    assert (await job(conn, job_id))["state"] == "failed"


async def test_a_resolution_after_retention_purged_the_payload_rewrites_the_tombstone(conn: db.Conn) -> None:
    job_id = await _ended(conn, "failed")
    config = RetentionConfig(payloads=1 * DAY, history=30 * DAY)
    await RetentionKeeper(config).run_once(conn, now=at(2 * DAY))
    outcome = "SELECT e.outcome FROM effects e JOIN jobs j ON j.effect_id = e.id WHERE j.id = %s"
    assert (await (await conn.execute(outcome, [job_id])).fetchone()) == {"outcome": "failed"}
    assert isinstance(await resolutions.resolve(conn, job_id, by="op", reason="refunded"), Resolved)
    assert (await (await conn.execute(outcome, [job_id])).fetchone()) == {"outcome": "resolved"}


async def test_a_resolved_job_is_never_redriven(conn: db.Conn) -> None:
    job_id = await _ended(conn, "parked")
    assert isinstance(await resolutions.resolve(conn, job_id, by="op", reason="done by hand"), Resolved)
    refused = await jobs.redrive(conn, job_id, by="test", force=True)
    assert isinstance(refused, Refused) and refused.code == "not_redrivable"
    assert "resolved" in refused.detail
    assert (await job(conn, job_id))["state"] == "resolved"


async def test_a_resolution_runs_the_kinds_on_transition_in_its_transaction(conn: db.Conn) -> None:
    seen: list[Transition] = []

    async def mirror(c: db.Conn, t: Transition) -> None:
        seen.append(t)

    async def noop(ctx: Any, ev: Any) -> None:
        return None

    reg = registry(kind(noop, on_transition=mirror))
    job_id = await _ended(conn, "failed")
    answer = await control.resolve(conn, reg, job_id, by="op", reason="paid by cheque")
    assert isinstance(answer, Resolved)
    assert [(t.job_id, t.state, t.reason) for t in seen] == [(job_id, "resolved", "paid by cheque")]
    # Repeating it changes nothing and mirrors nothing.
    assert isinstance(await control.resolve(conn, reg, job_id, by="op", reason="paid by cheque"), Resolved)
    assert len(seen) == 1


async def test_a_failing_hook_does_not_block_the_resolution(conn: db.Conn) -> None:
    async def broken(c: db.Conn, t: Transition) -> None:
        raise RuntimeError("mirror table is gone")

    async def noop(ctx: Any, ev: Any) -> None:
        return None

    reg = registry(kind(noop, on_transition=broken))
    job_id = await _ended(conn, "parked")
    answer = await control.resolve(conn, reg, job_id, by="op", reason="handled")
    assert isinstance(answer, Resolved) and not answer.already
    row = await job(conn, job_id)
    assert (row["state"], row["resolved_reason"]) == ("resolved", "handled")


ROUNDS = 12
PER_SIDE = 3


async def test_a_resolve_racing_redrives_and_workers_ends_in_one_state(db_url: str) -> None:
    """Resolvers, redrivers and fetching workers on separate connections, all at once on one failed or
    parked job, round after round; counted afterwards: either one resolution and nothing else, or one
    redrive (then at most one lease) and every resolve refused."""
    async with connected(db_url) as conn:
        conns = [await db.connect(db_url) for _ in range(3 * PER_SIDE)]
        outcomes = {"resolved": 0, "redriven": 0}
        try:
            for n in range(ROUNDS):
                job_id = await _ended(conn, "failed" if n % 2 else "parked", kind=f"race{n}")
                resolvers = [
                    resolutions.resolve(c, job_id, by=f"op{i}", reason="handled")
                    for i, c in enumerate(conns[:PER_SIDE])
                ]
                redrivers = [jobs.redrive(c, job_id, by="test") for c in conns[PER_SIDE : 2 * PER_SIDE]]
                workers = [
                    jobs.fetch_and_lease(c, owner=f"w{i}", kinds={f"race{n}": 30}, limit=1)
                    for i, c in enumerate(conns[2 * PER_SIDE :])
                ]
                answers = await asyncio.gather(*resolvers, *redrivers, *workers)
                resolves = answers[:PER_SIDE]
                redrives = answers[PER_SIDE : 2 * PER_SIDE]
                leases = [lease for got in answers[2 * PER_SIDE :] for lease in got]  # type: ignore[union-attr]
                made = [r for r in resolves if isinstance(r, Resolved)]
                redriven = [r for r in redrives if r is None]
                row = await job(conn, job_id)
                assert len(made) + len(redriven) == 1, answers
                assert all(not r.already for r in made)
                if made:
                    outcomes["resolved"] += 1
                    assert (row["state"], row["resolved_by"]) == ("resolved", made[0].resolved_by)
                    assert leases == []
                    assert {r.code for r in resolves if isinstance(r, Refused)} <= {"already_resolved"}
                    assert {r.code for r in redrives if r is not None} == {"not_redrivable"}  # type: ignore[union-attr]
                else:
                    outcomes["redriven"] += 1
                    assert row["resolved_at"] is None
                    assert {r.code for r in resolves} == {"not_resolvable"}  # type: ignore[union-attr]
                    assert len(leases) <= 1
                    assert row["state"] == ("running" if leases else "pending")
        finally:
            for c in conns:
                await c.close()
    assert sum(outcomes.values()) == ROUNDS
