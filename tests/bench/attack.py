"""Benchmark: genuine deliveries quiet and under each flood, against a real ``serve --workers 2``, in one run.

    python -m tests.bench.attack [--seconds 10] [--genuine-connections 16]

One gateway (the ingress benchmark's config: one Stripe source, one handler) on a loopback port, against a
fresh database. Genuine load is wrk sending distinct signed 2 KB deliveries (each a new key, signed before
the run: tests/bench/wrk.py). It runs ``--seconds`` quiet, then the same again under each flood, the flood
started a second before and stopped by itself a second after:

- ``json``: bad signatures on one ~250 KB JSON body, 8 connections;
- ``random``: bad signatures on ~250 KB of random bytes, 8 connections;
- ``tiny401``: bad signatures on ``{}``, 300 connections;
- ``replay``: one valid delivery replayed (a duplicate after the first), 500 connections;
- ``drip``: 100 connections dripping header lines and 100 dripping a chunked body's trailers, 100 bytes
  every 0.1 s each, each reopened when the gateway closes it; ``--drip-seconds`` lets it outlast the
  gateway's header and body timeouts, the genuine load then measured at its end.

The floods come from other loopback addresses than the genuine load (127.0.0.1): wrk's sockets are
bound by a tiny ``connect()`` shim loaded with ``LD_PRELOAD`` (compiled here with ``cc``; wrk cannot
bind a source address itself), each flood from an address of its own: ``--attacker-address`` (default
127.0.0.2) for the first, the next address for the next (127.0.0.3, …), the drip's sockets likewise.
So per-client defences (the penalty box, ``gateway.penalty_box``) are measured as they would work
against an attacker that shares nothing with the provider. ``--attacker-address
127.0.0.1`` is the worst case: the attacker shares the genuine sender's address. Without ``cc`` the
floods share 127.0.0.1 and the run says so. ``--penalty-box off`` runs the gateway with the box
disabled (the per-rejection cost of JSON and random floods is only measurable then: with it on, both
are held after their first failures); ``--replays 0`` runs it with replays never boxing (the replay flood
then reaches the claim path every time, as before the box counted replays).

The gateway's resident memory (all its processes) is printed before and after each scenario, and the
CPU the gateway and the flood client used during it: the flood client runs on the same cores.

Prints, per flood: genuine req/s and p99 and their ratios to quiet, genuine errors (non-2xx + socket), what
the flood got (answers/s, or for the drip how long the gateway held a connection and how many bytes it
took); then the JSON-flood / random-flood cost ratio (random answers/s over JSON answers/s: how many
times dearer a JSON rejection is). Loopback only, bounded, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import ingress
from . import wrk as load
from .backlog import ROOT, env, wait_until_up
from .common import drop_database, fresh_database, server_url
from .ingress_cost import tree

BODY_BYTES = 250_000
BAD_SIGNATURE = "v1=" + "0" * 64

# connect() that binds an IPv4 socket to $EFFECTGATE_BENCH_SOURCE first: wrk from another loopback address.
BIND_SHIM = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    const char *source = getenv("EFFECTGATE_BENCH_SOURCE");
    if (source && addr->sa_family == AF_INET) {
        struct sockaddr_in local = {0};
        local.sin_family = AF_INET;
        if (inet_pton(AF_INET, source, &local.sin_addr) == 1) bind(fd, (struct sockaddr *)&local, sizeof local);
    }
    return real(fd, addr, len);
}
"""


def bind_shim(directory: Path) -> Path | None:
    """The shim compiled into ``directory``, or None when there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = directory / "bind_source.c"
    source.write_text(BIND_SHIM)
    library = directory / "bind_source.so"
    done = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"],
        capture_output=True,
        text=True,
    )
    return library if done.returncode == 0 else None


def nth_address(address: str, n: int) -> str:
    """The ``n``-th flood's address: the attacker's plus ``n`` (127.0.0.2 -> 127.0.0.4 for n=2); 127.0.0.1
    (the shared worst case) stays 127.0.0.1 for every flood."""
    if address == "127.0.0.1":
        return address
    parts = address.split(".")
    return ".".join([*parts[:3], str(int(parts[3]) + n)])


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (those still alive)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (the gateway's processes), in MB."""
    total = 0
    for member in tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        total += int(match.group(1)) if match else 0
    return total / 1024


