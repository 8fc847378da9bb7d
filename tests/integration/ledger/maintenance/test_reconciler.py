"""Invariants 9 and 10: the reconciler repairs jobs whose workers are gone, once each, whoever runs it.

The clock is a parameter: a lease "expires" because the pass is told it is later, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.maintenance.scheduler import (
    RECONCILER_LOCK_ID,
    KindPolicy,
    Reconciler,
    ReconcilerConfig,
    Repaired,
    sweep_lock_id,
)
from tests.integration.jobs_and_workers import at, claim, connected, job, lease_one, scalar, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

ROOT = Path(__file__).resolve().parents[4]


async def orphan(conn: db.Conn, job_id: int, *, at_s: float, ttl: float = 10, commit: bool = False) -> None:
    """Lease the job at ``at_s`` and walk away (optionally after committing a checkpoint)."""
    lease = await lease_one(conn, ttl=ttl, now=at(at_s))
    assert lease.job_id == job_id
    if commit:
        await jobs.save_checkpoint(conn, job_id, lease.lease_token, {"at": at_s}, now=at(at_s))


@pytest.mark.parametrize(("policy", "state"), [("redrive", "pending"), ("park", "parked")])
async def test_an_expired_lease_is_redriven_or_parked_by_orphan_policy(
    conn: db.Conn, policy: str, state: str
) -> None:
    job_id = await claim(conn, orphan_policy=policy, now=at(0))
    await orphan(conn, job_id, at_s=0, ttl=10, commit=True)
    early = await Reconciler().run_once(conn, now=at(9))
    # Nothing to rescue yet (the pass may still make history partitions ahead: another service).
    assert (early.redriven, early.parked, early.rescue.changed) == ([], [], False)
    assert (await job(conn, job_id))["state"] == "running"
    result = await Reconciler().run_once(conn, now=at(11))
    assert {"pending": result.redriven, "parked": result.parked}[state] == [job_id]
    row = await job(conn, job_id)
    assert (row["state"], row["lease_owner"], row["lease_expires_at"]) == (state, None, None)
    if state == "parked":
        assert row["terminal_reason"] == "orphaned: lease expired and orphan_policy is park"
        assert (row["terminal_by"], row["finished_at"]) == ("reconciler", at(11))
    [attempt] = await jobs.attempts(conn, job_id)
    assert attempt["outcome"] == "lease_expired"
    # Done once: a second pass finds nothing.
    again = await Reconciler().run_once(conn, now=at(12))
    assert (again.redriven, again.parked) == ([], [])


async def test_orphaned_again_and_again_without_a_commit_is_parked_as_poison(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    states = []
    for n in range(3):
        await orphan(conn, job_id, at_s=100 * n)
        await Reconciler().run_once(conn, now=at(100 * n + 50))
        states.append((await job(conn, job_id))["state"])
    assert states == ["pending", "pending", "parked"]
    row = await job(conn, job_id)
    assert row["terminal_reason"] == "poison: orphaned 3 times without committing"


async def test_a_commit_between_orphanings_resets_the_poison_count(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    for n in range(6):
        await orphan(conn, job_id, at_s=100 * n, commit=n in (1, 3, 5))
        await Reconciler().run_once(conn, now=at(100 * n + 50))
        assert (await job(conn, job_id))["state"] == "pending", n


async def test_the_poison_threshold_is_settable_per_kind(conn: db.Conn) -> None:
    strict = await claim(conn, kind="strict", now=at(0))
    lenient = await claim(conn, kind="k", now=at(0))
    reconciler = Reconciler(
        ReconcilerConfig(poison_threshold=5), kinds={"strict": KindPolicy(poison_threshold=1)}
    )
    await jobs.fetch_and_lease(conn, owner="w", kinds={"strict": 10, "k": 10}, limit=5, now=at(0))
    result = await reconciler.run_once(conn, now=at(50))
    assert (result.parked, result.redriven) == ([strict], [lenient])


async def test_a_cancelled_job_whose_worker_vanished_ends_cancelled(conn: db.Conn) -> None:
    job_id = await claim(conn, now=at(0))
    await orphan(conn, job_id, at_s=0)
    assert await jobs.cancel(conn, job_id, by="alice", now=at(1)) == "running"
    result = await Reconciler().run_once(conn, now=at(50))
    assert result.cancelled == [job_id]
    row = await job(conn, job_id)
    assert (row["state"], row["terminal_by"]) == ("cancelled", "alice")


async def test_a_pass_another_process_owns_does_nothing(db_url: str) -> None:
    async with connected(db_url) as conn, connected(db_url) as other:
        job_id = await claim(conn, now=at(0))
        await orphan(conn, job_id, at_s=0)
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(%s)", (RECONCILER_LOCK_ID,))
            result = await Reconciler().run_once(conn, now=at(50))
            assert (result.owned, result.redriven) == (False, [])
        assert (await Reconciler().run_once(conn, now=at(50))).redriven == [job_id]


async def test_reconcilers_on_many_connections_at_once_repair_each_job_once(db_url: str) -> None:
    async with connected(db_url) as conn:
        ids = [await claim(conn, now=at(0)) for _ in range(30)]
        await jobs.fetch_and_lease(conn, owner="gone", kinds={"k": 10}, limit=30, now=at(0))
        conns = [await db.connect(db_url) for _ in range(6)]
        try:
            # Small batches, several passes each: the passes interleave rather than one doing it all.
            reconciler = Reconciler(ReconcilerConfig(batch=3))

            async def passes(c: db.Conn) -> list[int]:
                # Until a pass this connection owns finds nothing left to repair.
                repaired: list[int] = []
                for _ in range(500):
                    result = await reconciler.run_once(c, now=at(60))
                    repaired += result.redriven
                    if result.owned and not result.redriven:
                        return repaired
                    await asyncio.sleep(0)
                raise AssertionError("the reconcilers never finished")

            results = await asyncio.gather(*(passes(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        repaired = [job_id for r in results for job_id in r]
        assert sorted(repaired) == sorted(ids)
        assert await scalar(conn, "SELECT count(*) FROM job_attempts WHERE outcome = 'lease_expired'") == 30


RECONCILE_PROCESS = """
import asyncio, json, os, sys, time
from datetime import datetime
from effectgate.ledger import db
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig

