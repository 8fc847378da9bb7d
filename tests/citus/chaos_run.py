"""Chaos on the cluster: duplicated deliveries, SIGKILLed workers and a Citus worker node stopped mid-run.

    CITUS_URL=... python -m tests.citus.chaos_run [--orders 120] [--tenants 24] [--kills 4]
        [--node-stop 127.0.0.1:9721 | --node-stop /tmp/citus-chaos/n9721] [--node-down 7] [--seconds 30]

A fresh schema is migrated and distributed. Real processes run on loopback: the fake payment provider
(``effectgate fake-providers``, which honours Idempotency-Key as Stripe does), one ``effectgate serve`` and two
``effectgate worker`` on the coordinator URL, with one effect kind (tests/citus/chaos_handlers.py) that
charges the provider under the step's idempotency key. The tenant is each Stripe Connect event's ``account``
(``tenant_from = "/account"``). Deliveries are signed with Stripe's own library, each sent ``--copies`` times,
spread over ``--seconds``; a 5xx or a dropped connection is retried by the sender, as a provider would, until
acknowledged (2xx). Meanwhile workers are SIGKILLed ``--kills`` times (each restarted) and one Citus worker
node is stopped with ``pg_ctl stop -m immediate`` for ``--node-down`` seconds, then started again (this needs
to run as root or as the nodes' owner).

Then it waits (at most ``--wait`` seconds) for every job to be terminal and counts: acknowledged orders with
no effect in the ledger (lost), orders charged more than once at the provider or a capture refused as a
double (double), succeeded effects the provider never charged (uncharged), jobs not terminal (stuck). Prints
a summary with the placement of effects and tenants per node, drops the schema, and exits 1 on any of them.
Not part of `make citus-check`: it stops a node of the cluster. `make citus-chaos` runs it.

``--add-node HOST:PORT`` (a running Citus node not yet in the cluster) adds a rebalance ``--rebalance-at``
seconds in: the node is added and the shards rebalanced onto it (moved by ``--transfer-mode``) from a thread of
its own, while deliveries, workers and kills go on over the whole move; ``--no-node-stop`` leaves the node stop
out. The answers given while shards moved are counted by status and error code, and the run fails if the
sending ended before the move did (the move's end then saw no traffic: raise ``--seconds``). The added node is
drained and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.citus.ledger import (
    TRANSFER_MODES,
    distributed_ledger,
    logical_wal,
    preferred_transfer_mode,
    rebalance_onto,
    remove_node,
)
from tests.e2e.conftest import SECRET, event, headers
from tests.e2e.processes import Process, free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
TERMINAL = ("succeeded", "failed", "cancelled", "parked", "resolved")
CONFIG = """\
[database]
schema = "{schema}"

[handlers]
modules = ["tests.citus.chaos_handlers"]

# A Connect platform: one tenant per connected account, taken from each event.
[sources.connect]
scheme = "stripe"
secrets = ["CHAOS_STRIPE_SECRET"]
tenant_from = "/account"
tenant_pattern = "acct_[a-z0-9]+"

# One sender sends every delivery twice or more from one address; the penalty box would box it.
[gateway.penalty_box]
replays = 0

[worker]
concurrency = 4
poll_interval = 0.3
backoff_base = 0.05
backoff_cap = 0.5

# A short tick so the lease rescuer takes a SIGKILLed worker's jobs back within seconds of their lease.
[maintenance]
tick = 1

[maintenance.lease_rescuer]
poison_threshold = 10

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"
timeout = 5
"""


@dataclass
class Sent:
    """What the sender was answered: every attempt's status, and the orders acknowledged with a 2xx."""

    answers: Counter[int] = field(default_factory=Counter)
    transport_errors: Counter[str] = field(default_factory=Counter)
    acknowledged: set[tuple[str, str]] = field(default_factory=set)
    unavailable: Counter[str] = field(default_factory=Counter)  # 5xx answers by tenant
    # Every answer: (monotonic time, status, error code or ""), to count those given while shards moved.
    timeline: list[tuple[float, int, str]] = field(default_factory=list)
    last: float = 0.0  # monotonic time of the last delivery's first send
    refused: list[str] = field(default_factory=list)
    gave_up: int = 0