def box_refusals(base: str) -> dict[str, float]:
    """The gateway's penalty-box refusals so far, by how (held, closed, answered, …), from ``/metrics``."""
    try:
        page = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    counts: dict[str, float] = {}
    for line in page.splitlines():
        match = re.match(r'effectgate_penalty_box_refusals_total\{.*how="(\w+)".*\} (\S+)$', line)
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
    return counts


def json_body() -> bytes:
    """A ~250 KB Stripe-shaped event: many small objects, the shape a re-encoding diagnosis works hardest on."""
    items = []
    n = 0
    while True:
        items.append(
            {"id": f"li_{n}", "amount": n * 7, "currency": "eur", "description": f"item {n} é", "qty": 1}
        )
        n += 1
        if n % 100 == 0 and len(json.dumps(items)) > BODY_BYTES - 200:
            break
    return json.dumps(
        {"id": "evt_flood", "type": "invoice.paid", "data": {"object": {"lines": items}}}
    ).encode()


@dataclass
class DripStats:
    """What the slow-drip connections got from the gateway."""

    opened: int = 0
    closed_by_gateway: int = 0
    bytes_sent: int = 0
    longest_held: float = 0.0
    connect_errors: int = 0
    held: list[float] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.opened} connections opened, {self.closed_by_gateway} closed by the gateway, longest held "
            f"{self.longest_held:.1f} s, {self.bytes_sent / 1e6:.1f} MB taken, connect errors {self.connect_errors}"
        )


async def _drip_one(port: int, trailers: bool, deadline: float, stats: DripStats, source: str) -> None:
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            stats.connect_errors += 1
            await asyncio.sleep(0.5)
            continue
        stats.opened += 1
        opened = time.monotonic()
        head = b"POST /webhooks/bench HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if trailers:
            head += b"Transfer-Encoding: chunked\r\nStripe-Signature: t=1,v1=00\r\n\r\n2\r\n{}\r\n0\r\n"
        try:
            writer.write(head)
            while time.monotonic() < deadline and not reader.at_eof():
                line = b"X-Drip-%d: " % random.randrange(10**9) + b"a" * 80 + b"\r\n"
                writer.write(line)
                await writer.drain()
                stats.bytes_sent += len(line)
                await asyncio.sleep(0.1)
            if reader.at_eof():
                stats.closed_by_gateway += 1
        except OSError:
            stats.closed_by_gateway += 1
        finally:
            stats.longest_held = max(stats.longest_held, time.monotonic() - opened)
            writer.close()


async def drip(port: int, connections: int, seconds: float, stats: DripStats, source: str) -> None:
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(_drip_one(port, n % 2 == 1, deadline, stats, source) for n in range(connections)))


@dataclass(frozen=True)
class Flood:
    """How to start one flood for ``seconds``: wrk with a fixed request, or the drip."""

    name: str
    what: str
    connections: int
    body: bytes | None = None
    signature: str = ""


