"""A worker process SIGKILLed mid-slice loses nothing: the lease expires, the reconciler redrives the job,
and the next worker resumes from the last committed checkpoint — the work before it is not redone."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from effectgate.ledger import jobs
from effectgate.ledger.maintenance.scheduler import Reconciler
from tests.e2e import crash_worker
from tests.integration.jobs_and_workers import claim, connected, job, later

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


async def start(db_url: str, progress: Path, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.e2e.crash_worker",
        db_url,
        str(progress),
        mode,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def test_a_worker_killed_mid_slice_resumes_from_its_checkpoint_elsewhere(
    db_url: str, tmp_path: Path
) -> None:
    progress = tmp_path / "progress.txt"
    marker = tmp_path / crash_worker.MARKER
    async with connected(db_url) as conn:
        job_id = await claim(conn, kind=crash_worker.KIND, orphan_policy="redrive")
        first = await start(db_url, progress, "crash")
        try:
            async with asyncio.timeout(30):
                while not marker.exists():
                    if first.returncode is not None:
                        pytest.fail(f"the worker exited early: {(await first.communicate())[0].decode()}")
                    await asyncio.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert first.returncode == -signal.SIGKILL
        row = await job(conn, job_id)
        assert (row["state"], row["checkpoint"]) == ("running", {"done": crash_worker.CRASH_AFTER})

        # Nobody released the lease; once its TTL has passed the reconciler redrives the job.
        assert (await Reconciler().run_once(conn, now=later(crash_worker.LEASE_TTL * 3))).redriven == [job_id]
        second = await start(db_url, progress, "resume")
        output, _ = await asyncio.wait_for(second.communicate(), 30)
        assert second.returncode == 0, output.decode()

        row = await job(conn, job_id)
        assert (row["state"], row["checkpoint"]) == ("succeeded", {"done": crash_worker.ITEMS})
        attempts = await jobs.attempts(conn, job_id)
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "lease_expired"), (2, "succeeded")]
        assert attempts[0]["lease_token"] != attempts[1]["lease_token"]
    # Every item done exactly once: the second run began at the checkpoint, not at the start.
    done = progress.read_text().split()
    assert done == [str(n) for n in range(crash_worker.ITEMS)]