async def main(url, now, go, ready):
    conn = await db.connect(url)
    async with conn:
        open(ready, "w").close()
        while not os.path.exists(go):
            await asyncio.sleep(0.002)
        reconciler = Reconciler(ReconcilerConfig(batch=4))
        repaired, owned = [], 0
        for _ in range(500):
            result = await reconciler.run_once(conn, now=datetime.fromisoformat(now))
            repaired += result.redriven
            owned += result.owned
            if result.owned and not result.redriven:
                break
        print(json.dumps({"repaired": repaired, "owned": owned}))

asyncio.run(main(*sys.argv[1:]))
"""


async def test_reconcilers_in_two_processes_at_once_repair_each_job_once(db_url: str, tmp_path: Path) -> None:
    async with connected(db_url) as conn:
        ids = [await claim(conn, now=at(0)) for _ in range(40)]
        await jobs.fetch_and_lease(conn, owner="gone", kinds={"k": 10}, limit=40, now=at(0))
        go = tmp_path / "go"
        ready = [tmp_path / f"ready-{i}" for i in range(2)]
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                RECONCILE_PROCESS,
                db_url,
                at(60).isoformat(),
                str(go),
                str(flag),
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for flag in ready
        ]

        async def both_at_the_start_line() -> bool:
            return all(flag.exists() for flag in ready) or any(p.returncode is not None for p in procs)

        await wait_for(both_at_the_start_line, 60, "both processes to connect")
        go.touch()
        outputs = [await asyncio.wait_for(p.communicate(), 60) for p in procs]
        for p, (_, err) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, err.decode()
        reports = [json.loads(out) for out, _ in outputs]
        repaired = [job_id for r in reports for job_id in r["repaired"]]
        assert sorted(repaired) == sorted(ids)
        assert await scalar(conn, "SELECT count(*) FROM jobs WHERE state = 'pending'") == 40


async def test_a_job_pending_too_long_is_woken_once_per_pending_ttl(db_url: str) -> None:
    async with connected(db_url) as conn, connected(db_url) as listener:
        await claim(conn, kind="slow", now=at(0))
        await claim(conn, kind="k", now=at(0))
        await jobs.listen(listener)
        reconciler = Reconciler(ReconcilerConfig(pending_ttl=900), kinds={"slow": KindPolicy(pending_ttl=60)})
        assert (await reconciler.run_once(conn, now=at(59))).woken == 0
        result = await reconciler.run_once(conn, now=at(61))
        assert result.woken == 1
        notes = [n async for n in listener.notifies(timeout=2.0, stop_after=1)]
        assert [n.payload for n in notes] == ["slow"]
        # Woken once: the next tick leaves it alone, a pending_ttl later it is woken again.
        assert (await reconciler.run_once(conn, now=at(62))).woken == 0
        assert (await reconciler.run_once(conn, now=at(122))).woken == 1
        # The kind on the reconciler's default TTL waits its 900 s (and "slow" is due again by then).
        assert (await reconciler.run_once(conn, now=at(899))).woken == 1
        assert (await reconciler.run_once(conn, now=at(901))).woken == 1
        assert (await reconciler.run_once(conn, now=at(902))).woken == 0


async def test_sweeps_run_after_the_job_repairs_have_committed(db_url: str) -> None:
    seen: list[str] = []

    async def sweep(_conn: db.Conn) -> int:
        # Another connection sees the repair: it committed before any sweep started.
        async with connected(db_url) as other:
            seen.append((await job(other, job_id))["state"])
        return 1

    async with connected(db_url) as conn:
        job_id = await claim(conn, now=at(0))
        await orphan(conn, job_id, at_s=0)
        result = await Reconciler(sweeps={"check": sweep}).run_once(conn, now=at(50))
    assert (result.redriven, result.sweep_acted, seen) == ([job_id], {"check": 1}, ["pending"])


async def test_a_throwing_sweep_is_one_error_and_stops_nothing_else(conn: db.Conn) -> None:
    await conn.execute("CREATE TABLE user_rows (note text)")
    job_id = await claim(conn, orphan_policy="park", now=at(0))
    await orphan(conn, job_id, at_s=0)

    async def broken(c: db.Conn) -> int:
        await c.execute("INSERT INTO user_rows VALUES ('half done')")
        raise RuntimeError("sweep bug")

    async def healthy(c: db.Conn) -> int:
        await c.execute("INSERT INTO user_rows VALUES ('repaired')")
        return 1

    result = await Reconciler(sweeps={"broken": broken, "healthy": healthy}).run_once(conn, now=at(50))
    assert result.parked == [job_id]
    assert result.sweep_errors == {"broken": "RuntimeError: sweep bug"}
    assert (result.sweep_acted, result.errors) == ({"healthy": 1}, 1)
    rows = await (await conn.execute("SELECT note FROM user_rows")).fetchall()
    assert [r["note"] for r in rows] == ["repaired"]


async def test_a_sweep_another_process_is_running_is_skipped(db_url: str) -> None:
    calls: list[str] = []

    async def sweep(_conn: db.Conn) -> int:
        calls.append("ran")
        return 0

    async with connected(db_url) as conn, connected(db_url) as other:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(%s)", (sweep_lock_id("busy"),))
            result = await Reconciler(sweeps={"busy": sweep}).run_once(conn)
        assert (result.sweeps_skipped, calls) == (["busy"], [])
        assert (await Reconciler(sweeps={"busy": sweep}).run_once(conn)).sweep_acted == {"busy": 0}


async def test_the_transition_hook_commits_with_the_reconcilers_terminal_transition(conn: db.Conn) -> None:
    await conn.execute("CREATE TABLE mirror (job_id bigint, state text, reason text)")
    parked = await claim(conn, orphan_policy="park", now=at(0))
    requeued = await claim(conn, orphan_policy="redrive", now=at(0))
    await jobs.fetch_and_lease(conn, owner="gone", kinds={"k": 10}, limit=5, now=at(0))
    seen: list[Repaired] = []

    async def hook(c: db.Conn, repaired: Repaired) -> None:
        seen.append(repaired)
        await c.execute(
            "INSERT INTO mirror VALUES (%s, %s, %s)", (repaired.job_id, repaired.state, repaired.reason)
        )

    result = await Reconciler(on_transition=hook).run_once(conn, now=at(50))
    assert (result.parked, result.redriven) == ([parked], [requeued])
    # Only terminal transitions are mirrored; a re-queue is not one.
    assert [(r.job_id, r.state) for r in seen] == [(parked, "parked")]
    rows = await (await conn.execute("SELECT * FROM mirror")).fetchall()
    assert rows == [
        {"job_id": parked, "state": "parked", "reason": "orphaned: lease expired and orphan_policy is park"}
    ]


async def test_a_failing_transition_hook_still_ends_the_job_and_is_reported(conn: db.Conn) -> None:
    await conn.execute("CREATE TABLE mirror (job_id bigint)")
    job_id = await claim(conn, orphan_policy="park", now=at(0))
    await orphan(conn, job_id, at_s=0)

    async def hook(c: db.Conn, repaired: Repaired) -> None:
        await c.execute("INSERT INTO mirror VALUES (%s)", (repaired.job_id,))
        raise RuntimeError("mirror table is read-only")

    result = await Reconciler(on_transition=hook).run_once(conn, now=at(50))
    # Never stuck running because of a hook; the hook's half-write is rolled back with it.
    assert result.parked == [job_id]
    assert result.hook_errors == {job_id: "RuntimeError: mirror table is read-only"}
    assert (await job(conn, job_id))["state"] == "parked"
    assert await scalar(conn, "SELECT count(*) FROM mirror") == 0


def test_reconciler_settings_are_validated() -> None:
    for bad in (
        {"tick": 0},
        {"pending_ttl": -1},
        {"poison_threshold": 0},
        {"batch": 0},
        {"tick": float("nan")},
    ):
        with pytest.raises(ValueError):
            ReconcilerConfig(**bad)
