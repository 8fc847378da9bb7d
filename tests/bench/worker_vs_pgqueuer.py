"""Benchmark: a real ``effectgate worker`` and PgQueuer drain the same backlog, each timed by its completion.

    python -m tests.bench.worker_vs_pgqueuer [--jobs 100000] [--rounds 3] [--concurrency 16[,64...]]
                                             [--handler-connections N] [--steps MS] [--no-analyze]
                                             [--live CONNECTIONS]

Each round, on a fresh database each, effectgate then PgQueuer (issue 40, "a comparison that times both
queues the same way"):

- **effectgate**: ``--jobs`` jobs of a paused kind claimed through the gateway's own claim statement
  (``claim_deliveries``, 1,000 deliveries a transaction; each delivery's payload about 2 KB of JSON, as a
  Stripe event is), then a real ``effectgate worker`` process at its defaults (``--concurrency`` when given;
  no other flag, its reconciler, logging and metrics as shipped) started idle, then the kind resumed. The
  drain is the time from the resume's commit to the first poll that sees no job of the kind pending or
  running; the poll (one ``count(*)`` on its own connection every 0.5 s, a few ms each) is the only other
  load. The worker reads no clock of ours: it cannot report its own last job.
- **PgQueuer**: the same number of jobs with the same payload bytes, its consumer with its defaults in this
  process (``QueueManager.run()``: batch size 10, no concurrency limit), timed from the start of ``run`` to
  the start of its last handler, counted by the handler itself: its own completion, with no poll of its
  table during the drain.

``--handler-connections`` sets ``[worker] handler_connections`` (the connections the running jobs share). With
``--steps MS`` each effectgate job records two steps around a downstream call of MS ms each (a payment's
shape; PgQueuer's jobs stay no-ops, so its figure and the ratio are then printed for scale only).

With ``--no-analyze`` the backlog is drained as built; by default both tables are ``VACUUM ANALYZE``d first,
the state autovacuum leaves a backlog in when it built up over an outage longer than a minute.

``--live N``: each drain, both queues', runs beside live ingress, as ``make bench-backlog``'s do: a real
``effectgate serve --workers 2`` on the drain's own database, wrk sending it signed 2 KB deliveries on N
connections (re-signed every 4 minutes) into a paused kind, started before the clock and stopped after the
drain; its req/s, p99 and errors are printed beside each rate. The timing of each side is unchanged (PgQueuer
by its own last handler, not by polling its table). Without it, no live ingress. Prints every round and the
median and range of each figure and of the ratio; asserts nothing. Run it on a quiet machine (load under 1.5,
nothing else running): the ratio is the figure, and only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from . import backlog
from . import wrk as load
from .common import drop_database, fresh_database, server_url
from .drain_cost import Cost, Meter
from .ingress import free_port
from .ingress_cost import summarise
from .pgqueuer_drain import drain as pgqueuer_drain

POLL_SECONDS = 0.5
# The worker's connections to the ledger at a poll (every backend of the database but the two polls'):
# the most seen during a drain is printed beside its rate, against the pool's bound (worker_pool_max).
WORKER_CONNECTIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
    f" AND application_name <> '{backlog.BENCH_APPLICATION}'"
)
# The payload claim_directly stores for each delivery, as PgQueuer's job payload: the same bytes each side.
PAYLOAD = json.dumps(
    {"id": "evt_direct_00000000_0", "type": "bench.event", "data": {"object": {"n": 0, "pad": "x" * 1900}}}
).encode()


def _analyze(url: str, enabled: bool) -> None:
    if enabled:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")


def _worker_env(url: str, steps_ms: float) -> dict[str, str]:
    # The worker's own defaults: no log level or other setting of ours but the database and the secret.
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("EFFECTGATE_", "BENCH_"))},
        "DATABASE_URL": url,
        "BENCH_SECRET": "unused-by-the-worker",
        "BENCH_STEPS_MS": str(steps_ms),
        "PYTHONPATH": str(backlog.ROOT),
    }


def _wait_listening(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode} before it listened")
        if backlog.count(url, backlog.LISTENING) >= 1:
            return
        time.sleep(0.1)
    raise RuntimeError("the worker did not LISTEN within 30 s")


@dataclass(frozen=True)
class Live:
    """Live ingress beside a drain: wrk's ``connections`` (0: none); ``result`` once it stopped."""

    connections: int = 0
    tmp: Path | None = None
    result: list[load.WrkResult] | None = None

    def line(self) -> str:
        if not self.result:
            return ""
        r = self.result[0]
        return f", live {r.rate:,.0f} req/s p99 {r.p99_ms:.1f} ms {r.errors} errors"