def run_flood(
    wrk: str,
    base: str,
    port: int,
    tmp: Path,
    flood: Flood,
    seconds: float,
    attacker: str,
    shim: Path | None,
) -> tuple[subprocess.Popen[str] | None, threading.Thread | None, DripStats | None]:
    if flood.body is None:
        stats = DripStats()
        source = attacker if shim is not None else "127.0.0.1"
        thread = threading.Thread(
            target=lambda: asyncio.run(drip(port, flood.connections, seconds, stats, source))
        )
        thread.start()
        return None, thread, stats
    body = tmp / f"{flood.name}.body"
    body.write_bytes(flood.body)
    script = load.script(tmp, "fixed.lua", load.FIXED_LUA)
    threads = 2 if flood.connections >= 100 else 1
    env = None
    if shim is not None:
        env = {**os.environ, "LD_PRELOAD": str(shim), "EFFECTGATE_BENCH_SOURCE": attacker}
    proc = load.start(
        wrk,
        base,
        script,
        [str(body), "/webhooks/bench", flood.signature],
        connections=flood.connections,
        seconds=seconds,
        threads=threads,
        env=env,
    )
    return proc, None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10, help="genuine load per scenario")
    parser.add_argument("--genuine-connections", type=int, default=16)
    parser.add_argument(
        "--drip-seconds",
        type=float,
        default=0,
        help="how long the drip runs (default: the genuine run + 2 s); genuine load is measured at its end",
    )
    parser.add_argument(
        "--attacker-address",
        default="127.0.0.2",
        help="loopback address the floods come from (127.0.0.1: the genuine sender's own, the worst case)",
    )
    parser.add_argument(
        "--penalty-box", choices=["on", "off"], default="on", help="the gateway's [gateway.penalty_box]"
    )
    parser.add_argument(
        "--replays",
        type=int,
        default=None,
        help="the gateway's [gateway.penalty_box] replays (default: its default; 0: replays never box)",
    )
    parser.add_argument(
        "--hold",
        type=int,
        default=None,
        help="the gateway's [gateway.penalty_box] hold (default: its default)",
    )
    parser.add_argument(
        "--mode",
        choices=["one_at_a_time", "held"],
        default=None,
        help="the gateway's [gateway.penalty_box] mode (default: its default)",
    )
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("attack: no figures — wrk is not installed (apt-get install wrk)")
        return
    seconds = args.seconds
    server = server_url()
    db_url = fresh_database(server)
    print(
        f"== under attack, one run; serve --workers 2; genuine load {args.genuine_connections} connections, "
        f"{seconds:.0f} s per scenario; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    valid = load.delivery_body("evt_replayed", 0)
    # Every bad signature carries a fresh timestamp: a stale one is refused before any HMAC or diagnosis,
    # which would make the floods cheaper than the attack they stand for.
    now = int(time.time())
    floods = [
        Flood(
            "json",
            "bad signatures, ~250 KB JSON bodies",
            8,
            json_body(),
            f"t={int(time.time())},{BAD_SIGNATURE}",
        ),
        Flood(
            "random",
            "bad signatures, ~250 KB random bytes",
            8,
            os.urandom(BODY_BYTES),
            f"t={now},{BAD_SIGNATURE}",
        ),
        Flood("tiny401", "bad signatures, tiny bodies (401s)", 300, b"{}", f"t={now},{BAD_SIGNATURE}"),
        Flood(
            "replay", "one valid delivery replayed", 500, valid.encode(), load.sign(valid, int(time.time()))
        ),
        Flood("drip", "slow-drip headers and trailers", 200),
    ]
    results: dict[str, load.WrkResult] = {}
    flood_results: dict[str, str] = {}
    flood_rates: dict[str, float] = {}
    # Penalty-box refusals during each scenario, by how (closed: a connection closed at once, past hold).
    refusals: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port = ingress.free_port()
        base = f"http://127.0.0.1:{port}"
        config = ingress.write_config(tmp)
        box = [] if args.penalty_box == "on" else ["enabled = false"]
        if args.replays is not None:
            box.append(f"replays = {args.replays}")
        if args.hold is not None:
            box.append(f"hold = {args.hold}")
        if args.mode is not None:
            box.append(f'mode = "{args.mode}"')
        if box:
            config.write_text(config.read_text() + "[gateway.penalty_box]\n" + "".join(f"{k}\n" for k in box))
        shim = bind_shim(tmp) if args.attacker_address != "127.0.0.1" else None
        attacker = args.attacker_address if shim is not None else "127.0.0.1"
        print(
            f"floods from {', '.join(nth_address(attacker, n) for n in range(len(floods)))} in turn, "
            "genuine from 127.0.0.1"
            + (
                ""
                if shim is not None or args.attacker_address == "127.0.0.1"
                else " (no cc: no shim, shared)"
            )
            + f"; penalty box {args.penalty_box}"
            + ("" if args.replays is None else f", replays = {args.replays}")
            + ("" if args.hold is None else f", hold = {args.hold}")
            + ("" if args.mode is None else f", mode = {args.mode}")
            + f"; {os.cpu_count()} cores, shared with the load generators",
            flush=True,
        )
        gateway = subprocess.Popen(ingress.effectgate_command(config, port, 2), cwd=ROOT, env=env(db_url))
        try:
            wait_until_up(base)
            script = load.script(tmp, "pool.lua", load.POOL_LUA)
            # Warm-up: both gateway processes up, their pools open, statements prepared.
            warm = load.write_pool(tmp / "warm.tsv", 2000)
            load.finish(
                load.start(wrk, base, script, [str(warm), "/webhooks/bench"], connections=16, seconds=1)
            )
            for number, flood in enumerate([None, *floods]):
                name = "quiet" if flood is None else flood.name
                # Signed now, so the timestamps are fresh whatever the run's length.
                pool = load.write_pool(tmp / "genuine.tsv", int(2000 * seconds))
                proc = thread = stats = None
                rss_before = rss_mb(gateway.pid)
                refused_before = box_refusals(base)
                if flood is not None:
                    # The drip can outlast the header and body timeouts (10 s and 30 s by default): then the
                    # genuine load is measured at its end, when the most connections and bytes are held.
                    length = max(seconds + 2, args.drip_seconds) if flood.body is None else seconds + 2
                    # Each flood from an address of its own: a box earned by one does not carry to the next.
                    source = nth_address(attacker, number - 1)
                    proc, thread, stats = run_flood(wrk, base, port, tmp, flood, length, source, shim)
                    time.sleep(length - seconds - 1)
                gateway_pids = tree(gateway.pid)
                flood_pids = [proc.pid] if proc is not None else [os.getpid()]
                cpu_before = cpu_seconds(gateway_pids), cpu_seconds(flood_pids)
                started = time.monotonic()
                genuine_proc = load.start(
                    wrk,
                    base,
                    script,
                    [str(pool), "/webhooks/bench"],
                    connections=args.genuine_connections,
                    seconds=seconds,
                )
                # Sampled while the genuine load runs (the flood outlasts it): cores used in that time.
                time.sleep(max(0.5, seconds - 0.5))
                elapsed = time.monotonic() - started
                cpu_used = [
                    (cpu_seconds(pids) - before) / elapsed
                    for pids, before in zip((gateway_pids, flood_pids), cpu_before, strict=True)
                ]
                genuine = load.finish(genuine_proc)
                results[name] = genuine
                if proc is not None:
                    got = load.finish(proc)
                    flood_rates[name] = got.rate
                    flood_results[name] = (
                        f"{got.rate:.0f} answers/s, p99 {got.p99_ms:.0f} ms, non-2xx {got.non_2xx}, "
                        f"socket errors {got.socket_errors}"
                    )
                if thread is not None and stats is not None:
                    thread.join()
                    flood_results[name] = stats.line()
                rss = f"gateway RSS {rss_before:.0f} -> {rss_mb(gateway.pid):.0f} MB"
                refused = box_refusals(base)
                refusals[name] = {k: v - refused_before.get(k, 0.0) for k, v in refused.items()}
                print(f"genuine, {name}: {genuine.line()}; {rss}", flush=True)
                client = "flood client" if proc is not None else "bench process (drip client)"
                cpu = f"gateway CPU {cpu_used[0]:.2f} cores"
                if flood is not None:
                    cpu += f", {client} {cpu_used[1]:.2f} cores"
                    print(
                        f"  flood {flood.what}, {flood.connections} connections: {flood_results[name]}; {cpu}",
                        flush=True,
                    )
                else:
                    print(f"  {cpu}", flush=True)
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
            drop_database(server, db_url)
    quiet = results["quiet"]
    print(
        f"== ratios in this run (targets: p99 <= 2x quiet, 0 errors); load average now {os.getloadavg()[0]:.1f}"
    )
    print(f"quiet: genuine {quiet.rate:.0f} req/s, p99 {quiet.p99_ms:.1f} ms, errors {quiet.errors}")
    for flood in floods:
        got = results[flood.name]
        print(
            f"{flood.name:8} genuine p99 {got.p99_ms:8.1f} ms = {got.p99_ms / quiet.p99_ms:5.2f}x quiet; "
            f"throughput {got.rate / quiet.rate:4.2f}x quiet; errors {got.errors}; box refusals "
            + (", ".join(f"{how} {n:.0f}" for how, n in sorted(refusals[flood.name].items()) if n) or "none")
        )
    if args.penalty_box == "on":
        # Both floods are boxed after their first failures: their answers/s say how fast the box
        # engaged, not what a rejection costs.
        print(
            "JSON / random bad-signature rejection cost: not measured with the penalty box on (--penalty-box off)"
        )
    elif flood_rates.get("json") and flood_rates.get("random"):
        print(
            f"JSON / random bad-signature rejection cost: {flood_rates['random'] / flood_rates['json']:.2f}x "
            f"(random {flood_rates['random']:.0f}/s, JSON {flood_rates['json']:.0f}/s; target <= 1.5x)"
        )


if __name__ == "__main__":
    main()
