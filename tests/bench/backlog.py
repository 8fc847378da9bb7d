"""Benchmark: the day after an outage — a paused kind's backlog, resumed and drained, timed from the database.

    python -m tests.bench.backlog [--small 1000] [--small-runs 5] [--backlog 100000] [--delivered N]
                                  [--workers 1] [--live-connections 16] [--drain-timeout 1800]

For each backlog size (``--small`` first, ``--small-runs`` times, then ``--backlog``), on a fresh database and
a real ``effectgate serve --workers 2``:

1. ``effectgate jobs pause --kind bench.backlog`` (and ``bench.live``, see 4);
2. real Stripe-signed deliveries through the gateway (wrk, each delivery once) until ``--delivered`` jobs
   wait; past that (the 10^6 run) the rest are claimed directly through ``claim_deliveries`` — the
   gateway's own claim statement, 1,000 deliveries a transaction — because 2 KB deliveries through HTTP on
   2 cores would take an hour to build 10^6 and the drain, not the build, is the measurement;
3. ``--workers`` real ``effectgate worker`` processes at their defaults (no flags), started idle while the
   kind is paused, then ``effectgate jobs resume --kind bench.backlog``;
4. meanwhile wrk keeps sending new deliveries of source ``live`` to the gateway (``--live-connections``),
   and their kind stays paused: the ingress works under load, its jobs wait next to the backlog (paused
   rows the fetch must step over) and the drain counts only the backlog;
5. the drain is timed by polling ``jobs`` every 0.1 s until no ``bench.backlog`` job is pending or
   running: rate = jobs drained / seconds from the resume's commit to the poll that saw none.

A 10^3 drain takes about a second, too short a denominator for a ratio on a shared machine (one run's 10^3
rate ranged 939-1,615 jobs/s across runs), so the small backlog is built and drained ``--small-runs`` times and
its rate is all those jobs over all those seconds; each run's rate is printed too.

Then PgQueuer (the ``bench`` extra) at the ``--backlog`` size with its defaults, as many consumer processes
as ``--workers``, timed the same way (its queue table polled until empty), with the same live ingress load.
Prints each figure and the ratios; asserts nothing. The machine's load moves every figure: compare ratios
within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_deliveries
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.jobs import filters

from . import wrk as load
from .common import drop_database, fresh_database, server_url
from .ingress import free_port

ROOT = Path(__file__).resolve().parents[2]
KIND = "bench.backlog"
# Distinct live deliveries per drain (2 KB each, signed before the run; --live-pool). A drain that outlasts
# them replays the pool: the rest of the live load is duplicates (200), the ledger's counts say how many.
LIVE_POOL = 30_000
RESIGN_EVERY = 240
LIVE_KIND = "bench.live"
CONFIG = """[handlers]
modules = ["tests.bench.backlog_handlers"]
[gateway]
pool_max = 20
[sources.backlog]
scheme = "stripe"
secrets = ["BENCH_SECRET"]
[sources.live]
scheme = "stripe"
secrets = ["BENCH_SECRET"]
"""


@dataclass(frozen=True)
class Drain:
    """One timed drain: how many, how long, the rate at its start and end, and the ingress meanwhile."""

    jobs: int
    seconds: float
    first_quarter_rate: float
    last_quarter_rate: float
    left: int
    live: load.WrkResult | None
    live_ledger: str = ""

    @property
    def rate(self) -> float:
        return (self.jobs - self.left) / self.seconds if self.seconds > 0 else float("nan")

    def line(self, what: str) -> str:
        text = (
            f"{what}: {self.jobs - self.left} jobs in {self.seconds:.1f} s = {self.rate:.0f} jobs/s "
            f"(first quarter {self.first_quarter_rate:.0f}/s, last quarter {self.last_quarter_rate:.0f}/s)"
        )
        if self.left:
            text += f"; TIMED OUT with {self.left} still pending or running"
        if self.live is not None:
            text += f"\n    live ingress meanwhile: {self.live.line()}; ledger {self.live_ledger}"
        return text


class LiveLoad:
    """Live deliveries to ``/webhooks/live`` until stopped, re-signed every 4 minutes.

    Stripe refuses a signature older than 300 s, so one pool signed before a half-hour drain would turn the
    live load into a flood of 401s. Every 240 s the same deliveries are signed afresh and wrk restarted (a
    gap of about a second). The figures are over all segments: answers and errors summed, the p99 the
    worst segment's.
    """

    def __init__(self, wrk: str, base: str, tmp: Path, connections: int, pool_size: int) -> None:
        self.wrk, self.base, self.tmp, self.connections, self.pool_size = (
            wrk,
            base,
            tmp,
            connections,
            pool_size,
        )
        self.run = uuid.uuid4().hex[:8]
        self.script = load.script(tmp, "pool.lua", load.POOL_LUA)
        self.results: list[load.WrkResult] = []
        self.stopping = threading.Event()
        self.current: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.pool = load.write_pool(tmp / "live.tsv", pool_size, self.run)
        self.thread = threading.Thread(target=self._loop)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            with self.lock:
                # Checked under the lock stop() takes: no segment starts after stop() looked.
                if self.stopping.is_set():
                    return
                self.current = load.start(
                    self.wrk,
                    self.base,
                    self.script,
                    [str(self.pool), "/webhooks/live"],
                    connections=self.connections,
                    seconds=RESIGN_EVERY,
                )
            # The next segment's pool, signed 30 s before it starts: no signature is older than 270 s.
            if not self.stopping.wait(RESIGN_EVERY - 30):
                self.pool = load.write_pool(
                    self.tmp / f"live-{len(self.results) % 2}.tsv", self.pool_size, self.run
                )
            self.results.append(load.finish(self.current))

    def stop(self) -> load.WrkResult:
        self.stopping.set()
        with self.lock:
            if self.current is not None and self.current.poll() is None:
                self.current.send_signal(signal.SIGINT)
        self.thread.join()
        answered = sum(r.requests for r in self.results)
        return load.WrkResult(
            requests=answered,
            rate=answered / (time.monotonic() - self.started),
            p50_ms=max((r.p50_ms for r in self.results), default=float("nan")),
            p99_ms=max((r.p99_ms for r in self.results), default=float("nan")),
            non_2xx=sum(r.non_2xx for r in self.results),
            socket_errors=sum(r.socket_errors for r in self.results),
        )


def env(db_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db_url,
        "BENCH_SECRET": load.SECRET,
        "PYTHONPATH": str(ROOT),
        "EFFECTGATE_LOG_LEVEL": "WARNING",
    }


def effectgate(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=ROOT,
        env=env(db_url),
        capture_output=True,
        text=True,
        check=True,
    )


def serve(config: Path, port: int, db_url: str) -> subprocess.Popen[bytes]:
    """A real ``effectgate serve --workers 2`` on a loopback port."""
    command = ["serve", "--config", str(config), "--no-migrate", "--port", str(port), "--workers", "2"]
    return subprocess.Popen(
        [sys.executable, "-m", "effectgate.gateway.cli", *command], cwd=ROOT, env=env(db_url)
    )


def count(db_url: str, sql: str, params: tuple[object, ...] = ()) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    return int(row[0]) if row else 0


def wait_until_up(base: str) -> None:
    for _ in range(600):
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"the gateway at {base} did not come up")


def pause(db_url: str, kind: str) -> None:
    """The live kind paused by the call `effectgate jobs pause` makes (a CLI start-up less: it is not timed)."""

    async def run() -> None:
        conn = await db.connect(db_url)
        async with conn:
            await filters.pause(conn, kind, by="bench", reason="live traffic, not timed")

    asyncio.run(run())


def resume(db_url: str, kind: str) -> float:
    async def run() -> float:
        conn = await db.connect(db_url)
        async with conn:
            started = time.monotonic()
            await filters.resume(conn, kind, by="bench")
            return started

    return asyncio.run(run())


def time_drain(
    first: int,
    remaining: Callable[[], int],
    timeout: float,
    on_progress: Callable[[int], None],
    go: Callable[[], float],
) -> Drain:
    """``go()`` releases ``first`` jobs and returns the clock at the release; then poll ``remaining()`` until
    it is 0 (or ``timeout``): the drain, read from the database.

    The count is a scan of the backlog (~90 ms at 10^5 on a loaded machine), so the poll waits 19 times as
    long as the last one took, at least 0.1 s: polling takes at most 5 % of one Postgres backend, and the
    end is known to within 20 times one count (under 2 s at 10^5, a small part of the drain).
    """
    started = go()
    samples = [(0.0, first)]
    pause = 0.1
    while samples[-1][1] > 0 and samples[-1][0] < timeout:
        time.sleep(pause)
        asked = time.monotonic()
        # The poll's start, not its end, is when the count held.
        samples.append((asked - started, remaining()))
        pause = max(0.1, 19 * (time.monotonic() - asked))
        on_progress(samples[-1][1])
    elapsed, left = samples[-1]

    def rate_between(lo: float, hi: float) -> float:
        # The time the remaining count took to fall from ``lo`` to ``hi`` of the start's; nan if it did not.
        t_lo = next((t for t, n in samples if n <= first * lo), None)
        t_hi = next((t for t, n in samples if n <= first * hi), None)
        if t_lo is None or t_hi is None or t_hi <= t_lo:
            return float("nan")
        return first * (lo - hi) / (t_hi - t_lo)

    return Drain(first, elapsed, rate_between(1.0, 0.75), rate_between(0.25, 0.0), left, None)


class Progress:
    """One line per tenth of the drain, so a long run shows it is alive and how the rate moves."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.next = what, total, total * 0.9
        self.started = time.monotonic()

    def __call__(self, left: int) -> None:
        if self.total >= 10_000 and left <= self.next:
            print(f"    {self.what}: {left} left at {time.monotonic() - self.started:.0f} s", flush=True)
            self.next -= self.total * 0.1


