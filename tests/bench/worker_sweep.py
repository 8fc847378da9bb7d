"""Benchmark: one worker process's drain rate against a backlog, by concurrency, handler delay and log level:
the measurement behind the worker's defaults (docs/performance.md).

    python -m tests.bench.worker_sweep [--backlog 20000] [--concurrency 4,16,32,64] [--delay 0,0.02,0.05]
                                       [--window 6] [--log-level INFO,per-job] [--poll-interval 2,0.2]

For each combination: the backlog is written straight into the ledger (effects and pending jobs, INSERT …
SELECT), then one worker process (the production ``Worker.run`` loop, its pool sized as ``effectgate worker``
sizes it, JSON logs to a real file as in production) drains it; ``--log-level per-job`` is INFO plus the
line per succeeded job (``worker.finished``, DEBUG by default), to price it. The rate is read from the database: jobs
succeeded during a ``--window``-second window that starts after a one-second warm-up, and the worker
process's own CPU time per job in that window (from /proc: on a shared machine it varies less than the rate). The handler awaits
``asyncio.sleep(delay)``, a stand-in for a payment or shipping API call. Prints one line per combination;
asserts nothing about speed. Figures depend on the machine: compare the lines of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from effectgate.handlers.event import Event
from effectgate.handlers.registry import EffectKind, Registry
from effectgate.handlers.worker.config import DEFAULT_POLL_INTERVAL, worker_connections
from effectgate.handlers.worker.runtime import Worker, WorkerConfig
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger

from .common import drop_database, fresh_database, server_url

KIND = "bench.sleep"
# --log-level value: INFO plus the worker's DEBUG line per succeeded job, written to a real file.
PER_JOB = "per-job"

BACKLOG = """
WITH e AS (
    INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint, payload,
                         first_seen_at, last_seen_at)
    SELECT 'default', 'sweep:' || %(round)s || ':' || g, 'bench', %(kind)s, 'evt_' || g, 'noop', md5(g::text),
           jsonb_build_object('id', g), now(), now()
    FROM generate_series(1, %(n)s) g
    RETURNING id
)
INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, run_at, created_at, updated_at)
SELECT id, 'default', %(kind)s, 3, 'redrive', now(), now(), now() FROM e
"""


def child(url: str, concurrency: int, delay: float, log_level: str, log_path: str, poll: float) -> None:
    """The worker process: the production loop with a handler that waits ``delay`` seconds."""
    from effectgate.gateway import logs

    sys.stderr = open(log_path, "a", buffering=1)  # the process's stderr for its lifetime
    if log_level == PER_JOB:
        # INFO, and the one line per succeeded job that is DEBUG since it was measured (worker.finished).
        logs.configure("INFO")
        logging.getLogger("effectgate.worker").setLevel(logging.DEBUG)
    else:
        logs.configure(log_level)

    async def handler(ctx: Any, ev: Event) -> None:
        if delay:
            await asyncio.sleep(delay)

    async def run() -> None:
        registry = Registry()
        registry.register(EffectKind(name=KIND, source="bench", events=("*",), fn=handler))
        config = WorkerConfig(concurrency=concurrency, run_reconciler=False, poll_interval=poll)
        own, handlers = worker_connections(config)
        pool = db.make_pool(url, max_size=own, name="effectgate-worker")
        handler_pool = db.make_pool(url, max_size=handlers, name="effectgate-worker-handlers")
        await pool.open(wait=True)
        await handler_pool.open(wait=True)
        worker = Worker(Ledger(pool, handler_pool=handler_pool), registry, url=url, config=config)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()
        await handler_pool.close()
        await pool.close()

    asyncio.run(run())


def count_lines(path: str) -> int:
    """Lines the worker logged (then the file is removed): shows a per-job run logged per job."""
    try:
        with open(path, "rb") as logged:
            return sum(1 for _ in logged)
    except FileNotFoundError:
        return 0
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc): robust to a loaded machine."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def backends(conn: db.Conn) -> int:
    """Connections to this database other than this one: the worker's pool and its LISTEN connection."""
    row = await (
        await conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    ).fetchone()
    assert row is not None
    return int(row["n"])


