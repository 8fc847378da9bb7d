"""Bulk recovery: redrive and cancel by filter (with a dry run and refusal counts), and pausing a kind."""

from __future__ import annotations

import asyncio
import json

import pytest

from effectgate.gateway import exit_codes
from effectgate.handlers.actions import bulk as bulk_actions
from effectgate.handlers.registry import Registry
from effectgate.ledger import db, jobs
from effectgate.ledger.jobs import filters
from tests.integration.in_process_cli import run_cli
from tests.integration.jobs_and_workers import at, claim, connected, job, lease_one

pytestmark = pytest.mark.rolled_back


async def failed(
    conn: db.Conn, kind: str, *, unrecoverable: bool = False, lock_key: str | None = None
) -> int:
    job_id = await claim(conn, kind=kind, lock_key=lock_key, now=at(0))
    lease = await lease_one(conn, kind=kind, now=at(1))
    assert lease.job_id == job_id
    await jobs.finish(
        conn,
        job_id,
        lease.lease_token,
        state="failed",
        by="w",
        reason="boom",
        unrecoverable=unrecoverable,
        now=at(2),
    )
    return job_id


async def states(conn: db.Conn, ids: list[int]) -> list[str]:
    return [(await job(conn, j))["state"] for j in ids]


async def fleet(conn: db.Conn) -> dict[str, list[int]]:
    plain = [await failed(conn, "A") for _ in range(3)]
    stuck = [await failed(conn, "A", unrecoverable=True)]
    held = [await failed(conn, "A", lock_key="order-9")]
    await claim(conn, kind="Z", lock_key="order-9", now=at(3))  # a live job holding the same lock key
    other = [await failed(conn, "B") for _ in range(2)]
    return {"plain": plain, "stuck": stuck, "held": held, "other": other}


@pytest.mark.anyio
async def test_a_dry_run_reports_what_would_happen_and_changes_nothing(conn: db.Conn) -> None:
    f = await fleet(conn)
    where = filters.JobFilter(states=("failed",), kind="A")
    dry = await bulk_actions.run(conn, Registry(), "redrive", where, by="t", dry_run=True)
    assert dry.summary() == {
        "action": "redrive",
        "dry_run": True,
        "matched": 5,
        "done": 3,
        "refused": {"lock_key_held": 1, "unrecoverable_requires_force": 1},
        "replaying_recorded_failure": 0,
    }
    assert set(await states(conn, f["plain"] + f["stuck"] + f["held"] + f["other"])) == {"failed"}

    real = await bulk_actions.run(conn, Registry(), "redrive", where, by="t")
    assert (real.done, real.refused) == (
        f["plain"],
        {"unrecoverable_requires_force": f["stuck"], "lock_key_held": f["held"]},
    )
    assert await states(conn, f["plain"]) == ["pending"] * 3
    assert await states(conn, f["other"] + f["stuck"]) == ["failed"] * 3


@pytest.mark.anyio
async def test_bulk_cancel_by_kind_source_and_age(conn: db.Conn) -> None:
    old = await claim(conn, kind="A", now=at(0))
    new = [await claim(conn, kind="A", now=at(100)) for _ in range(2)]
    running = await claim(conn, kind="A", now=at(100))
    await jobs.fetch_and_lease(
        conn, owner="w", kinds={"A": 30}, limit=1, now=at(100)
    )  # leases `old`, the first due
    where = filters.JobFilter(states=("pending", "running"), kind="A", source="test", since=at(50))
    result = await bulk_actions.run(conn, Registry(), "cancel", where, by="t", reason="outage")
    assert sorted(result.done) == sorted([*new, running])
    assert await states(conn, new) == ["cancelled", "cancelled"]
    assert (await job(conn, old))["state"] == "running"  # created before --since
    assert (
        await bulk_actions.run(conn, Registry(), "cancel", filters.JobFilter(source="nope"), by="t")
    ).matched == []


@pytest.mark.anyio
async def test_a_paused_kind_is_not_leased_until_resumed(conn: db.Conn) -> None:
    a = await claim(conn, kind="A", now=at(0))
    b = await claim(conn, kind="B", now=at(0))
    await filters.pause(conn, "A", by="alice", reason="payments API down", now=at(1))
    leased = await jobs.fetch_and_lease(conn, owner="w", kinds={"A": 30, "B": 30}, limit=10, now=at(2))
    assert [lease.job_id for lease in leased] == [b]
    [row] = await filters.paused(conn)
    assert (row["kind"], row["paused_by"], row["reason"], row["pending"]) == (
        "A",
        "alice",
        "payments API down",
        1,
    )
    assert await filters.resume(conn, "A", by="alice") is True
    assert await filters.resume(conn, "A", by="alice") is False
    leased = await jobs.fetch_and_lease(conn, owner="w", kinds={"A": 30, "B": 30}, limit=10, now=at(3))
    assert [lease.job_id for lease in leased] == [a]


def test_the_cli_bulk_actions_dry_run_refusal_counts_and_pause(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)

    async def setup() -> dict[str, list[int]]:
        async with connected(db_url) as conn:
            return await fleet(conn)

    f = asyncio.run(setup())
    code, out, _ = run_cli(capsys, "jobs", "redrive", "--state", "failed", "--kind", "A", "--dry-run")
    assert code == exit_codes.EXIT_OK
    assert out.splitlines() == [
        "dry run: 5 jobs matched",
        "  would be redriven: 3",
        "  would be refused lock_key_held: 1",
        "  would be refused unrecoverable_requires_force: 1",
    ]
    code, out, err = run_cli(
        capsys, "jobs", "redrive", "--state", "failed", "--kind", "A", "--format", "json"
    )
    assert code == exit_codes.EXIT_REFUSED and "some_refused" in err
    document = json.loads(out)
    assert (document["error"], document["done"], document["refused"]) == (
        "some_refused",
        3,
        {"lock_key_held": 1, "unrecoverable_requires_force": 1},
    )
    assert sorted(document["job_ids"]) == sorted(f["plain"])
    code, out, _ = run_cli(capsys, "jobs", "redrive", "--state", "failed", "--kind", "B", "--since", "30d")
    # The fleet finished "at(2)", in 2031: later than 30 days ago, so matched.
    assert code == exit_codes.EXIT_OK and "redriven: 2" in out
    # Usage mistakes: no job and no filter; a job and a filter; a bad state.
    for argv, flag in (
        (("jobs", "redrive"), "JOB_ID"),
        (("jobs", "cancel", "5", "--kind", "A"), "--kind"),
        (("jobs", "redrive", "--state", "exploded"), "--state"),
        (("jobs", "redrive", "--kind", "A", "--limit", "0"), "--limit"),
    ):
        code, _, err = run_cli(capsys, *argv)
        assert code == exit_codes.EXIT_USAGE and err.startswith(f"effectgate: {flag}:"), (argv, err)

    code, out, _ = run_cli(capsys, "jobs", "pause", "--kind", "A", "--reason", "outage")
    assert code == exit_codes.EXIT_OK and "paused" in out
    code, out, _ = run_cli(capsys, "jobs", "paused", "--format", "json")
    assert [row["kind"] for row in json.loads(out)["paused"]] == ["A"]
    code, _, _ = run_cli(capsys, "jobs", "resume", "--kind", "A")
    assert code == exit_codes.EXIT_OK
    code, _, err = run_cli(capsys, "jobs", "resume", "--kind", "A")
    assert code == exit_codes.EXIT_REFUSED and "not_paused" in err
