"""Benchmark: verified and claimed deliveries per second through a real gateway process.

    python -m tests.bench.ingress [--seconds 10] [--connections 64] [--requests 30000] [--gateway-workers 1]

Starts ``effectgate serve`` (uvloop + httptools) on a loopback port against a fresh database and
drives it with wrk (Debian's ``wrk`` package) replaying ``--requests`` distinct Stripe-signed 2 KB
deliveries, each a new effect; once the list wraps, the rest are duplicates, and the ledger's own
counts say how many of each. wrk shares the machine's cores with the gateway and Postgres, so the
figure is a floor. Prints figures; asserts nothing about speed.
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
    t = int(time.time())
    with path.open("w") as out:
        for n in range(count):
            body = json.dumps(
                {"id": f"evt_{n}", "type": "bench.event", "data": {"object": {"n": n, "pad": "x" * 1900}}}
            )
            mac = hmac.new(SECRET.encode(), f"{t}.{body}".encode(), hashlib.sha256).hexdigest()
            out.write(f"t={t},v1={mac}\t{body}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--requests", type=int, default=30000, help="distinct signed deliveries to replay")
    parser.add_argument("--gateway-workers", type=int, default=1, help="effectgate serve --workers")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        # A benchmark, not a test: say plainly that no figure was produced, and why.
        print("ingress: no figure — wrk is not installed (apt-get install wrk)")
        return
    server = server_url()
    db_url = fresh_database(server)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        config.write_text(
            '[handlers]\nmodules = ["tests.bench.ingress_handlers"]\n'
            "[gateway]\npool_max = 20\n"
            '[sources.bench]\nscheme = "stripe"\nsecrets = ["BENCH_SECRET"]\n'
        )
        deliveries = Path(tmp) / "deliveries.tsv"
        write_deliveries(deliveries, args.requests)
        script = Path(tmp) / "replay.lua"
        script.write_text(LUA)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "BENCH_SECRET": SECRET,
            "PYTHONPATH": str(ROOT),
            "EFFECTGATE_LOG_LEVEL": "WARNING",
        }
        gateway = subprocess.Popen(
            [
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
                str(args.gateway_workers),
            ],
            cwd=ROOT,
            env=env,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            result = subprocess.run(
                [
                    wrk,
                    "-t1",
                    f"-c{args.connections}",
                    f"-d{args.seconds}s",
                    "--latency",
                    "-s",
                    str(script),
                    base,
                    "--",
                    str(deliveries),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            with psycopg.connect(db_url) as conn:
                outcomes = dict(
                    conn.execute("SELECT outcome, count(*) FROM deliveries GROUP BY 1").fetchall()
                )
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
            drop_database(server, db_url)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)
    p50 = re.search(r"50%\s+(\S+)", result.stdout)
    p99 = re.search(r"99%\s+(\S+)", result.stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", result.stdout)
    print(
        f"ingress, {args.gateway_workers} gateway process(es), {args.connections} connections, {args.seconds} s: "
        f"{float(rate.group(1)) if rate else float('nan'):.0f} deliveries/s, "
        f"p50 {p50.group(1) if p50 else '?'}, p99 {p99.group(1) if p99 else '?'}, "
        f"non-2xx {errors.group(1) if errors else 0}, ledger outcomes {outcomes}"
    )


if __name__ == "__main__":
    main()