async def claim_directly(db_url: str, n: int) -> None:
    """``n`` more backlog jobs through the gateway's own claim statement, 1,000 deliveries a transaction."""
    run = uuid.uuid4().hex[:8]
    conn = await db.connect(db_url)
    async with conn:
        for start in range(0, n, 1000):
            items = []
            for i in range(start, min(n, start + 1000)):
                event_id = f"evt_direct_{run}_{i}"
                payload = {
                    "id": event_id,
                    "type": "bench.event",
                    "data": {"object": {"n": i, "pad": "x" * 1900}},
                }
                delivery = Delivery(
                    event_id, "default", "backlog", event_id, "bench.event", payload, fingerprint(payload)
                )
                items.append((delivery, [EffectRequest(f"backlog:{event_id}:{KIND}", KIND, 5, "park")]))
            await claim_deliveries(conn, items)


# Idle consumers (effectgate's or PgQueuer's) hold a LISTEN connection each.
LISTENING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
)


def live_outcomes(db_url: str) -> str:
    """What the live deliveries became: new claims (accepted) and replays of the pool (duplicate)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT outcome, count(*) FROM deliveries WHERE source = 'live' GROUP BY 1"
        ).fetchall()
    return str(dict(rows))


def pending(db_url: str, kind: str) -> int:
    return count(db_url, PENDING, (kind,))


PENDING = "SELECT count(*) /* bench */ FROM jobs WHERE kind = %s AND state IN ('pending', 'running')"
# The application_name of the bench's own connections (its polls, tests/bench/drain_cost.py's meter), so that
# what it counts of a database's backends leaves them out.
BENCH_APPLICATION = "effectgate-bench"


class Poll:
    """One count, asked again and again on one connection (a connection per poll is a fork per poll)."""

    def __init__(self, db_url: str, sql: str, params: tuple[object, ...] = ()) -> None:
        self.conn = psycopg.connect(db_url, autocommit=True, application_name=BENCH_APPLICATION)
        self.sql, self.params = sql, params

    def __call__(self) -> int:
        row = self.conn.execute(self.sql, self.params).fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row else 0


def effectgate_drain(
    wrk: str,
    server: str,
    tmp: Path,
    size: int,
    delivered: int,
    workers: int,
    live_connections: int,
    timeout: float,
    live_pool_size: int = LIVE_POOL,
) -> Drain:
    db_url = fresh_database(server)
    config = tmp / "backlog.toml"
    config.write_text(CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    gateway = serve(config, port, db_url)
    procs: list[subprocess.Popen[str]] = []
    live: LiveLoad | None = None
    try:
        wait_until_up(base)
        effectgate(db_url, "jobs", "pause", "--kind", KIND, "--reason", "bench: the outage")
        pause(db_url, LIVE_KIND)
        script = load.script(tmp, "pool.lua", load.POOL_LUA)
        via_http = min(size, delivered)
        built = time.monotonic()
        if via_http:
            pool = load.write_pool(tmp / "backlog.tsv", via_http)
            # Each delivery once: wrk's thread stops itself when the pool is spent, and wrk itself is
            # stopped when the ledger holds them all (wrk's main thread would otherwise sleep out -d).
            sending = load.start(
                wrk,
                base,
                script,
                [str(pool), "/webhooks/backlog", "once"],
                connections=32,
                seconds=60 + via_http / 20,
            )
            while sending.poll() is None and pending(db_url, KIND) < via_http:
                time.sleep(0.5)
            sent = load.stop(sending)
            print(f"  {via_http} deliveries through serve --workers 2: {sent.line()}", flush=True)
        have = pending(db_url, KIND)
        if have < size:
            asyncio.run(claim_directly(db_url, size - have))
            print(
                f"  {size - have} more claimed directly (claim_deliveries, 1,000 a transaction)", flush=True
            )
        have = pending(db_url, KIND)
        print(f"  backlog built: {have} {KIND} jobs pending in {time.monotonic() - built:.0f} s", flush=True)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE jobs")
            conn.execute("CHECKPOINT")
        for _ in range(workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "effectgate.gateway.cli",
                        "worker",
                        "--config",
                        str(config),
                        "--no-migrate",
                    ],
                    cwd=ROOT,
                    env=env(db_url),
                    text=True,
                )
            )
        # Idle workers hold a LISTEN connection each: wait for them, so start-up is not timed.
        for _ in range(300):
            if count(db_url, LISTENING) >= workers:
                break
            time.sleep(0.1)
        live = LiveLoad(wrk, base, tmp, live_connections, live_pool_size)
        time.sleep(1)  # the live load running before the resume
        # The resume through the same call `effectgate jobs resume` makes, in this process: the clock
        # starts at its commit, not a Python start-up later (the CLI's exit would already be draining).
        poll = Poll(db_url, PENDING, (KIND,))
        drain = time_drain(
            have,
            poll,
            timeout,
            Progress(f"effectgate {size}", have),
            lambda: resume(db_url, KIND),
        )
        poll.conn.close()
        live_result = live.stop()
        return dataclasses.replace(drain, live=live_result, live_ledger=live_outcomes(db_url))
    finally:
        if live is not None and not live.stopping.is_set():
            live.stop()
        for proc in [*procs, gateway]:
            proc.terminate()
        for proc in [*procs, gateway]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        drop_database(server, db_url)


PGQUEUER_CONSUMER = """
import asyncio, sys
import psycopg
from pgqueuer.db import PsycopgDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(sys.argv[1], autocommit=True)
    manager = QueueManager(Queries(PsycopgDriver(conn)))

    @manager.entrypoint("noop")
    async def noop(job: object) -> None:
        return None

    await manager.run()