async def send_all(url: str, orders: list[tuple[str, str]], copies: int, seconds: float, sent: Sent) -> None:
    """Each order's delivery ``copies`` times, in a shuffled order spread over ``seconds``, each retried on
    a 5xx or a transport error (as a provider retries, backing off from 0.5 s to 4 s) until a 2xx or a 4xx, for
    at most 120 s. A delivery holds one of the 16 connections for each request, not while it waits to retry:
    held across the waits, the retries of the stopped node's tenants took every connection, and the other
    tenants' deliveries (which their nodes would have accepted) were not sent until it was back."""
    posts = [(tenant, order) for tenant, order in orders for _ in range(copies)]
    random.shuffle(posts)
    gap = seconds / max(len(posts), 1)
    slots = asyncio.Semaphore(16)

    async def post(client: httpx.AsyncClient, tenant: str, order: str) -> None:
        body = event(order, f"evt_{order}", account=tenant)
        deadline = time.monotonic() + 120
        backoff = 0.5
        while time.monotonic() < deadline:
            try:
                async with slots:
                    r = await client.post(url, content=body, headers=headers(body))
            except httpx.TransportError as exc:
                sent.transport_errors[type(exc).__name__] += 1
            else:
                sent.answers[r.status_code] += 1
                code = ""
                if r.status_code >= 300:
                    try:
                        code = str(r.json().get("error", ""))
                    except ValueError:
                        code = "?"
                sent.timeline.append((time.monotonic(), r.status_code, code))
                if r.status_code < 300:
                    sent.acknowledged.add((tenant, f"charge:{order}"))
                    return
                if r.status_code < 500:
                    sent.refused.append(f"{r.status_code} {r.text[:120]}")
                    return
                sent.unavailable[tenant] += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 4.0)
        sent.gave_up += 1

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=16)) as client:
        tasks = []
        for tenant, order in posts:
            tasks.append(asyncio.create_task(post(client, tenant, order)))
            sent.last = time.monotonic()
            await asyncio.sleep(gap)
        await asyncio.gather(*tasks)


def node_data_dir(url: str, node: str | None) -> tuple[str, Path]:
    """The node to stop (``host:port``, a data directory, or by default the first worker node) and its data
    directory, which the node itself reports."""
    if node and not node[0].isdigit():
        return node, Path(node)
    with psycopg.connect(url, autocommit=True) as c:
        if node is None:
            [(host, port)] = c.execute(
                "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND noderole = 'primary'"
                " ORDER BY nodeport LIMIT 1"
            ).fetchall()
            node = f"{host}:{port}"
    host, port = node.rsplit(":", 1)
    with psycopg.connect(host=host, port=int(port), user="postgres", dbname="postgres") as c:
        [(data_dir,)] = c.execute("SHOW data_directory").fetchall()
    return node, Path(data_dir)


def pg_ctl(data_dir: Path, *args: str) -> None:
    owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(
        [*owner, str(PG_BIN / "pg_ctl"), "-D", str(data_dir), *args], check=True, capture_output=True
    )


def stop_node(data_dir: Path, down: float) -> float:
    """``pg_ctl stop -m immediate`` (no checkpoint, as a crash), ``down`` seconds, start; the seconds it was down."""
    stopped = time.monotonic()
    pg_ctl(data_dir, "-m", "immediate", "stop")
    time.sleep(down)
    pg_ctl(data_dir, "-l", f"{data_dir}.log", "-w", "start")
    return time.monotonic() - stopped


