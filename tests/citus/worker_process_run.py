"""A real ``effectgate worker`` process on the cluster: claims in several tenants, run to the end, then stopped.

    CITUS_URL=... python -m tests.citus.worker_process_run [--tenants 5]

A fresh schema is migrated and distributed, a project with one effect kind (one recorded step) is written to a
temporary folder, and ``effectgate worker --no-migrate`` is started on it with ``DATABASE_URL`` the coordinator.
One delivery per tenant is claimed through ``ledger.claims``; the run waits for every job to succeed, prints
the jobs' states and step counts, waits for ``--passes`` retention passes of the worker's reconciler (it ticks
each second), stops it with SIGTERM, and drops the schema. Exits 1 unless every job succeeded with its step recorded
once, the worker logged no error (a failed maintenance pass is one) and exited 0. Not part of `make citus-check`: a process
start costs seconds the in-process test (test_worker_on_citus.py) does not need.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint

from .ledger import distributed_ledger

HANDLERS = """\
from effectgate import effect


@effect(source="stripe", events=["charge.succeeded"], name="proc.citus", orphan_policy="redrive")
async def ship(ctx, ev):
    await ctx.step("label", _label)


async def _label(key):
    return {"label": key}
"""
CONFIG = """\
[database]
schema = "{schema}"

[handlers]
modules = ["proc_effects"]

[sources.stripe]
scheme = "stripe"
secrets = ["STARTUP_SECRET"]

[worker]
poll_interval = 0.2

[reconciler]
# Every service runs on the cluster (the rescuer, waker and retention go tenant by tenant): a short tick, so a run
# of a few seconds sees several passes, and the log says whether any of them failed.
tick = 1
"""


async def claim_and_wait(url: str, schema: str, tenants: int) -> list[tuple[str, int]]:
    conn = await db.connect(url, schema=schema)
    async with conn:
        ids = []
        for t in range(tenants):
            key, payload = f"proc-{t}", {"key": f"proc-{t}"}
            arrived = Delivery(
                f"r-{key}",
                f"tenant-{t}",
                "stripe",
                f"e-{key}",
                "charge.succeeded",
                payload,
                fingerprint(payload),
            )
            [outcome] = await claim_delivery(conn, arrived, [EffectRequest(key, "proc.citus", 5, "redrive")])
            assert isinstance(outcome, Accepted), outcome
            ids.append(outcome.job_id)
        started = time.monotonic()
        while True:
            rows = await (
                await conn.execute(
                    "SELECT j.state::text AS state, (SELECT count(*) FROM steps s"
                    " WHERE s.effect_id = j.effect_id AND s.tenant = j.tenant) AS steps FROM jobs j WHERE j.id = ANY(%s)",
                    (ids,),
                )
            ).fetchall()
            if all(r["state"] == "succeeded" for r in rows) or time.monotonic() - started > 90:
                print(f"after {time.monotonic() - started:.1f} s")
                return sorted((r["state"], r["steps"]) for r in rows)
            await asyncio.sleep(0.5)


async def retention_passes(url: str, schema: str, wanted: int, *, deadline: float) -> int:
    """How many retention passes ran (distinct ``retention_purges.last_run_at``), polled until ``wanted`` or the
    deadline."""
    conn = await db.connect(url, schema=schema)
    seen: set[object] = set()
    async with conn:
        started = time.monotonic()
        while len(seen) < wanted and time.monotonic() - started < deadline:
            row = await (await conn.execute("SELECT max(last_run_at) AS at FROM retention_purges")).fetchone()
            if row is not None and row["at"] is not None:
                seen.add(row["at"])
            await asyncio.sleep(0.2)
    return len(seen)


def _is_error(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return bool(line.strip())
    return not isinstance(record, dict) or record.get("level") in ("error", "critical")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument(
        "--passes",
        type=int,
        default=3,
        help="retention passes the worker's reconciler runs after the jobs finish",
    )
    args = parser.parse_args()
    url = os.environ["CITUS_URL"]
    schema = f"effectgate_citus_proc_{uuid.uuid4().hex[:8]}"
    asyncio.run(distributed_ledger(url, schema))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            project = Path(tmp)
            (project / "proc_effects.py").write_text(HANDLERS)
            (project / "effectgate.toml").write_text(CONFIG.format(schema=schema))
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env |= {"DATABASE_URL": url, "STARTUP_SECRET": "s" * 32, "EFFECTGATE_LOG_LEVEL": "INFO"}
            command = [
                sys.executable,
                "-m",
                "effectgate.gateway.cli",
                "worker",
                "--config",
                "effectgate.toml",
            ]
            with (project / "worker.log").open("wb") as log:
                worker = subprocess.Popen(
                    [*command, "--no-migrate"],
                    cwd=project,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                try:
                    jobs = asyncio.run(claim_and_wait(url, schema, args.tenants))
                    # A few reconciler passes (tick = 1) over the finished jobs: each retention pass stamps
                    # retention_purges.last_run_at; a failing pass stamps nothing and the wait runs out.
                    passes = asyncio.run(retention_passes(url, schema, args.passes, deadline=20.0))
                    print("retention passes seen:", passes)
                finally:
                    worker.send_signal(signal.SIGTERM)
                    code = worker.wait(30)
            print("jobs (state, steps):", jobs)
            print("worker exit code:", code)
            # JSON lines (gateway/logs.py), levels in lower case; a line that is not JSON (a traceback) counts too.
            errors = [line for line in (project / "worker.log").read_text().splitlines() if _is_error(line)]
            print("worker log errors:", len(errors), *errors[:3], sep="\n")
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]
    ok = code == 0 and jobs == [("succeeded", 1)] * args.tenants and not errors and passes >= args.passes
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
