"""Benchmark: genuine deliveries beside a flood of one replayed delivery, over HTTP to ``effectgate serve``.

    python -m tests.bench.flood_http [--seconds 10] [--connections 64] [--flood 500] [--gateway-workers 2]

Starts ``effectgate serve`` on a loopback port against a fresh database. Quiet: wrk replays distinct
Stripe-signed 2 KB deliveries (each a new key) on ``--connections``. Flood: the same, while a second wrk
replays ONE signed delivery on ``--flood`` connections. Prints both genuine runs' rate, p50, p99 and
non-2xx, the flood's own answers, and the ratio of the genuine p99s. wrk shares the cores with the gateway
and Postgres. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from .common import drop_database, fresh_database, server_url
from .ingress import LUA, ROOT, SECRET, _ms, effectgate_command, free_port, write_config, write_deliveries


def _wrk(
    wrk: str, base: str, script: Path, replay: Path, connections: int, seconds: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            base,
            "--",
            str(replay),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def _summary(out: str) -> str:
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = _ms(m.group(1) if (m := re.search(r"50%\s+(\S+)", out)) else None)
    p99 = _ms(m.group(1) if (m := re.search(r"99%\s+(\S+)", out)) else None)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return (
        f"{float(rate.group(1)) if rate else float('nan'):.0f} req/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"non-2xx {errors.group(1) if errors else 0}, socket errors {sum(int(g) for g in sock.groups()) if sock else 0}"
    )


def _p99(out: str) -> float:
    return _ms(m.group(1) if (m := re.search(r"99%\s+(\S+)", out)) else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--flood", type=int, default=500)
    parser.add_argument("--gateway-workers", type=int, default=2)
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("flood_http: no figure — wrk is not installed (apt-get install wrk)")
        return
    server = server_url()
    db_url = fresh_database(server)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            genuine_quiet, genuine_flood, flood_one = (Path(tmp) / n for n in ("q.tsv", "g.tsv", "f.tsv"))
            write_deliveries(genuine_quiet, 40000)
            write_deliveries(genuine_flood, 40000)
            write_deliveries(flood_one, 1)
            script = Path(tmp) / "replay.lua"
            script.write_text(LUA)
            port = free_port()
            env = {
                **os.environ,
                "DATABASE_URL": db_url,
                "BENCH_SECRET": SECRET,
                "PYTHONPATH": str(ROOT),
                "EFFECTGATE_LOG_LEVEL": "ERROR",
            }
            command = effectgate_command(write_config(Path(tmp)), port, args.gateway_workers)
            gateway = subprocess.Popen(command, cwd=ROOT, env=env)
            base = f"http://127.0.0.1:{port}"
            try:
                for _ in range(300):
                    try:
                        httpx.post(f"{base}/webhooks/bench", content=b"{}", timeout=1)
                        break
                    except httpx.TransportError:
                        time.sleep(0.1)
                quiet, _ = _wrk(
                    wrk, base, script, genuine_quiet, args.connections, args.seconds
                ).communicate()
                flood = _wrk(wrk, base, script, flood_one, args.flood, args.seconds + 2)
                time.sleep(1)
                loaded, _ = _wrk(
                    wrk, base, script, genuine_flood, args.connections, args.seconds
                ).communicate()
                flooded, _ = flood.communicate()
            finally:
                gateway.terminate()
                gateway.wait(timeout=30)
        print(f"genuine, quiet:            {_summary(quiet)}")
        print(f"genuine, beside the flood: {_summary(loaded)}")
        print(f"the flood ({args.flood} connections, one delivery): {_summary(flooded)}")
        print(f"genuine p99 flood / quiet: {_p99(loaded) / _p99(quiet):.2f}x")
    finally:
        drop_database(server, db_url)


if __name__ == "__main__":
    main()