def jobs_by_state(url: str, schema: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        return dict(c.execute("SELECT state::text, count(*) FROM jobs GROUP BY 1 ORDER BY 1").fetchall())  # type: ignore[arg-type]


def expired_leases(url: str, schema: str) -> list[tuple[int, str]]:
    """Jobs still ``running`` on a lease that has run out (id, lease owner): a killed worker's, or one whose
    worker gave up recording its outcome while a node was down; the lease rescuer's to take back."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        rows = c.execute(
            "SELECT id, lease_owner FROM jobs WHERE state = 'running' AND lease_expires_at < now() ORDER BY id"
        ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]


def ledger(url: str, schema: str) -> dict[str, Any]:
    """The effects and their jobs' states, and where effects, shards and tenants landed per node."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        table = f'"{schema}".effects'
        effects = {
            (r[0], r[1]): r[2]
            for r in c.execute(
                "SELECT e.tenant, e.effect_key, j.state::text FROM effects e"
                " LEFT JOIN jobs j ON j.effect_id = e.id AND j.tenant = e.tenant"
            ).fetchall()
        }
        node_of = c.execute(
            "SELECT DISTINCT e.tenant, s.nodeport FROM effects e"
            " JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column(%s::regclass, e.tenant)",
            (table,),
        ).fetchall()
        placed = c.execute(
            "SELECT s.nodeport, count(*), count(DISTINCT e.tenant) FROM effects e"
            " JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column(%s::regclass, e.tenant)"
            " GROUP BY 1 ORDER BY 1",
            (table,),
        ).fetchall()
        shards = c.execute(
            "SELECT nodeport, count(*) FROM citus_shards WHERE table_name = %s::regclass GROUP BY 1 ORDER BY 1",
            (table,),
        ).fetchall()
    return {
        "effects": effects,
        "effects_per_node": {r[0]: r[1] for r in placed},
        "tenants_per_node": {r[0]: r[2] for r in placed},
        "node_of_tenant": dict(node_of),  # type: ignore[arg-type]
        "shards_per_node": dict(shards),  # type: ignore[arg-type]
    }


def rates_per_node(
    url: str, schema: str, node_of: dict[str, int], stopped: datetime, back: datetime
) -> dict[int, tuple[float, float, float, float]]:
    """Per worker node, its tenants' jobs claimed and leased (attempts opened) per second, in the as-long stretch
    just before the node stop and while the node was down: a lost node must stop only its own tenants (issue 41).
    The claims say whether the sender kept the node's tenants' deliveries coming, which the leases can follow."""
    down = back - stopped
    windows = (stopped - down, stopped, stopped, back)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        leased = c.execute(
            "SELECT tenant, count(*) FILTER (WHERE started_at >= %s AND started_at < %s),"
            " count(*) FILTER (WHERE started_at >= %s AND started_at < %s) FROM job_attempts GROUP BY tenant",
            windows,
        ).fetchall()
        claimed = c.execute(
            "SELECT tenant, count(*) FILTER (WHERE created_at >= %s AND created_at < %s),"
            " count(*) FILTER (WHERE created_at >= %s AND created_at < %s) FROM jobs GROUP BY tenant",
            windows,
        ).fetchall()
    per_node: dict[int, list[int]] = {}
    for offset, rows in ((0, claimed), (2, leased)):
        for tenant, before, during in rows:
            counts = per_node.setdefault(node_of.get(tenant, 0), [0, 0, 0, 0])
            counts[offset] += before
            counts[offset + 1] += during
    s = down.total_seconds()
    return {n: (cb / s, cd / s, lb / s, ld / s) for n, (cb, cd, lb, ld) in sorted(per_node.items())}


def log_events(paths: list[Path]) -> tuple[Counter[str], set[int]]:
    """The processes' JSON log lines at warning or error, counted by level and event name (a failed maintenance
    pass by each service that failed in it, and the error's class); and the jobs a
    worker gave up on (``worker.job_crashed``: its outcome not recorded, the job left to lease expiry)."""
    found, crashed = Counter[str](), set[int]()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("level") in ("warning", "error"):
                what = f"{entry['level']} {entry.get('event')}"
                failed = entry.get("service_errors") or {}
                if entry.get("event") == "reconciler.failed" and isinstance(failed, dict) and failed:
                    # Which service failed, and how (the error's class): a node stopped explains some, not all.
                    for service, error in sorted(failed.items()):
                        found[f"{what} ({service}: {str(error).splitlines()[0][:90]})"] += 1
                else:
                    found[what] += 1
                if entry.get("event") == "worker.job_crashed":
                    crashed.add(int(entry["job_id"]))
    return found, crashed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=120)
    parser.add_argument("--tenants", type=int, default=24)
    parser.add_argument("--copies", type=int, default=2, help="times each delivery is sent (>= 2)")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--node-stop", help="host:port or data directory of the Citus worker node to stop")
    parser.add_argument("--node-down", type=float, default=7.0, help="seconds the node stays stopped")
    parser.add_argument(
        "--no-node-stop", action="store_true", help="stop no node (with --add-node: a rebalance only)"
    )
    parser.add_argument(
        "--add-node",
        help="host:port of a running Citus node not yet in the cluster: added and rebalanced onto half-way in,"
        " drained and removed again at the end",
    )
    parser.add_argument(
        "--transfer-mode",
        choices=TRANSFER_MODES,
        help="how the rebalance moves shards (auto and force_logical need wal_level = logical on every node);"
        " default: auto where every node has it, else block_writes",
    )
    parser.add_argument(
        "--rebalance-at",
        type=float,
        default=None,
        help="seconds in to start the rebalance (default: a fifth)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds the deliveries are spread over")
    parser.add_argument("--wait", type=float, default=60.0, help="most seconds to wait for terminal jobs")
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="the effect kind's lease, in seconds")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    args = parser.parse_args()
    url = os.environ["CITUS_URL"]
    random.seed(args.seed)
    node, data_dir = node_data_dir(url, args.node_stop)
    if args.add_node:
        behind = logical_wal(url, args.add_node)
        if args.transfer_mode is None:
            args.transfer_mode = preferred_transfer_mode(url, args.add_node)
        elif args.transfer_mode != "block_writes" and behind:
            parser.error(
                f"--transfer-mode {args.transfer_mode} needs wal_level = logical on {', '.join(behind)}"
            )
    schema = f"effectgate_chaos_{uuid.uuid4().hex[:8]}"
    print(
        f"schema {schema}; seed {args.seed}; {args.orders} orders over {args.tenants} tenants, x{args.copies}"
    )
    asyncio.run(distributed_ledger(url, schema))
    orders = [(f"acct_t{n % args.tenants}", f"o{n}") for n in range(args.orders)]
    logs = Path(f"/tmp/{schema}")
    logs.mkdir()
    fake_port, gateway_port = free_port(), free_port()
    config = logs / "effectgate.toml"
    config.write_text(CONFIG.format(schema=schema, fake_port=fake_port))
    env = {
        "DATABASE_URL": url,
        "CHAOS_STRIPE_SECRET": SECRET,
        "EFFECTGATE_LOG_LEVEL": "INFO",
        "CHAOS_LEASE_TTL": str(args.lease_ttl),
        "CHAOS_PAUSE": "0.2",
    }
    processes: list[Process] = []
    added = False  # read in the finally below, which a failed start reaches before the schedule
    started = time.monotonic()
    try:
        fake = Process(["fake-providers", "--port", str(fake_port)], env, logs / "fake.log")
        gateway = Process(
            ["serve", "--config", str(config), "--no-migrate", "--port", str(gateway_port)],
            env,
            logs / "gateway.log",
        )
        processes += [fake, gateway]
        fake.wait_http(f"http://127.0.0.1:{fake_port}/_fake/stats")
        gateway.wait_http(f"http://127.0.0.1:{gateway_port}/readyz")

        def worker(name: str) -> Process:
            proc = Process(["worker", "--config", str(config), "--no-migrate"], env, logs / f"{name}.log")
            processes.append(proc)
            proc.wait_log("worker.started")
            return proc

        workers = [worker(f"w{i}") for i in range(2)]
        sent = Sent()
        sender = threading.Thread(
            target=lambda: asyncio.run(
                send_all(
                    f"http://127.0.0.1:{gateway_port}/webhooks/connect",
                    orders,
                    args.copies,
                    args.seconds,
                    sent,
                )
            ),
            daemon=True,  # a failed run must not wait on posts still retrying
        )
        t0 = time.monotonic()
        sender.start()
        # The schedule: kills spread over the sending, the node stopped once a third of the way in.
        events = [(args.seconds * (k + 1) / (args.kills + 1), f"kill {k}") for k in range(args.kills)]
        if not args.no_node_stop:
            events.append((args.seconds / 3, "node"))
        if args.add_node:
            at = args.seconds / 5 if args.rebalance_at is None else args.rebalance_at
            events.append((at, "rebalance"))
        killed = set[int]()
        # The rebalance runs in a thread of its own: the kills, the node stop and the sending go on while shards
        # move (called from this loop, it held the kills back until the move ended).
        moving: list[float] = []  # the move's start and end, monotonic
        moved: list[Any] = []  # (seconds, placement) or the exception

        def rebalance() -> None:
            moving.append(time.monotonic())
            try:
                moved.append(rebalance_onto(url, schema, args.add_node, mode=args.transfer_mode))
            except Exception as exc:
                moved.append(exc)
            moving.append(time.monotonic())
            print(f"  {moving[-1] - t0:5.1f} s rebalance ended: {moved[-1]}", flush=True)

        mover = threading.Thread(target=rebalance, daemon=True)
        # The node stop too (down, then a start that waits out crash recovery, which took 52 s in a run whose
        # move had written 390 MB of WAL): in this loop it held the kills back until the node was up.
        down: list[datetime] = []  # stopped, back
        was_down: list[float] = []

        def stop() -> None:
            down.append(datetime.now(UTC))
            was_down.append(stop_node(data_dir, args.node_down))
            down.append(datetime.now(UTC))
            print(f"  {time.monotonic() - t0:5.1f} s node {node} was down {was_down[0]:.1f} s", flush=True)

        stopper = threading.Thread(target=stop, daemon=True)
        for at, what in sorted(events):
            time.sleep(max(0.0, at - (time.monotonic() - t0)))
            if what == "rebalance":
                print(
                    f"  {time.monotonic() - t0:5.1f} s adding {args.add_node}, rebalancing ({args.transfer_mode})"
                )
                mover.start()
                added = True
                continue
            if what == "node":
                print(f"  {time.monotonic() - t0:5.1f} s stopping node {node}")
                stopper.start()
                continue
            victim = workers.pop(random.randrange(len(workers)))
            victim.popen.kill()
            victim.popen.wait()
            killed.add(victim.popen.pid)
            workers.append(worker(f"w-after-{what.replace(' ', '-')}"))
            print(
                f"  {time.monotonic() - t0:5.1f} s {what}: SIGKILLed worker {victim.popen.pid}, started another"
            )
        if args.add_node:
            mover.join()
        if not args.no_node_stop:
            stopper.join()
        node_was_down = was_down[0] if was_down else 0.0
        node_stopped, node_back = (down[0], down[1]) if len(down) == 2 else (None, None)
        sender.join()
        sent_took = time.monotonic() - t0
        deadline = time.monotonic() + args.wait
        while True:
            states = jobs_by_state(url, schema)
            if set(states) <= set(TERMINAL) or time.monotonic() > deadline:
                break
            time.sleep(1)
        waited = time.monotonic() - t0 - sent_took
        stats: dict[str, Any] = httpx.get(f"http://127.0.0.1:{fake_port}/_fake/stats", timeout=5).json()
        found = ledger(url, schema)
        expired = expired_leases(url, schema)
        rates = (
            rates_per_node(url, schema, found["node_of_tenant"], node_stopped, node_back)
            if node_stopped and node_back
            else {}
        )
        exits = [p.popen.poll() for p in workers]
    finally:
        for proc in reversed(processes):
            proc.stop()
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]
        if args.add_node and added:
            print(f"draining {args.add_node} and removing it from the cluster (as it was before the run)")
            remove_node(url, args.add_node, mode=args.transfer_mode)

    effects: dict[tuple[str, str], str | None] = found["effects"]
    charged: dict[str, int] = stats["captures_by_intent"]
    lost = sent.acknowledged - set(effects)
    double = sorted(i for i, n in charged.items() if n > 1)
    double_n = len(double) + stats["double_capture_attempts"]
    uncharged = [k for k, s in effects.items() if s == "succeeded" and charged.get(f"pi_{k[1][7:]}", 0) == 0]
    stuck = {s: n for s, n in states.items() if s not in TERMINAL}
    print(f"sent in {sent_took:.1f} s, then {waited:.1f} s until every job was terminal or the wait ran out")
    print(f"effects shards per worker node: {found['shards_per_node']}")
    print(f"tenants per worker node: {found['tenants_per_node']}")
    print(
        f"jobs by state: {states} ({len(expired)} running on an expired lease); provider captures {stats['captures']}, requests {stats['requests']}"
    )
    print(
        f"transport errors: {dict(sent.transport_errors)}; refused: {len(sent.refused)}; gave up: {sent.gave_up}"
    )
    for r in sent.refused[:3]:
        print(f"  {r}")
    logged, crashed = log_events([p.log_path for p in processes])
    if expired:
        given_up = [i for i, _ in expired if i in crashed]
        of_killed = [i for i, owner in expired if i not in crashed and int(owner.split(":")[1]) in killed]
        print(
            f"jobs running on an expired lease: {[i for i, _ in expired]}; given up by their worker"
            f" (worker.job_crashed) {given_up}; else leased by a SIGKILLed worker {of_killed}"
        )
    node_of = found["node_of_tenant"]
    unavailable = Counter[int]()
    for tenant, n in sent.unavailable.items():
        unavailable[node_of.get(tenant, 0)] += n
    print(f"5xx answers by the node of the delivery's tenant: {dict(sorted(unavailable.items()))}")
    for port, (claimed_before, claimed_during, before, during) in rates.items():
        ratio = f"{during / before:.2f}x" if before else "n/a"
        print(
            f"node {port}'s tenants, per second, in the {node_was_down:.1f} s before the stop / while {node} was"
            f" down: leased {before:.2f} / {during:.2f} ({ratio}), claimed {claimed_before:.2f} / {claimed_during:.2f}"
        )
        # The claims are the sender's offer, not the ledger's pace: with each delivery sent `copies` times in a
        # shuffled order, fewer of the later posts are an order's first copy, so fewer claims are new there
        # whether a node is down or not (2 copies: about 0.6x as many new claims in the middle third as in the
        # first). The measure that does not move with the offer is how much of what was claimed was leased.
        if claimed_before and claimed_during:
            kept = (during / claimed_during) / (before / claimed_before)
            print(
                f"node {port}'s tenants, leased per job claimed, before the stop / while {node} was down:"
                f" {before / claimed_before:.2f} / {during / claimed_during:.2f} ({kept:.2f}x)"
            )
    moved_ok = True
    if args.add_node and len(moving) == 2:
        start, end = moving
        while_moving = [(status, code) for at, status, code in sent.timeline if start <= at <= end]
        refused = Counter(f"{status} {code}" for status, code in while_moving if status >= 300)
        covered = sent.last >= end
        moved_ok = covered and not isinstance(moved[0], Exception)
        print(
            f"rebalance ({args.transfer_mode}) {end - start:.1f} s: {len(while_moving)} answers while shards moved,"
            f" non-2xx {dict(sorted(refused.items()))}; the sending went on "
            + (
                "past the move's end"
                if covered
                else f"only {sent.last - start:.1f} s into it (raise --seconds)"
            )
        )
    print(f"live workers' exit codes (None: running): {exits}; log lines at warning or error:")
    for what, n in sorted(logged.items()):
        print(f"  {n:5d} {what}")
    print(
        f"effects per worker node: {found['effects_per_node']}; lost {len(lost)}, double {double_n}, "
        f"stuck {sum(stuck.values())}, uncharged {len(uncharged)}; answers {dict(sorted(sent.answers.items()))}"
        f" (acknowledged {len(sent.acknowledged)} of {len(orders)} orders; {time.monotonic() - started:.0f} s)"
    )
    ok = not lost and not double_n and not stuck and not uncharged and not sent.refused and not sent.gave_up
    ok = ok and len(sent.acknowledged) == len(orders) and (node_was_down > 0 or args.no_node_stop)
    ok = ok and (added or not args.add_node) and moved_ok
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