async def succeeded(conn: db.Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM jobs WHERE state = 'succeeded'")).fetchone()
    assert row is not None
    return int(row["n"])


async def measure(
    url: str,
    round_: int,
    backlog: int,
    concurrency: int,
    delay: float,
    log_level: str,
    window: float,
    poll: float,
) -> tuple[float, float, int, int, int]:
    conn = await db.connect(url)
    async with conn:
        await conn.execute("DELETE FROM job_attempts")
        await conn.execute("DELETE FROM jobs")
        await conn.execute("DELETE FROM effects")
        await conn.execute(BACKLOG, {"n": backlog, "kind": KIND, "round": round_})  # type: ignore[arg-type]
        await conn.execute("VACUUM ANALYZE jobs")
        # A real file, as production's stderr is a real pipe or file: the write is part of a line's cost.
        log_path = os.path.join(tempfile.gettempdir(), f"worker_sweep_{os.getpid()}.log")
        proc = subprocess.Popen(  # noqa: ASYNC220 - starting it takes no time worth a thread
            [
                sys.executable,
                "-m",
                "tests.bench.worker_sweep",
                "--child",
                url,
                str(concurrency),
                str(delay),
                log_level,
                log_path,
                str(poll),
            ]
        )
        try:
            await asyncio.sleep(1.0)  # start, LISTEN, first fetches
            before, started, cpu_before = await succeeded(conn), time.monotonic(), cpu_seconds(proc.pid)
            peak, until = 0, time.monotonic() + window
            while time.monotonic() < until:
                peak = max(peak, await backends(conn))
                await asyncio.sleep(0.1)
            after, ended, cpu_after = await succeeded(conn), time.monotonic(), cpu_seconds(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            lines = count_lines(log_path)
        pending = await (
            await conn.execute("SELECT count(*) AS n FROM jobs WHERE state = 'pending'")
        ).fetchone()
        assert pending is not None
        done = max(after - before, 1)
        return (
            (after - before) / (ended - started),
            (cpu_after - cpu_before) / done,
            peak,
            int(pending["n"]),
            lines,
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, url, concurrency, delay, log_level, log_path, poll = sys.argv
        child(url, int(concurrency), float(delay), log_level, log_path, float(poll))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--concurrency", default="4,16,32,64")
    parser.add_argument("--delay", default="0,0.02,0.05")
    parser.add_argument(
        "--log-level",
        default="INFO",
        help=f"levels to run, comma-separated; {PER_JOB}: INFO + a line per job",
    )
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--poll-interval", default=str(DEFAULT_POLL_INTERVAL))
    args = parser.parse_args()
    server = server_url()
    url = fresh_database(server)
    try:
        round_ = 0
        for delay in (float(d) for d in args.delay.split(",")):
            for level in args.log_level.split(","):
                for poll, concurrency in (
                    (float(p), int(c))
                    for p in args.poll_interval.split(",")
                    for c in args.concurrency.split(",")
                ):
                    round_ += 1
                    rate, cpu, peak, left, lines = asyncio.run(
                        measure(url, round_, args.backlog, concurrency, delay, level, args.window, poll)
                    )
                    print(
                        f"delay {delay * 1000:3.0f} ms  log {level:<7}  poll {poll:4.1f} s  concurrency {concurrency:3d}: "
                        f"{rate:6.0f} jobs/s, worker CPU {cpu * 1e6:4.0f} µs/job, {peak:3d} connections at most, {lines:,} log lines  (backlog {args.backlog:,}, {left:,} still pending)",
                        flush=True,
                    )
    finally:
        drop_database(server, url)


if __name__ == "__main__":
    main()
