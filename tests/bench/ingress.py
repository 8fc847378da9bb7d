"""Benchmark: verified and claimed deliveries per second through a real gateway process.

    python -m tests.bench.ingress [--seconds 10] [--connections 64] [--requests 30000] [--gateway-workers 1]

Starts ``effectgate serve`` (uvloop + httptools), or with ``--reference`` the hand-written gateway
(tests/bench/reference_gateway.py), on a loopback port against a fresh database and drives it with wrk
(Debian's ``wrk`` package) replaying ``--requests`` distinct Stripe-signed 2 KB deliveries, each with its
own signature and a new effect key; should the list wrap, the rest are duplicates, and the ledger's own
counts say how many of each. wrk shares the machine's cores with the gateway and Postgres, so the
figure is a floor. Prints figures; asserts nothing about speed. tests/bench/compare.py runs it beside
the other figures.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from .common import drop_database, fresh_database, server_url

SECRET = "whsec_bench"
ROOT = Path(__file__).resolve().parents[2]
LUA = """
local reqs = {}
local i = 0
init = function(args)
  for line in io.lines(args[1]) do
    local sig, body = line:match("^(%S+)\t(.*)$")
    reqs[#reqs + 1] = wrk.format("POST", "/webhooks/bench",
      {["Content-Type"] = "application/json", ["Stripe-Signature"] = sig}, body)
  end
end
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
"""


def write_deliveries(path: Path, count: int) -> None:
    """``count`` distinct Stripe-signed 2 KB deliveries, one signature each; each claims a new key."""
    t = int(time.time())
    run = uuid.uuid4().hex[:8]
    with path.open("w") as out:
        for n in range(count):
            body = json.dumps(
                {
                    "id": f"evt_{run}_{n}",
                    "type": "bench.event",
                    "data": {"object": {"n": n, "pad": "x" * 1900}},
                }
            )
            mac = hmac.new(SECRET.encode(), f"{t}.{body}".encode(), hashlib.sha256).hexdigest()
            out.write(f"t={t},v1={mac}\t{body}\n")


@dataclass(frozen=True)
class LoadResult:
    """What one wrk run against one gateway measured, and what the ledger holds afterwards."""

    rate: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int
    outcomes: dict[str, int]

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.rate:.0f} req/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, "
            f"non-2xx {self.non_2xx}, socket errors {self.socket_errors}, ledger {self.outcomes}"
        )


def _ms(text: str | None) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text or "")
    if match is None:
        return float("nan")
    return float(match.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[match.group(2)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def effectgate_command(config: Path, port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "effectgate.gateway.cli",
        "serve",
        "--config",
        str(config),
        "--no-migrate",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def reference_command(port: int, workers: int, app: str = "tests.bench.reference_gateway:app") -> list[str]:
    """uvicorn running a reference gateway: the project's (default) or ``tests.bench.lean_gateway:app``."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--no-access-log",
        "--log-level",
        "warning",
    ]


def write_config(directory: Path) -> Path:
    config = directory / "bench.toml"
    config.write_text(
        '[handlers]\nmodules = ["tests.bench.ingress_handlers"]\n'
        "[gateway]\npool_max = 20\n"
        '[sources.bench]\nscheme = "stripe"\nsecrets = ["BENCH_SECRET"]\n'
    )
    return config


def load(
    wrk: str,
    command: list[str],
    port: int,
    db_url: str,
    deliveries: Path,
    *,
    connections: int,
    seconds: int,
    warmup: Path | None = None,
    counts: Callable[[str], dict[str, int]] | None = None,
) -> LoadResult:
    """Start ``command`` (a gateway on ``port``), drive it with wrk replaying ``deliveries``, stop it.

    ``warmup``, other deliveries, is replayed for a second first: every worker process is up, every
    connection opened and every statement prepared before the clock starts (its rows are in the counts).
    ``counts`` reads what a gateway with its own tables wrote (the lean reference); by default the ledger's.
    """
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "BENCH_SECRET": SECRET,
        "PYTHONPATH": str(ROOT),
        "EFFECTGATE_LOG_LEVEL": "WARNING",
    }
    script = deliveries.with_suffix(".lua")
    script.write_text(LUA)
    gateway = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.post(f"{base}/webhooks/bench", content=b"{}", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        runs = [(warmup, 1)] if warmup is not None else []
        for replay, duration in [*runs, (deliveries, seconds)]:
            result = subprocess.run(
                [
                    wrk,
                    "-t1",
                    f"-c{connections}",
                    f"-d{duration}s",
                    "--latency",
                    "-s",
                    str(script),
                    base,
                    "--",
                    str(replay),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        if counts is not None:
            outcomes = counts(db_url)
        else:
            with psycopg.connect(db_url) as conn:
                outcomes = dict(
                    conn.execute("SELECT outcome, count(*) FROM deliveries GROUP BY 1").fetchall()
                )
                jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()
                outcomes["jobs"] = jobs[0] if jobs else 0
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", result.stdout)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", result.stdout)
    return LoadResult(
        rate=float(rate.group(1)) if rate else float("nan"),
        p50_ms=_ms(m.group(1) if (m := re.search(r"^\s+50%\s+(\S+)", result.stdout, re.M)) else None),
        p99_ms=_ms(m.group(1) if (m := re.search(r"^\s+99%\s+(\S+)", result.stdout, re.M)) else None),
        non_2xx=int(errors.group(1)) if errors else 0,
        socket_errors=sum(int(g) for g in sock.groups()) if sock else 0,
        outcomes=outcomes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--requests", type=int, default=60000, help="distinct signed deliveries to replay")
    parser.add_argument("--gateway-workers", type=int, default=1, help="effectgate serve --workers")
    parser.add_argument("--reference", action="store_true", help="drive the hand-written reference gateway")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        # A benchmark, not a test: say plainly that no figure was produced, and why.
        print("ingress: no figure — wrk is not installed (apt-get install wrk)")
        return
    server = server_url()
    db_url = fresh_database(server)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            deliveries = Path(tmp) / "deliveries.tsv"
            write_deliveries(deliveries, args.requests)
            warmup = Path(tmp) / "warmup.tsv"
            write_deliveries(warmup, 4000)
            port = free_port()
            if args.reference:
                what = f"reference gateway, {args.gateway_workers} workers"
                command = reference_command(port, args.gateway_workers)
            else:
                what = f"effectgate serve --workers {args.gateway_workers}"
                command = effectgate_command(write_config(Path(tmp)), port, args.gateway_workers)
            result = load(
                wrk,
                command,
                port,
                db_url,
                deliveries,
                connections=args.connections,
                seconds=args.seconds,
                warmup=warmup,
            )
    finally:
        drop_database(server, db_url)
    print(result.line(f"{what}, {args.connections} connections, {args.seconds} s"))


if __name__ == "__main__":
    main()