@contextmanager
def live_ingress(url: str, live: Live) -> Iterator[Live]:
    """``live.connections`` of wrk against a real gateway on ``url`` for the block (module docstring)."""
    if not live.connections:
        yield live
        return
    wrk = shutil.which("wrk")
    if wrk is None or live.tmp is None:
        raise SystemExit("--live needs wrk on PATH (apt-get install wrk)")
    config = live.tmp / "live.toml"
    config.write_text(backlog.CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    gateway = backlog.serve(config, port, url)
    running: backlog.LiveLoad | None = None
    done = Live(live.connections, live.tmp, [])
    try:
        backlog.wait_until_up(base)
        backlog.pause(url, backlog.LIVE_KIND)
        running = backlog.LiveLoad(wrk, base, live.tmp, live.connections, backlog.LIVE_POOL)
        time.sleep(1)  # wrk's connections up before the clock starts
        yield done
        assert done.result is not None
        done.result.append(running.stop())
        running = None
    finally:
        if running is not None:
            running.stop()
        gateway.terminate()
        try:
            gateway.wait(30)
        except subprocess.TimeoutExpired:
            gateway.kill()


@dataclass(frozen=True)
class Round:
    rate: float
    peak_connections: int
    live: str = ""
    cost: Cost | None = None


@dataclass(frozen=True)
class Costs:
    """``--cost``: each drain's CPU, transactions and statements per job; ``spy``: a py-spy profile of each
    effectgate worker's drain is written into this folder (``--py-spy``), one file a drain."""

    enabled: bool = False
    spy: Path | None = None

    def meter(self, url: str, consumer: int | None, name: str) -> Meter | None:
        if not self.enabled:
            return None
        spy = None if self.spy is None or consumer is None else self.spy / f"{name}.txt"
        return Meter(url, consumer, spy)


@dataclass(frozen=True)
class Shape:
    """What the effectgate side runs beyond its defaults: ``--handler-connections`` and ``--steps``."""

    handler_connections: int | None = None
    steps_ms: float = 0.0


def effectgate_round(
    server: str,
    jobs: int,
    concurrency: int | None,
    analyze: bool,
    tmp: Path,
    shape: Shape = Shape(),
    live: Live = Live(),
    costs: Costs = Costs(),
    name: str = "effectgate",
) -> Round:
    url = fresh_database(server)
    try:
        backlog.pause(url, backlog.KIND)
        asyncio.run(backlog.claim_directly(url, jobs))
        _analyze(url, analyze)
        config = tmp / "worker.toml"
        worker_table = (
            ""
            if shape.handler_connections is None
            else f"[worker]\nhandler_connections = {shape.handler_connections}\n"
        )
        config.write_text(backlog.CONFIG + worker_table)
        command = [sys.executable, "-m", "effectgate.gateway.cli", "worker", "--config", str(config)]
        command += ["--no-migrate"] + ([] if concurrency is None else ["--concurrency", str(concurrency)])
        with (tmp / "worker.log").open("ab") as log:
            proc = subprocess.Popen(
                command, cwd=backlog.ROOT, env=_worker_env(url, shape.steps_ms), stdout=log, stderr=log
            )
        try:
            _wait_listening(url, proc)
            poll = backlog.Poll(url, backlog.PENDING, (backlog.KIND,))
            connections = backlog.Poll(url, WORKER_CONNECTIONS)
            peak = 0
            meter = costs.meter(url, proc.pid, name)
            with live_ingress(url, live) as beside:
                if meter is not None:
                    meter.start()
                started = backlog.resume(url, backlog.KIND)
                while True:
                    time.sleep(POLL_SECONDS)
                    asked = time.monotonic()
                    peak = max(peak, connections())
                    if poll() == 0:
                        break
                    if asked - started > 1800:
                        raise RuntimeError("the drain did not finish within 30 minutes")
                cost = None if meter is None else meter.stop(jobs)
            # The gateway's own connections are counted too while live ingress runs.
            return Round(jobs / (asked - started), peak, beside.line(), cost)
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        drop_database(server, url)


def pgqueuer_round(
    server: str, jobs: int, analyze: bool, live: Live = Live(), costs: Costs = Costs()
) -> tuple[float | None, str, Cost | None]:
    url = fresh_database(server)
    meter = costs.meter(url, None, "pgqueuer")

    cost: list[Cost] = []

    def before() -> None:
        _analyze(url, analyze)
        if meter is not None:
            meter.start()

    def after() -> None:
        if meter is not None:
            cost.append(meter.stop(jobs))

    try:
        with live_ingress(url, live) as beside:
            rate = asyncio.run(pgqueuer_drain(url, jobs, payload=PAYLOAD, before=before, after=after))
        return rate, beside.line(), cost[0] if cost else None
    finally:
        drop_database(server, url)


def _summary(label: str, values: list[float]) -> str:
    return (
        f"{label}: median {statistics.median(values):,.2f} (range {min(values):,.2f}-{max(values):,.2f}, "
        f"{len(values)} rounds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency", default="", help="comma-separated worker concurrencies (default: the worker's own)"
    )
    parser.add_argument(
        "--handler-connections", type=int, help="[worker] handler_connections (default: its own)"
    )
    parser.add_argument(
        "--steps", type=float, default=0.0, metavar="MS", help="two recorded steps of MS ms a job"
    )
    parser.add_argument("--no-analyze", action="store_true", help="drain the backlogs as built")
    parser.add_argument(
        "--live", type=int, default=0, metavar="CONNECTIONS", help="live ingress beside each drain (wrk)"
    )
    parser.add_argument(
        "--cost", action="store_true", help="CPU, transactions and statements per job of each drain"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="with --cost: record each worker's drain with py-spy into DIR",
    )
    args = parser.parse_args()
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    costs = Costs(args.cost or args.py_spy is not None, args.py_spy)
    shape = Shape(args.handler_connections, args.steps)
    concurrencies: list[int | None] = [int(c) for c in args.concurrency.split(",") if c] or [None]
    server = server_url()
    print(
        f"== worker vs PgQueuer: {args.jobs} jobs, 2 KB payloads, {args.rounds} rounds, "
        f"{'as built' if args.no_analyze else 'analyzed'}; {shape}; live ingress on {args.live} connections; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        live = Live(args.live, Path(tmp_name))
        for n in range(args.rounds):
            pgq, pgq_live, pgq_cost = pgqueuer_round(server, args.jobs, not args.no_analyze, live, costs)
            if pgq is None:
                print("PgQueuer is not installed (pip install -e '.[bench]'): no comparison")
                return
            rates.setdefault("PgQueuer", []).append(pgq)
            line = f"round {n + 1}: PgQueuer {pgq:,.0f} jobs/s{pgq_live}"
            drained: list[tuple[str, Cost]] = []
            for c in concurrencies:
                label = f"effectgate worker, concurrency {c or 'default'}"
                done = effectgate_round(
                    server,
                    args.jobs,
                    c,
                    not args.no_analyze,
                    Path(tmp_name),
                    shape,
                    live,
                    costs,
                    name=f"effectgate-{c or 'default'}-round{n + 1}",
                )
                rates.setdefault(label, []).append(done.rate)
                if done.cost is not None:
                    drained.append((label, done.cost))
                ratios.setdefault(label, []).append(done.rate / pgq)
                line += (
                    f"; {label} {done.rate:,.0f} ({done.rate / pgq:.2f}x, "
                    f"at most {done.peak_connections} connections{done.live})"
                )
            print(f"{line}; load average {os.getloadavg()[0]:.2f}", flush=True)
            if pgq_cost is not None:
                print("\n".join([f"  PgQueuer, {pgq_cost.line()}", *pgq_cost.breakdown()]))
            for label, cost in drained:
                print("\n".join([f"  {label}, {cost.line()}", *cost.breakdown()]), flush=True)
    for label, values in rates.items():
        print(_summary(f"{label}, jobs/s", values))
    for label, values in ratios.items():
        print(_summary(f"{label} / PgQueuer", values))
    if args.py_spy is not None:
        for profile in sorted(args.py_spy.glob("effectgate-*.txt")):
            print(f"== {profile.name}")
            print("\n".join(summarise([profile], top=24)))


if __name__ == "__main__":
    main()