asyncio.run(main())
"""


def pgqueuer_drain(
    wrk: str,
    server: str,
    tmp: Path,
    size: int,
    workers: int,
    live_connections: int,
    timeout: float,
    live_pool_size: int = LIVE_POOL,
) -> Drain | None:
    """PgQueuer at its defaults (``QueueManager.run()``), its queue polled until empty; live load as above."""
    try:
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries
    except ImportError:
        return None
    db_url = fresh_database(server)
    config = tmp / "backlog.toml"
    config.write_text(CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    gateway = serve(config, port, db_url)
    procs: list[subprocess.Popen[str]] = []
    live: LiveLoad | None = None
    try:

        async def install() -> None:
            conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
            async with conn:
                await Queries(PsycopgDriver(conn)).install()

        async def fill() -> float:
            # The whole backlog in one transaction, committed with the consumers already listening: the
            # commit is PgQueuer's "resume", and the clock starts there, as effectgate's does at its resume.
            conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
            async with conn:
                queries = Queries(PsycopgDriver(conn))
                async with conn.transaction():
                    for start in range(0, size, 1000):
                        n = min(1000, size - start)
                        await queries.enqueue(["noop"] * n, [b"x" * 2000] * n, [0] * n)
                    started = time.monotonic()
            return started

        asyncio.run(install())
        wait_until_up(base)
        pause(db_url, LIVE_KIND)
        for _ in range(workers):
            procs.append(
                subprocess.Popen([sys.executable, "-c", PGQUEUER_CONSUMER, db_url], cwd=ROOT, text=True)
            )
        for _ in range(300):
            if count(db_url, LISTENING) >= workers:
                break
            time.sleep(0.1)
        live = LiveLoad(wrk, base, tmp, live_connections, live_pool_size)
        time.sleep(1)
        poll = Poll(db_url, "SELECT count(*) FROM pgqueuer")
        drain = time_drain(
            size,
            poll,
            timeout,
            Progress(f"PgQueuer {size}", size),
            lambda: asyncio.run(fill()),
        )
        poll.conn.close()
        live_result = live.stop()
        return dataclasses.replace(drain, live=live_result, live_ledger=live_outcomes(db_url))
    finally:
        if live is not None and not live.stopping.is_set():
            live.stop()
        for proc in [*procs, gateway]:
            proc.terminate()
        for proc in [*procs, gateway]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        drop_database(server, db_url)


def pooled(drains: list[Drain]) -> Drain:
    """Several drains of one size as one: their jobs over their seconds (quarters and live load: the last's)."""
    last = drains[-1]
    return dataclasses.replace(
        last,
        jobs=sum(d.jobs for d in drains),
        seconds=sum(d.seconds for d in drains),
        left=sum(d.left for d in drains),
    )


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b and a == a and b == b else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000, help="the reference backlog (10^3)")
    parser.add_argument(
        "--small-runs", type=int, default=5, help="drains of the reference backlog, pooled into its rate"
    )
    parser.add_argument("--backlog", type=int, default=100_000, help="the backlog of the day after")
    parser.add_argument(
        "--delivered",
        type=int,
        default=100_000,
        help="of it, how many through the gateway (rest claimed directly)",
    )
    parser.add_argument("--workers", type=int, default=1, help="effectgate worker / PgQueuer processes")
    parser.add_argument(
        "--live-connections", type=int, default=16, help="wrk connections of live ingress load"
    )
    parser.add_argument("--live-pool", type=int, default=LIVE_POOL, help="distinct live deliveries per drain")
    parser.add_argument("--drain-timeout", type=float, default=1800, help="give up on one drain after this")
    parser.add_argument(
        "--no-pgqueuer",
        action="store_true",
        help="skip PgQueuer's drain (its rate at 10^6 is bounded by --drain-timeout; "
        "tests.bench.worker_vs_pgqueuer times both queues alike)",
    )
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("backlog: no figures — wrk is not installed (apt-get install wrk)")
        return
    server = server_url()
    load_avg = os.getloadavg()
    print(
        f"== backlog day, one run; Postgres {server.split('@')[-1]}; {args.workers} worker process(es) at defaults; "
        f"live ingress {args.live_connections} connections; load average {load_avg[0]:.1f}",
        flush=True,
    )
    drains: dict[str, Drain | None] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for size, runs in ((args.small, max(1, args.small_runs)), (args.backlog, 1)):
            done: list[Drain] = []
            for run in range(runs):
                print(
                    f"effectgate, backlog {size}{f', run {run + 1} of {runs}' if runs > 1 else ''}:",
                    flush=True,
                )
                drain = effectgate_drain(
                    wrk,
                    server,
                    tmp,
                    size,
                    args.delivered,
                    args.workers,
                    args.live_connections,
                    args.drain_timeout,
                    args.live_pool,
                )
                done.append(drain)
                print(drain.line(f"  effectgate worker drain, backlog {size}"), flush=True)
            drains[f"effectgate_{size}"] = pooled(done)
            if runs > 1:
                rates = sorted(d.rate for d in done)
                print(
                    f"  backlog {size}, {runs} runs pooled: {pooled(done).rate:.0f} jobs/s "
                    f"(runs {rates[0]:.0f}-{rates[-1]:.0f} jobs/s)",
                    flush=True,
                )
        pgq = None
        if not args.no_pgqueuer:
            print(f"PgQueuer, backlog {args.backlog}:", flush=True)
            pgq = pgqueuer_drain(
                wrk,
                server,
                tmp,
                args.backlog,
                args.workers,
                args.live_connections,
                args.drain_timeout,
                args.live_pool,
            )
        drains["pgqueuer"] = pgq
        if args.no_pgqueuer:
            print("  PgQueuer: not run (--no-pgqueuer)")
        elif pgq is None:
            print("  PgQueuer: no figure — not installed (pip install -e '.[bench]')")
        else:
            print(pgq.line(f"  PgQueuer drain, its defaults, backlog {args.backlog}"), flush=True)
    small = drains[f"effectgate_{args.small}"]
    big = drains[f"effectgate_{args.backlog}"]
    assert small is not None and big is not None
    print(f"== ratios in this run (targets in brackets); load average now {os.getloadavg()[0]:.1f}")
    print(
        f"drain rate at {args.backlog} / at {args.small}: {ratio(big.rate, small.rate)} (>= 0.9x at 10^5, 0.8x at 10^6)"
    )
    print(f"effectgate / PgQueuer at {args.backlog}: {ratio(big.rate, pgq.rate) if pgq else 'n/a'} (>= 1.0x)")
    if big.live is not None:
        print(
            f"live ingress p99 while {args.backlog} drained: {big.live.p99_ms:.1f} ms, "
            f"{big.live.rate:.0f} req/s, errors {big.live.errors}"
        )


if __name__ == "__main__":
    main()
